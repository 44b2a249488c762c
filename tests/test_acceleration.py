"""Accelerated and exact paths give the same answer (issue: speed and scale).

Two accelerations exist: macro collectives (one task holding the ring's links for the
closed-form time instead of 2(N−1)·N transfer tasks) and copying a replica's memory plan to
the other replicas when it needs no memcpy tasks. On every configuration small enough to run
the exact path, both must agree with it to 1e-9 relative.
"""

from __future__ import annotations

import pytest

import triosim.graph.data.data_parallel as dp
import triosim.graph.memory.plan as memory
import triosim.graph.tensor.per_op as tp
from triosim import build_platform, load_trace, simulate
from triosim.graph.strategy import Strategy
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

REL = 1e-9


def _plan_every_replica(graph, platform, devices, make_steps, sizes, external, persistent=(), placement="gpu"):
    external, persistent = list(external), set(persistent)
    return [memory.plan_memory(graph, platform, g, make_steps(g), sizes, external, persistent, placement)
            for g in devices]


def _traces(tmp_path):
    return [load_trace(write_synthetic_trace(tmp_path / f"s{seed}", SyntheticModel(layers=5, seed=seed)),
                       batch_size=8) for seed in (1, 2)]


@pytest.mark.parametrize("case", [1, 2, 3])
@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_macro_collectives_match_expanded(tmp_path, case, n):
    for trace in _traces(tmp_path):
        plat = build_platform(n, ptp_bandwidth_gbps=0.001, link_latency_us=3.0)
        exact = simulate(trace, plat, Strategy(case=case, collective_detail="expanded", bucket_mb=0.01))
        fast = simulate(trace, plat, Strategy(case=case, collective_detail="macro", bucket_mb=0.01))
        assert fast.makespan_s == pytest.approx(exact.makespan_s, rel=REL)
        assert [g.compute_ms for g in fast.per_gpu] == pytest.approx([g.compute_ms for g in exact.per_gpu], rel=REL)


@pytest.mark.parametrize("model", ["vgg13", "resnet50"])
@pytest.mark.parametrize("case", [1, 2, 3])
@pytest.mark.parametrize("n", [2, 8, 16])
def test_macro_collectives_match_expanded_on_reference(request, model, case, n):
    trace = load_trace(request.getfixturevalue(f"{model}_dir"), batch_size=128)
    plat = build_platform(n, link_latency_us=1.0)
    exact = simulate(trace, plat, Strategy(case=case, collective_detail="expanded"))
    fast = simulate(trace, plat, Strategy(case=case, collective_detail="macro"))
    assert fast.makespan_s == pytest.approx(exact.makespan_s, rel=REL)


def test_copied_replica_plans_match_planning_every_gpu(tmp_path, monkeypatch):
    trace = _traces(tmp_path)[0]
    configs = [(case, n) for case in (1, 2, 3) for n in (2, 4, 8)]
    fast = {c: simulate(trace, build_platform(c[1]), Strategy(case=c[0])) for c in configs}
    monkeypatch.setattr(dp, "plan_replicas", _plan_every_replica)
    monkeypatch.setattr(tp, "plan_replicas", _plan_every_replica)
    for c in configs:
        exact = simulate(trace, build_platform(c[1]), Strategy(case=c[0]))
        assert fast[c].makespan_s == pytest.approx(exact.makespan_s, rel=REL)
        assert [g.peak_memory_bytes for g in fast[c].per_gpu] == [g.peak_memory_bytes for g in exact.per_gpu]
