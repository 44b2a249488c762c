"""Progress of one run on stderr: which phase it is in (load, build, schedule, report) and, while
scheduling, how many tasks are placed.

Shown only where a person watches and only for runs long enough to wonder about: never with
``-q``, never when stderr is not a terminal (a log or a pipe gets nothing), and only once the
run has lasted :data:`SHOW_AFTER_S` (a timer starts the display, so a run under that prints
nothing and a long build shows its phase while it is still building).
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

SHOW_AFTER_S = 2.0  # runs shorter than this print nothing
PHASES = ("loading the trace", "building the task graph", "scheduling", "writing the report")


class RunProgress:
    """A rich progress display of a run's phases; a no-op when not shown (see the module docstring).

    Use as a context manager; :meth:`phase` names the phase now running, :meth:`tasks` sets the
    number of tasks to schedule, and :meth:`scheduled` (a scheduler callback) the number placed.
    """

    def __init__(self, quiet: bool, stream: TextIO | None = None, show_after_s: float = SHOW_AFTER_S) -> None:
        stream = sys.stderr if stream is None else stream
        self.enabled = not quiet and bool(getattr(stream, "isatty", lambda: False)())
        self._stream = stream
        self._show_after_s = show_after_s
        self._lock = threading.Lock()
        self._progress = None
        self._task = None
        self._timer: threading.Timer | None = None
        self._phase = PHASES[0]
        self._total: int | None = None
        self._done = 0
        self.shown = False

    def __enter__(self) -> RunProgress:
        if self.enabled:
            self._timer = threading.Timer(self._show_after_s, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            if self._progress is not None:
                self._progress.stop()
                self._progress = None

    def _show(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with self._lock:
            if self._progress is not None or not self.enabled:
                return
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                      TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                                      console=Console(file=self._stream), transient=True)
            self._task = self._progress.add_task(self._phase, total=self._total, completed=self._done,
                                                 count=self._count())
            self._progress.start()
            self.shown = True

    def _count(self) -> str:
        if self._phase != "scheduling" or not self._total:
            return ""
        return f"{self._done:,}/{self._total:,} tasks"

    def _update(self) -> None:
        with self._lock:
            if self._progress is not None:
                self._progress.update(self._task, description=self._phase, total=self._total,
                                      completed=self._done, count=self._count())

    def phase(self, name: str, total: int | None = None) -> None:
        """The run entered phase ``name`` (one of :data:`PHASES`), of ``total`` steps if known."""
        self._phase, self._total, self._done = name, total, 0
        self._update()

    def scheduled(self, done: int) -> None:
        """The scheduler has placed ``done`` tasks."""
        self._done = done
        self._update()
