"""The time breakdown: every GPU's parts add up to the iteration, compute parts to its busy time."""

from __future__ import annotations

from pathlib import Path

import pytest

from triosim import simulate
from triosim.config import configure
from triosim.report.breakdown import PARTS, breakdown, mean_breakdown

SAMPLES = Path(__file__).resolve().parents[2] / "sample_trace"
RUNS = [
    {"trace-dir": str(SAMPLES / "gpt-h16-h200-bs8"), "num-layers": 4, "tp": 2, "pp": 2, "dp": 2,
     "schedule": "1f1b", "micro-batch-size": 1, "batch-size-sim": 4, "zero": "1"},
    {"trace-dir": str(SAMPLES / "resnet18-h200-bs16"), "case": 1, "gpus": 4},
    {"trace-dir": str(SAMPLES / "resnet18-h200-bs16"), "case": 3, "gpus": 2},
    {"trace-dir": str(SAMPLES / "resnet18-h200-bs16"), "case": 4, "gpus": 4, "micro-batch-size": 4},
]


@pytest.mark.parametrize("options", RUNS, ids=["hybrid", "case1", "case3", "case4"])
def test_parts_add_up_to_the_iteration_on_every_gpu(options: dict) -> None:
    result = simulate(*configure(options))
    rows = breakdown(result)
    assert [r.gpu for r in rows] == [g.gpu for g in result.per_gpu]
    for row, gpu in zip(rows, result.per_gpu):
        assert set(row.parts) == set(PARTS)
        assert all(v >= 0 for v in row.parts.values())
        assert sum(row.parts.values()) == pytest.approx(result.makespan_s, rel=1e-9)
        compute = sum(row.parts[k] for k in ("forward", "backward", "recompute", "optimizer"))
        assert compute * 1e3 == pytest.approx(gpu.compute_ms, rel=1e-9)
        exposed = sum(v for k, v in row.parts.items() if k.startswith("exposed_"))
        assert exposed * 1e3 == pytest.approx(gpu.exposed_comm_ms, rel=1e-9, abs=1e-9)
    assert sum(mean_breakdown(rows).parts.values()) == pytest.approx(result.makespan_s, rel=1e-9)


def test_purposes_follow_the_parallelism() -> None:
    """Data parallel waits only on DP, tensor parallel only on TP, the pipeline only on PP sends."""
    expect = {1: "exposed_dp", 3: "exposed_tp", 4: "exposed_pp"}
    for options in RUNS[1:]:
        result = simulate(*configure(options))
        mean = mean_breakdown(breakdown(result)).parts
        waited = {k for k, v in mean.items() if k.startswith("exposed_") and v > 0}
        assert waited == {expect[options["case"]]}
        assert mean["backward"] > mean["forward"] > 0
