"""Progress of long work on stderr: which phase a run is in (load, build, schedule, report) and
its counts (tasks built, tasks scheduled); a plan's candidates estimated and DAG-timed.

Never with ``-q``. Where a person watches (stderr is a terminal) a rich display appears once
the run has lasted :data:`SHOW_AFTER_S` (a timer starts it, so a run under that prints nothing
and a long build shows its phase while it is still building). Where nobody watches (a log, a
pipe, a batch job) a plain line goes to stderr every :data:`LINE_EVERY_S` while the work lasts
(``triosim: building the task graph: 120,000 tasks so far, 10 s``), so a long build or search
does not look hung; work shorter than that prints nothing.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

SHOW_AFTER_S = 2.0  # runs shorter than this print nothing
LINE_EVERY_S = 5.0  # a plain progress line this often when stderr is not a terminal
PHASES = ("loading the trace", "building the task graph", "scheduling", "writing the report")


def is_terminal(stream: TextIO) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


class ProgressLines:
    """Plain progress lines for a stream that is not a terminal: at most one per ``every_s``,
    each naming the phase, its count (``done``/``total`` ``unit``, or ``done`` ``unit`` so far)
    and the time since the work started. ``clock`` is injectable for tests."""

    def __init__(self, stream: TextIO, every_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        every_s = LINE_EVERY_S if every_s is None else every_s
        self._stream = stream
        self._every_s = every_s
        self._clock = clock
        self._start = clock()
        self._last = self._start
        self.lines = 0

    def line(self, phase: str, done: int | None = None, total: int | None = None, unit: str = "") -> str:
        count = ""
        if done is not None:
            count = f": {done:,}/{total:,} {unit}" if total else f": {done:,} {unit} so far"
        return f"triosim: {phase}{count.rstrip()}, {self._clock() - self._start:.0f} s"

    def due(self) -> bool:
        return self._clock() - self._last >= self._every_s

    def maybe(self, phase: str, done: int | None = None, total: int | None = None, unit: str = "") -> None:
        """Write the line when the last one is ``every_s`` old (the first: once the work is)."""
        if self.due():
            self.write(self.line(phase, done, total, unit))

    def write(self, text: str) -> None:
        self._last = self._clock()
        self.lines += 1
        try:
            print(text, file=self._stream, flush=True)
        except (OSError, ValueError):  # a closed pipe or log: progress is not worth failing for
            pass


class RunProgress:
    """The progress of one run's phases; a no-op with ``quiet`` (see the module docstring).

    Use as a context manager; :meth:`phase` names the phase now running, and :meth:`scheduled`
    (a scheduler callback) the number of tasks placed. ``building``: a callable giving the tasks
    of the graph under construction (for the plain lines while building).
    """

    def __init__(self, quiet: bool, stream: TextIO | None = None, show_after_s: float = SHOW_AFTER_S,
                 line_every_s: float | None = None, building: Callable[[], int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        stream = sys.stderr if stream is None else stream
        line_every_s = LINE_EVERY_S if line_every_s is None else line_every_s
        self.terminal = not quiet and is_terminal(stream)
        self.plain = not quiet and not self.terminal
        self.enabled = self.terminal or self.plain
        self._stream = stream
        self._show_after_s = show_after_s
        self._line_every_s = line_every_s
        self._clock = clock
        self._building = building
        self._lock = threading.Lock()
        self._progress = None
        self._task = None
        self._timer: threading.Timer | None = None
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._lines: ProgressLines | None = None
        self._phase = PHASES[0]
        self._total: int | None = None
        self._done = 0
        self.shown = False

    def __enter__(self) -> RunProgress:
        if self.terminal:
            self._timer = threading.Timer(self._show_after_s, self._show)
            self._timer.daemon = True
            self._timer.start()
        elif self.plain:
            self._lines = ProgressLines(self._stream, self._line_every_s, self._clock)
            self._ticker = threading.Thread(target=self._tick, name="triosim-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self._progress is not None:
                self._progress.stop()
                self._progress = None

    def _tick(self) -> None:
        """The plain lines' thread: wakes a few times a line's interval and writes when due."""
        lines = self._lines
        while not self._stop.wait(max(0.01, min(1.0, self._line_every_s / 4))):
            if lines.due():
                lines.write(self.plain_line())
                self.shown = True

    def plain_line(self) -> str:
        """The plain line for the phase now running, with its count."""
        lines = self._lines or ProgressLines(self._stream, self._line_every_s, self._clock)
        phase, total, done = self._phase, self._total, self._done
        if phase == "scheduling" and total:
            return lines.line(phase, done, total, "tasks")
        if phase == "building the task graph" and self._building is not None:
            return lines.line(phase, self._building(), None, "tasks")
        return lines.line(phase)

    def _show(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with self._lock:
            if self._progress is not None or not self.terminal:
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
