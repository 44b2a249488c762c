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
    check_path_length(value, "-trace-dir")
    path = Path(value)
    check_not_a_folder_of_traces(path)
    return path


NAME_MAX = 255  # bytes in one path component (Linux, macOS, Windows)
PATH_MAX = 4096  # bytes in a whole path (Linux)


def check_path_length(value: str | os.PathLike, flag: str) -> None:
    """A path no file system can hold is a one-line error, not ``OSError: File name too long``
    from whichever ``stat`` meets it first."""
    raw = os.fsencode(value)
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > NAME_MAX:
        raise ConfigError(f"{flag}: a name of {longest:,} bytes in the path, above the limit of {NAME_MAX} "
                          "bytes per file or directory name")
    if len(raw) > PATH_MAX:
        raise ConfigError(f"{flag}: a path of {len(raw):,} bytes, above the limit of {PATH_MAX:,} bytes")


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
