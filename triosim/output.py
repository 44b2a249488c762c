"""Writing result files atomically, so an interrupted run never leaves a half-written file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import ConfigError


def atomic_write_text(path: str | os.PathLike, text: str, protect: tuple[str | os.PathLike, ...] = ()) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and a rename.

    ``protect`` lists input files the output must never replace (the trace itself).
    """
    target = Path(path)
    for p in protect:
        try:
            if target.exists() and target.resolve() == Path(p).resolve():
                raise ConfigError(f"{target}: refusing to overwrite an input file with an output")
        except OSError:
            pass
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{target}: output directory {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        # mkstemp creates 0600; give the file the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
