"""Writing result files atomically, so an interrupted run never leaves a half-written file."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from .errors import ConfigError


def atomic_write(
    path: str | os.PathLike,
    write: Callable[[IO[Any]], None],
    binary: bool = False,
    protect: Iterable[str | os.PathLike] = (),
) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it over ``path``.

    ``protect`` lists input files the output must never replace (the trace itself). The
    temporary file is opened with ``"x"`` so it gets the usual permissions (umask).
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
    tmp = parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        if binary:
            with open(tmp, "xb") as fh:
                write(fh)
        else:
            with open(tmp, "x", encoding="utf-8", newline="") as fh:
                write(fh)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str, protect: Iterable[str | os.PathLike] = ()) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_write`)."""
    atomic_write(path, lambda fh: fh.write(text), protect=protect)
