"""The run's progress: a display on a terminal once the run lasts, plain lines on a pipe, nothing with -q."""

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


def test_silent_with_quiet_and_on_a_pipe_before_a_line_is_due():
    for quiet, stream in ((True, _Tty()), (True, io.StringIO()), (False, io.StringIO())):
        p = RunProgress(quiet=quiet, stream=stream, show_after_s=0.0, line_every_s=60.0)
        _run(p, 0.1)
        assert not p.shown and stream.getvalue() == ""
        assert p.enabled == (not quiet)  # on a pipe: plain lines, once the work lasts


class _Clock:
    """A fake clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_on_a_pipe_name_the_phase_and_its_counts():
    """stderr not a terminal: a line every interval (fake clock) with the phase, the tasks built
    so far or scheduled out of the total, and the time; none with -q."""
    clock, out = _Clock(), io.StringIO()
    built = [0]
    p = RunProgress(quiet=False, stream=out, line_every_s=5.0, building=lambda: built[0], clock=clock)
    with p:
        p.phase("building the task graph")
        built[0] = 12_345
        clock.now += 5.0
        deadline = time.monotonic() + 5
        while "12,345" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        p.phase("scheduling", total=1000)
        p.scheduled(500)
        clock.now += 5.0
        while "500/1,000" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    lines = out.getvalue().splitlines()
    assert lines[0] == "triosim: building the task graph: 12,345 tasks so far, 5 s"
    assert lines[1] == "triosim: scheduling: 500/1,000 tasks, 10 s"
    assert len(lines) == 2  # the clock did not move again: no third line


def test_a_long_build_on_a_pipe_prints_while_it_builds(monkeypatch, capsys, tmp_path):
    """The whole run on a pipe (capsys: not a terminal), the interval shortened: the build
    reports its tasks on stderr while it lasts; -q prints nothing."""
    import triosim.cli.progress as progress
    import triosim.graph as graph_package
    from triosim.cli.console import main

    real = graph_package.build_graph

    def slow_build(*args, **kwargs):  # a build that lasts a few of the (shortened) intervals
        graph = real(*args, **kwargs)
        time.sleep(0.3)
        return graph

    monkeypatch.setattr(graph_package, "build_graph", slow_build)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.05, raising=False)
    assert main(["run", "-case", "2", "-GPUnumber", "4", "--topology", "switch"]) == 0
    err = capsys.readouterr().err
    assert "triosim: building the task graph: 216 tasks so far, " in err  # folded: GPU 0 and the collectives
    assert main(["run", "-case", "2", "-GPUnumber", "4", "--topology", "switch", "-q"]) == 0
    assert capsys.readouterr().err == ""
