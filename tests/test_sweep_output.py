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
