"""A function run in a forked child process while this one goes on: two cores read a trace.

Loading a large trace is two mostly independent jobs: reading ``tensor.csv`` (and making its
Tensor objects) and reading ``trace.csv``'s columns. On a POSIX machine the second runs in a
forked copy of this process and sends back what it found (numpy arrays and bytes, quick to
pickle). Where ``fork`` is missing, or the child dies, the caller runs the function itself.
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Callable
from typing import Any

_FAILED = object()


class ForkedCall:
    """``fn(*args)`` started in a forked child; :meth:`result` waits for its value (or, when the
    child could not run it, runs ``fn(*args)`` here, raising what it raises)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._fn, self._args = fn, args
        self._pid, self._read = None, None
        if not hasattr(os, "fork"):
            return
        read, write = os.pipe()
        try:
            pid = os.fork()
        except Exception:  # no process to spare (or fork refused, e.g. a warning made an error)
            os.close(read)
            os.close(write)
            return
        if pid == 0:  # the child: compute, send, and leave without any clean-up of the parent's state
            code = 0
            try:
                # The parent's handlers (a sweep's SIGTERM handler writes its partial results)
                # are not the child's: a signal ends it, and the parent runs the call itself.
                for sig in (signal.SIGINT, signal.SIGTERM):
                    try:
                        signal.signal(sig, signal.SIG_DFL)
                    except ValueError:  # forked from a thread that Python does not count as main
                        pass
                os.close(read)
                try:
                    payload = pickle.dumps((True, fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as exc:  # sent back, raised by result()
                    payload = pickle.dumps((False, exc), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write, "wb") as out:
                    out.write(payload)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write)
        self._pid, self._read = pid, read

    def result(self) -> Any:
        value = self._collect()
        if value is _FAILED:
            return self._fn(*self._args)
        ok, value = value
        if not ok:
            raise value
        return value

    def _collect(self) -> Any:
        if self._pid is None:
            return _FAILED
        try:
            with os.fdopen(self._read, "rb") as pipe:
                data = pipe.read()
        finally:
            os.waitpid(self._pid, 0)
            self._pid = None
        try:
            return pickle.loads(data)
        except Exception:  # the child died before sending all of it
            return _FAILED

    def cancel(self) -> None:
        """Stop the child (the caller no longer needs its result)."""
        if self._pid is not None:
            os.kill(self._pid, signal.SIGKILL)
            os.close(self._read)
            os.waitpid(self._pid, 0)
            self._pid = None
