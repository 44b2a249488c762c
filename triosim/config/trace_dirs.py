"""Where a run's trace comes from: ``-trace-dir``, or the sample trace shipped in the package."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError


def default_trace_dir() -> Path:
    """The embedded sample trace (shipped in the wheel as ``triosim.sample_trace``)."""
    from ..sample_trace import trace_dir

    return trace_dir()


def trace_dir_from_flag(value: str | os.PathLike | None) -> Path:
    """``-trace-dir``'s directory; not given means the embedded sample, but "" is a mistake."""
    if value is None:
        return default_trace_dir()
    if not str(value).strip():
        raise ConfigError("-trace-dir is empty; leave it out to use the embedded sample trace")
    path = Path(value)
    check_not_a_folder_of_traces(path)
    return path


def check_not_a_folder_of_traces(path: Path, shown: int = 6) -> None:
    """``-trace-dir traces`` where ``traces/`` holds trace folders rather than a trace: name
    them (else the loader could only say that ``traces/trace.csv`` is not there)."""
    try:
        if not path.is_dir() or (path / "trace.csv").exists():
            return
        inside = sorted(p.name for p in path.iterdir() if p.is_dir() and (p / "trace.csv").is_file())
    except OSError:  # unreadable: the loader reports it
        return
    if inside:
        more = f", … ({len(inside)} in all)" if len(inside) > shown else ""
        raise ConfigError(f"-trace-dir {path}: no trace.csv here, but it holds trace folders: "
                          f"{', '.join(inside[:shown])}{more}; give one of them, e.g. -trace-dir {path / inside[0]}")
