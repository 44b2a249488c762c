"""Writing result files atomically, so an interrupted run never leaves a half-written file, and
never over an input of the run.

* :func:`atomic_write`: a temporary ``.NAME.PID.HEX.tmp`` beside the target, created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a symlink planted under that name is never followed), then
  renamed over the target.
* :func:`atomic_write_dir`: a whole directory (``trace repeat --out DIR``) written into a
  sibling temporary directory, then put in place: swapped with the old directory in one
  ``renameat2(RENAME_EXCHANGE)`` where Linux offers it, else the old directory renamed away
  first and the new one renamed into place; the old one is removed last. A kill at any moment
  leaves the old or the new directory whole, never a mix (``bench/sigkill_repeat.py``).
* :func:`refuse_overwriting_inputs`: an output naming an input file of the run (the same
  resolved path, or the same inode through a hard link) is an error before any work.
"""

from __future__ import annotations

import ctypes
import os
import re
import secrets
import shutil
import signal
import stat
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
        with _open_new(tmp, binary) as fh:
            write(fh)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        # /proc, a full disk, a directory created meanwhile: one line, not a traceback.
        raise ConfigError(f"{who}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _open_new(path: Path, binary: bool) -> IO[Any]:
    """A new file at ``path``: never an existing file, never through a symlink planted there."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666)
    try:
        return open(fd, "wb") if binary else open(fd, "w", encoding="utf-8", newline="")
    except BaseException:
        os.close(fd)
        raise


def open_append_no_follow(path: str | os.PathLike) -> IO[str]:
    """An existing file opened to append text, never through a symlink planted under its name
    (``O_NOFOLLOW``: ELOOP instead). Create it first with :func:`atomic_write`."""
    flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        return open(fd, "w", encoding="utf-8", newline="")
    except BaseException:
        os.close(fd)
        raise


def refuse_overwriting_inputs(outputs: Iterable[tuple[str, str | os.PathLike | None]],
                              inputs: Iterable[str | os.PathLike | None]) -> None:
    """Raise ConfigError when an output ``(flag, path)`` is one of the ``inputs`` files: the same
    resolved path, or the same file (device and inode) under another name. ``None`` and ``-``
    (stdout) are skipped."""
    given = [Path(i) for i in inputs if i is not None and str(i) not in ("", "-")]
    known = [(_resolved(p), _inode(p), p) for p in given]
    for flag, out in outputs:
        if out is None or str(out) in ("", "-"):
            continue
        o = Path(out)
        where, node = _resolved(o), _inode(o)
        for path, inode, original in known:
            if where == path or (node is not None and node == inode):
                raise ConfigError(f"{flag} {out}: refusing to overwrite an input file with an output "
                                  f"(this run reads {original})")


def _resolved(p: Path) -> Path:
    try:
        return p.resolve()
    except (OSError, RuntimeError):
        return p.absolute()


def _inode(p: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


# ----------------------------------------------------------------------------- directories

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False when the system
    or file system cannot, and nothing was changed."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not supported here
        return False
    raise OSError(err, os.strerror(err), str(b))


def _dir_pattern(name: str) -> re.Pattern[str]:
    return re.compile(r"^\." + re.escape(name) + r"\.(\d+)\.[0-9a-f]{8}\.(tmp|old)$")


def recover_dir(target: Path) -> None:
    """Tidy what a killed :func:`atomic_write_dir` of ``target`` left (its PID gone): when the
    target itself is missing (killed between the two renames of the fallback), the old directory
    renamed away (``.old``) is put back; every other leftover is removed."""
    parent = target.parent if str(target.parent) else Path(".")
    pattern = _dir_pattern(target.name)
    try:
        entries = sorted(os.scandir(parent), key=lambda e: e.name)
    except OSError:
        return
    dead = []
    for entry in entries:
        m = pattern.match(entry.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            dead.append((m.group(2), Path(entry.path)))
    for kind, path in dead:
        if kind == "old" and not os.path.lexists(target):
            os.rename(path, target)
    for _, path in dead:
        if os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)


def atomic_write_dir(path: str | os.PathLike, write: Callable[[Path], None], flag: str = "",
                     replaceable: Iterable[str] = ()) -> None:
    """Call ``write(directory)`` on a new sibling directory of ``path``, then put it in place of
    ``path`` as one step (see the module docstring). ``flag`` names the option in errors. An
    existing ``path`` is replaced only when it holds nothing but names in ``replaceable`` (the
    files an earlier run wrote there): a directory of other files is never deleted."""
    who = f"{flag} {path}" if flag else str(path)
    target = Path(os.path.abspath(path))
    if os.path.lexists(target) and (os.path.islink(target) or not target.is_dir()):
        raise ConfigError(f"{who}: exists and is not a directory")
    if target.is_dir():
        try:
            others = sorted(set(os.listdir(target)) - set(replaceable))
        except OSError as exc:
            raise ConfigError(f"{who}: cannot read the directory ({exc.strerror or exc})") from None
        if others:
            raise ConfigError(f"{who}: the directory holds other files ({others[0]}); give a new or empty "
                              "directory, the output replaces it whole")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{who}: cannot create the output directory ({exc.strerror or exc})") from None
    recover_dir(target)
    stem = f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}"
    tmp, old = parent / f"{stem}.tmp", parent / f"{stem}.old"
    try:
        try:
            os.mkdir(tmp)
        except OSError as exc:
            raise ConfigError(f"{who}: cannot create the output directory ({exc.strerror or exc})") from None
        write(tmp)
        if not os.path.lexists(target):
            os.rename(tmp, target)
        elif _exchange(tmp, target):  # tmp now holds the old directory
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.rename(target, old)  # a kill now leaves both whole; recover_dir puts the old one back
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(f"{who}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
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
