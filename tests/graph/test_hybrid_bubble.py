"""The hybrid builder's pipeline bubble on a uniform trace is the closed form (P−1)/R for GPipe
and 1F1B (the interleaved schedule's (P−1)/(V·R) is tested with -case 4)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from triosim import build_platform, load_trace, simulate
from triosim.graph.pipeline import stages as pipeline_stages
from triosim.graph.strategy import Strategy
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace


def _uniform(tmp: Path, layers: int = 8, batch: int = 16):
    path = write_synthetic_trace(tmp / "u", SyntheticModel(layers=layers, batch_size=batch, min_us=100.0, max_us=100.0))
    trace = load_trace(path, batch_size=batch)
    # loss, its backward and the optimizer (whose stage shares follow parameter bytes) take 1 ns
    ops = [op._replace(duration_s=1e-9) if "loss" in op.name.lower() or op.stage == "optimizer" else op
           for op in trace.ops]
    return replace(trace, ops=ops)


def _bubble(trace, p: int, r: int, schedule: str) -> float:
    res = simulate(trace, build_platform(p, ptp_bandwidth_gbps=1e6, link_latency_us=0.0),
                   Strategy(pp=p, micro_batch_size=trace.batch_size // r, schedule=schedule, partition="time"))
    ideal = sum(op.duration_s for op in trace.ops) / p
    return (res.makespan_s - ideal) / ideal


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, r", [(2, 4), (4, 4), (4, 16)])
def test_bubble_is_p_minus_1_over_r(tmp_path, schedule, p, r):
    assert _bubble(_uniform(tmp_path), p, r, schedule) == pytest.approx((p - 1) / r, rel=1e-4)


def test_planted_bug_serialised_micro_batches_break_the_closed_form(tmp_path, monkeypatch):
    """Bug: every stage runs micro-batch r's forward and backward before r + 1's forward (no
    pipelining): the bubble grows far beyond (P−1)/R."""
    def serial(schedule, n, r_count, s):
        return [(ph, r) for r in range(r_count) for ph in (pipeline_stages.FORWARD, pipeline_stages.BACKWARD)]

    import triosim.graph.pipeline.rank_program as hybrid_module
    monkeypatch.setattr(hybrid_module, "block_order", serial)
    assert _bubble(_uniform(tmp_path), 4, 4, "gpipe") > 2 * 3 / 4
