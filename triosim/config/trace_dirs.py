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
    return Path(value)
