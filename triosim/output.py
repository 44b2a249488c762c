"""Writing result files atomically, so an interrupted run never leaves a half-written file."""

from __future__ import annotations

import os
import re
import secrets
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from .errors import ConfigError


def check_output_path(path: str | os.PathLike, flag: str = "") -> Path:
    """Fail before any work if ``path`` cannot be an output file: a directory, a missing or
    unwritable directory. ``flag`` (e.g. ``--json``) prefixes the message."""
    target = Path(path)
    who = f"{flag} {target}" if flag else str(target)
    if str(path) == "":
        raise ConfigError(f"{flag or 'output'}: the file name is empty")
    if target.is_dir():
        raise ConfigError(f"{who}: is a directory; give a file name")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{who}: output directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{who}: cannot write into {parent} (permission denied)")
    return target


def _tmp_pattern(name: str) -> re.Pattern[str]:
    return re.compile(r"^\." + re.escape(name) + r"\.(\d+)\.[0-9a-f]{8}\.tmp$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but belongs to someone else
        return True
    return True


def remove_stale_temps(target: Path) -> list[Path]:
    """Delete ``.NAME.PID.HEX.tmp`` files of ``target`` left by a killed process (its PID gone).

    A temp file of a live process (another run writing the same file right now) is kept.
    """
    parent = target.parent if str(target.parent) else Path(".")
    pattern = _tmp_pattern(target.name)
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            try:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
            except OSError:
                pass
    return removed


def atomic_write(
    path: str | os.PathLike,
    write: Callable[[IO[Any]], None],
    binary: bool = False,
    protect: Iterable[str | os.PathLike] = (),
    flag: str = "",
) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it over ``path``.

    ``protect`` lists input files the output must never replace (the trace itself). The
    temporary file is opened with ``"x"`` so it gets the usual permissions (umask). ``flag``
    (e.g. ``--json``) names the option that gave the path in every error message.
    """
    target = Path(path)
    who = f"{flag} {target}" if flag else str(target)
    for p in protect:
        try:
            if target.exists() and target.resolve() == Path(p).resolve():
                raise ConfigError(f"{who}: refusing to overwrite an input file with an output")
        except OSError:
            pass
    check_output_path(target, flag)
    parent = target.parent if str(target.parent) else Path(".")
    remove_stale_temps(target)
    tmp = parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        if binary:
            with open(tmp, "xb") as fh:
                write(fh)
        else:
            with open(tmp, "x", encoding="utf-8", newline="") as fh:
                write(fh)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        # /proc, a full disk, a directory created meanwhile: one line, not a traceback.
        raise ConfigError(f"{who}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str, protect: Iterable[str | os.PathLike] = (),
                      flag: str = "") -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_write`)."""
    atomic_write(path, lambda fh: fh.write(text), protect=protect, flag=flag)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM (``kill``, a batch system's time limit) stops the work the way
    Ctrl-C does, so the same clean-up runs. Outside the main thread signals cannot be caught
    and the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
