"""A sweep killed in the middle never damages an earlier results file.

The rows of a running sweep go to ``NAME.partial``; the target is replaced (atomically) only by
a complete sweep. SIGKILL leaves the old file byte for byte; SIGTERM is handled like Ctrl-C
(exit 130, the finished rows kept in the partial file).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

OLD = "case,gpus,makespan_ms\n0,1,1.0\n"


def _start_sweep(tmp_path: Path, outs: list[Path]) -> subprocess.Popen:
    trace = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=3, batch_size=4, seed=3))
    bandwidths = ",".join(str(b) for b in range(1, 2001))  # far more than can finish before the kill
    cmd = [sys.executable, "-m", "triosim.cli", "sweep", "-trace-dir", str(trace), "-case", "1", "-GPUnumber", "4",
           "-bandwidth", bandwidths, "-j", "1", "-q"]
    for o in outs:
        cmd += ["--out", str(o)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_rows(path: Path, proc: subprocess.Popen, rows: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended early: {proc.communicate()}")
        if path.exists() and path.read_text().count("\n") > rows:
            return
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"{path} never reached {rows} rows")


def test_sigkill_leaves_the_old_csv_intact(tmp_path: Path) -> None:
    out = tmp_path / "x.csv"
    out.write_text(OLD)
    proc = _start_sweep(tmp_path, [out])
    partial = tmp_path / "x.csv.partial"
    _wait_for_rows(partial, proc, rows=3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert out.read_text() == OLD  # the earlier results, byte for byte
    rows = list(csv.DictReader(partial.open()))
    assert len(rows) >= 3 and all(r["status"] == "ok" and float(r["makespan_ms"]) > 0 for r in rows)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_sigterm_is_handled_like_ctrl_c(tmp_path: Path) -> None:
    out, js = tmp_path / "x.csv", tmp_path / "x.json"
    out.write_text(OLD)
    proc = _start_sweep(tmp_path, [out, js])
    _wait_for_rows(tmp_path / "x.csv.partial", proc, rows=3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "sweep interrupted" in err and "x.csv.partial" in err and "Traceback" not in err
    assert out.read_text() == OLD and not js.exists()
    rows = list(csv.DictReader((tmp_path / "x.csv.partial").open()))
    doc = json.loads((tmp_path / "x.json.partial").read_text())
    assert doc["complete"] is False and len(doc["rows"]) == len(rows) >= 3
    # rewritten in grid order: bandwidth 1, 2, 3, ...
    assert [float(r["bandwidth"]) for r in rows] == [float(i) for i in range(1, len(rows) + 1)]


def test_a_complete_sweep_replaces_the_target_and_removes_the_partial(tmp_path: Path) -> None:
    from triosim.cli.console import main

    trace = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=3, batch_size=4, seed=3))
    out = tmp_path / "x.csv"
    out.write_text(OLD)
    (tmp_path / "x.csv.partial").write_text("left by a killed sweep\n")
    assert main(["sweep", "-trace-dir", str(trace), "-bandwidth", "1,2", "-j", "1", "-q", "--out", str(out)]) == 0
    assert [r["bandwidth"] for r in csv.DictReader(out.open())] == ["1.0", "2.0"]
    assert not (tmp_path / "x.csv.partial").exists()


# ----------------------------------------------------------------------------- --resume


def _sweep_cmd(trace: Path, n: int, *extra: str) -> list[str]:
    bandwidths = ",".join(str(b) for b in range(1, n + 1))
    return [sys.executable, "-m", "triosim.cli", "sweep", "-trace-dir", str(trace), "-case", "1", "-GPUnumber", "4",
            "-bandwidth", bandwidths, "-j", "1", "-q", *extra]


def test_sigint_then_resume_gives_the_uninterrupted_csv_byte_for_byte(tmp_path: Path, capsys) -> None:
    from triosim.cli.console import main

    trace = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=3, batch_size=4, seed=3))
    n = 300  # about 3 s in one process: the interrupt comes after a few rows, long before the end
    full = tmp_path / "full.csv"
    # The uninterrupted sweep and the resumed one run in this process (two interpreter starts
    # fewer); only the interrupted one needs a process of its own to receive the SIGINT.
    assert main(_sweep_cmd(trace, n, "--out", str(full))[3:]) == 0
    out, partial = tmp_path / "x.csv", tmp_path / "x.csv.partial"
    proc = subprocess.Popen(_sweep_cmd(trace, n, "--out", str(out)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_rows(partial, proc, rows=4)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    kept = len(list(csv.DictReader(partial.open())))
    assert 4 <= kept < n and not out.exists()
    capsys.readouterr()
    assert main(_sweep_cmd(trace, n, "--out", str(out), "--resume")[3:]) == 0
    assert f"resuming: {kept} finished configurations kept from {partial}" in capsys.readouterr().err
    assert out.read_bytes() == full.read_bytes()
    assert not partial.exists() and not list(tmp_path.glob("x.csv.partial.*"))


def test_resume_simulates_only_the_missing_rows(tmp_path: Path, monkeypatch) -> None:
    """The rows read back are not simulated again (a resumed row with a planted figure keeps it)."""
    from triosim.cli.console import main
    from triosim.sweep import execute

    trace = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=2, batch_size=4, seed=3))
    out = tmp_path / "x.csv"
    argv = ["sweep", "-trace-dir", str(trace), "-bandwidth", "1,2,3", "-j", "1", "-q", "--out", str(out)]
    assert main(argv) == 0
    lines = out.read_text().splitlines()
    column = lines[0].split(",").index("makespan_ms")
    cells = lines[1].split(",")
    planted = ",".join([*cells[:column], "123.0", *cells[column + 1:]])  # bandwidth 1's makespan_ms
    (tmp_path / "x.csv.partial").write_text("\n".join([lines[0], planted, lines[3][:10]]))  # row 3 cut short
    calls = []
    original = execute.run_task
    monkeypatch.setattr(execute, "run_task", lambda traces, task: calls.append(task.index) or original(traces, task))
    assert main([*argv, "--resume"]) == 0
    assert calls == [1, 2]  # bandwidth 2 missing, bandwidth 3's line cut short by a kill
    assert out.read_text().splitlines()[1].split(",")[column] == "123.0"


def test_an_old_partial_file_is_moved_aside_not_truncated(tmp_path: Path, capsys) -> None:
    from triosim.cli.console import main

    trace = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=2, batch_size=4, seed=3))
    out = tmp_path / "x.csv"
    (tmp_path / "x.csv.partial").write_text("rows of an interrupted sweep\n")
    (tmp_path / "x.csv.partial.1").write_text("an older one\n")
    assert main(["sweep", "-trace-dir", str(trace), "-bandwidth", "1,2", "-j", "1", "-q", "--out", str(out)]) == 0
    assert (tmp_path / "x.csv.partial.2").read_text() == "rows of an interrupted sweep\n"
    assert (tmp_path / "x.csv.partial.1").read_text() == "an older one\n"
    assert f"{tmp_path}/x.csv.partial (rows of an earlier, interrupted sweep) moved to " \
           f"{tmp_path}/x.csv.partial.2" in capsys.readouterr().err


def test_a_symlink_planted_as_the_partial_file_is_never_followed(tmp_path: Path) -> None:
    """Before: ``open(NAME.partial, "w")`` truncated the file the link pointed to."""
    from triosim.cli.console import main
    from triosim.sweep.results import ResultFiles

    trace = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=2, batch_size=4, seed=3))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "x.csv"
    (tmp_path / "x.csv.partial").symlink_to(victim)
    assert main(["sweep", "-trace-dir", str(trace), "-bandwidth", "1,2", "-j", "1", "-q", "--out", str(out)]) == 0
    assert victim.read_text() == "precious\n" and (tmp_path / "x.csv.partial.1").is_symlink()
    # planted between the partial file's creation and its opening for appends: refused, not followed
    files = ResultFiles([str(out)], ("bandwidth",), {})
    import triosim.sweep.results as results

    real = results.atomic_write_text

    def plant(path, text, **kw):
        real(path, text, **kw)
        Path(path).unlink()
        Path(path).symlink_to(victim)

    results.atomic_write_text = plant
    try:
        with pytest.raises(Exception, match="cannot write"):
            files.__enter__()
    finally:
        results.atomic_write_text = real
    assert victim.read_text() == "precious\n"


def test_resume_sets_aside_rows_of_other_configurations(tmp_path: Path) -> None:
    from triosim.cli.console import main

    trace = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=2, batch_size=4, seed=3))
    out = tmp_path / "x.csv"
    base = ["sweep", "-trace-dir", str(trace), "-j", "1", "-q", "--out", str(out)]
    assert main([*base, "-bandwidth", "1,2,3"]) == 0
    whole = out.read_text()
    (tmp_path / "x.csv.partial").write_text(whole)
    assert main([*base, "-bandwidth", "1,2", "--resume"]) == 0
    assert (tmp_path / "x.csv.partial.1").read_text() == whole  # bandwidth 3's row is kept, aside
    assert out.read_text().splitlines() == whole.splitlines()[:3]


def test_resume_without_a_partial_file_says_so(tmp_path: Path, capsys) -> None:
    """--resume with nothing interrupted runs every configuration and names the file it looked
    for (it said 'kept from ' with no file)."""
    from triosim.cli.console import main

    trace = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=2, batch_size=4, seed=3))
    out = tmp_path / "x.csv"
    assert main(["sweep", "-trace-dir", str(trace), "-j", "1", "-q", "--out", str(out), "-bandwidth", "1,2",
                 "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"triosim: note: resuming: no partial file ({out}.partial); every configuration runs" in err
    assert len(out.read_text().splitlines()) == 3
