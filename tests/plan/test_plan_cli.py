"""``triosim plan`` on the command line: the size limit checked before profiling, ``--config``,
``--show``, a double Ctrl-C that keeps what was finished, and progress lines on a pipe."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import triosim.plan as plan_package
from triosim.cli.console import main
from triosim.plan.candidates import Candidate, SearchSpace, enumerate_candidates

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "sample_trace" / "gpt-cpu-bs8"


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


MAX_PLAN_BLOCKS = 64_000_000  # triosim.plan.search_size's, as docs/plan.md states it


def test_pipeline_blocks_count_micro_batches_times_stages() -> None:
    from triosim.plan.search_size import MAX_PLAN_BLOCKS as limit
    from triosim.plan.search_size import check_search_size, pipeline_blocks

    assert limit == MAX_PLAN_BLOCKS
    cands = [Candidate(tp=1, pp=4, dp=2, micro_batch=2), Candidate(tp=1, pp=2, dp=1, micro_batch=1,
                                                                   schedule="interleaved", virtual=2),
             Candidate(tp=8, pp=1, dp=1, micro_batch=1)]
    # 64 samples: dp 2 → 32 a replica, 16 micro-batches × 4 stages; dp 1 → 64 × 4; no pipeline: 1
    assert pipeline_blocks(cands, 64) == 16 * 4 + 64 * 4 + 1
    space = SearchSpace(8, 1024, 4, 4, 8)
    assert check_search_size(space, list(enumerate_candidates(space))) < MAX_PLAN_BLOCKS
    with pytest.raises(Exception, match="--global-batch 1,048,576 on 8 GPUs.*limit of 64,000,000"):
        big = SearchSpace(8, 2**20, 4, 4, 8)
        check_search_size(big, list(enumerate_candidates(big)))


def test_a_huge_global_batch_is_refused_before_anything_is_profiled(monkeypatch, capsys) -> None:
    """``--global-batch 100000000`` grew to 22 GB and died with a BrokenProcessPool traceback; now
    one line naming the flag and the limit, before the trace is profiled."""
    def no_profiling(*args, **kwargs):
        raise AssertionError("profiled before the size check")

    monkeypatch.setattr(plan_package, "ModelProfile", no_profiling)
    for batch in ("100000000", "1000000"):
        code = main(["plan", "-trace-dir", str(GPT), "--gpus", "8", "--global-batch", batch])
        line = _one_line(capsys)
        assert code == 2 and "--global-batch" in line and f"limit of {MAX_PLAN_BLOCKS:,}" in line


@pytest.mark.parametrize("order", ["dp,tp,pp", "tp,dp,cp,pp"])
def test_a_rank_order_the_estimate_cannot_number_is_refused(capsys, order) -> None:
    """The estimate numbers GPUs by ``--rank-order`` with tp innermost and cp (if named) right
    after it, as Megatron-Core's orders have them; another order is one line, not a wrong plan."""
    code = main(["plan", "-trace-dir", str(GPT), "--gpus", "8", "--global-batch", "16", "--rank-order", order])
    line = _one_line(capsys)
    assert code == 2 and f"--rank-order {order}" in line and "tp first" in line


def test_plan_reads_its_flags_from_config_and_the_command_line_wins(tmp_path, capsys) -> None:
    cfg = tmp_path / "plan.yaml"
    cfg.write_text(f"trace-dir: {GPT}\ntopology: nvlink-cluster\ngpus: 8\nglobal-batch: 16\n")
    assert main(["plan", "--config", str(cfg), "--top", "0", "-q"]) == 0
    line = capsys.readouterr().out
    assert "--topology nvlink-cluster" in line and "--global-batch 16" in line
    assert main(["plan", "--config", str(cfg), "--gpus", "4", "--top", "0", "--show", "1"]) == 0
    assert "on 4 GPUs" in capsys.readouterr().out
    cfg.write_text(f"trace-dir: {GPT}\ngpus: 8\nglobal-batch: 16\nschedule: 1f1b\n")
    assert main(["plan", "--config", str(cfg)]) == 2
    assert f"--config {cfg} sets it" in _one_line(capsys)


@pytest.mark.parametrize("show", ["0", "-1"])
def test_show_must_be_positive(capsys, show) -> None:
    code = main(["plan", "-trace-dir", str(GPT), "--gpus", "8", "--global-batch", "16", "--show", show])
    assert code == 2 and f"--show must be 1 or more, got {show}" in _one_line(capsys)


def test_progress_lines_on_a_pipe(monkeypatch, capsys) -> None:
    """stderr not a terminal (capsys): candidates estimated and DAG-timed, with counts and
    totals, as plain lines (the interval shortened to 0); nothing with -q."""
    import triosim.cli.progress as progress

    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0, raising=False)
    argv = ["plan", "-trace-dir", str(GPT), "--gpus", "8", "--global-batch", "16", "--top", "2", "--jobs", "1"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "triosim: estimating: 1/552 candidates, " in err and "triosim: DAG-timing: 2/2 candidates, " in err
    assert main([*argv, "-q"]) == 0
    assert capsys.readouterr().err == ""


# Runs `triosim plan` with the DAG timing slowed (one configuration every 0.2 s, "READY" on
# stdout once the first is timed) and the CSV's writing slowed (0.3 s), so that two Ctrl-C
# presses 10 ms apart land in the timing and in the writing of what it finished.
_SLOWED_PLAN = textwrap.dedent("""
    import importlib, sys, time
    import triosim.plan as plan_package
    from triosim.cli.console import main

    search = importlib.import_module("triosim.plan.search")  # the module, not the function

    real_run, real_write = search.run_inprocess, plan_package.write_csv

    def slow_run(traces, tasks, on_outcome, *rest):
        for k, task in enumerate(tasks):
            real_run(traces, [task], on_outcome)
            if k == 0:
                print("READY", flush=True)
            time.sleep(0.2)

    def slow_write(*args, **kwargs):
        time.sleep(0.3)
        real_write(*args, **kwargs)

    search.run_inprocess, plan_package.write_csv = slow_run, slow_write
    sys.exit(main(sys.argv[1:]))
""")


def test_two_quick_ctrl_c_still_write_what_was_finished(tmp_path) -> None:
    out = tmp_path / "plan.csv"
    proc = subprocess.Popen([sys.executable, "-c", _SLOWED_PLAN, "plan", "-trace-dir", str(GPT), "--gpus", "8",
                             "--global-batch", "16", "--top", "20", "--jobs", "1", "--out", str(out), "-q"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        proc.send_signal(signal.SIGINT)
        time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted after" in err
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 552 and all(row["estimate_ms"] for row in rows)
    assert any(row["dag_ms"] for row in rows)
