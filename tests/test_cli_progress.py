"""The run's progress display: shown on a terminal once the run lasts, never with -q or on a pipe."""

from __future__ import annotations

import io
import time

from triosim.cli.progress import RunProgress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(progress: RunProgress, wait_s: float) -> None:
    with progress:
        progress.phase("building the task graph")
        time.sleep(wait_s)
        progress.phase("scheduling", total=1000)
        progress.scheduled(500)
        time.sleep(0.05)


def test_shown_on_a_terminal_once_the_run_lasts():
    out = _Tty()
    p = RunProgress(quiet=False, stream=out, show_after_s=0.01)
    _run(p, 0.2)
    assert p.shown and out.getvalue()


def test_silent_before_the_delay():
    out = _Tty()
    p = RunProgress(quiet=False, stream=out, show_after_s=5.0)
    _run(p, 0.0)
    assert not p.shown and out.getvalue() == ""


def test_silent_with_quiet_and_on_a_pipe():
    for quiet, stream in ((True, _Tty()), (False, io.StringIO())):
        p = RunProgress(quiet=quiet, stream=stream, show_after_s=0.0)
        _run(p, 0.1)
        assert not p.enabled and not p.shown and stream.getvalue() == ""
