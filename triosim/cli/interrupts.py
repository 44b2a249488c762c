"""Ctrl-C that stops the work but not the saving of what it finished.

A long command (``triosim plan``) stops at the first Ctrl-C and then writes what it finished
(its CSV). People press Ctrl-C twice; the second press used to land while the first one was
being wound down (the worker pool stopped, the CSV written) and raised a second
KeyboardInterrupt there, which lost every result. :class:`FirstInterruptOnly` raises on the
first SIGINT only; later ones, until the block ends, are counted and otherwise ignored, so the
wind-down and the writing finish. A block run outside the main thread (where Python cannot set
a signal handler), or where SIGINT is ignored, keeps the behaviour it had.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


class FirstInterruptOnly:
    """A ``with`` block in which only the first SIGINT raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.presses = 0
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> FirstInterruptOnly:
        # Ctrl-C ignored (a background job of a script, nohup) stays ignored.
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def hold(self) -> None:
        """From now on no SIGINT raises: the work is done and only its saving is left."""
        self.presses = max(self.presses, 1)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.presses += 1
        if self.presses == 1:
            raise KeyboardInterrupt


__all__ = ["FirstInterruptOnly"]
