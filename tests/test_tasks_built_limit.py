"""A build that grows past the task limit stops with one line (exit 2), not an out-of-memory kill.

The checks before building count the trace's operators; a whole build on a ring adds many
collective tasks per operator (a GPT of 96 layers, dp 8 × tp 8 × pp 16 on a 1,024-GPU ring, was
killed for want of memory after three minutes). The build itself now stops once its graph passes
the limit; here the limit is lowered to catch a small ring build that passes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_capture import run

import triosim.limits

GPT = str(Path(__file__).resolve().parents[1] / "sample_trace" / "gpt-h16-cpu-bs8")
RING = ["run", "-trace-dir", GPT, "--num-layers", "4", "-batch-size-sim", "8", "-micro-batch-size", "1",
        "--dp", "2", "--tp", "2", "--pp", "2", "-q"]


def test_a_ring_build_past_the_task_limit_stops_with_one_line(monkeypatch) -> None:
    code, out, _ = run([*RING, "--json", "-"])
    assert code == 0
    import json
    tasks = json.loads(out)["tasks"]
    monkeypatch.setattr(triosim.limits, "MAX_TASKS", tasks // 2)
    code, out, err = run(RING)
    assert code == 2 and out == ""
    line = err.strip()
    assert len(line.splitlines()) == 1 and "passed the limit of" in line and "while building stage" in line
    assert "Traceback" not in err


def test_a_build_under_the_limit_runs(monkeypatch) -> None:
    code, out, _ = run([*RING, "--json", "-"])
    import json
    monkeypatch.setattr(triosim.limits, "MAX_TASKS", json.loads(out)["tasks"])
    code, _, err = run(RING)
    assert code == 0, err


@pytest.mark.parametrize("tasks", [10, 10_000_001])
def test_check_tasks_built_names_where(tasks) -> None:
    if tasks <= triosim.limits.MAX_TASKS:
        triosim.limits.check_tasks_built(tasks, "x")
        return
    with pytest.raises(triosim.errors.ConfigError, match="while building stage 3's block"):
        triosim.limits.check_tasks_built(tasks, "stage 3's block 1 of 2")
