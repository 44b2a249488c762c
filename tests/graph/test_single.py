"""Case 0 (single-GPU replay) and the memory model it uses: reference numbers and properties."""

from __future__ import annotations

import math
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triosim.graph.memory.plan as memory_module
from triosim import build_platform, load_trace, simulate
from triosim.errors import OutOfMemoryError
from triosim.graph.strategy import Strategy
from triosim.schedule.validate import dag_violations, schedule_violations
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace


def run(trace, **kw):
    placement = kw.pop("placement", "gpu")
    return simulate(trace, build_platform(1, **kw), Strategy(case=0, initial_placement=placement))


def test_reference_case0_is_the_sum_of_op_times(vgg13_dir, resnet50_dir):
    assert run(load_trace(vgg13_dir)).makespan_ms == pytest.approx(94.038, abs=1e-9)
    assert run(load_trace(resnet50_dir)).makespan_ms == pytest.approx(70.723, abs=1e-9)


def test_remote_placement_is_bounded_by_the_link(vgg13_dir):
    trace = load_trace(vgg13_dir)
    res = run(trace, placement="remote", bandwidth_gbps=10)
    fetched = res.graph.meta["memory"][0]["fetched_bytes"]
    assert fetched >= sum(trace.tensors[k].bytes for k in trace.parameters)
    assert res.makespan_s >= fetched / 10e9
    assert res.makespan_ms > 94.038


def test_short_capacity_evicts_refetches_and_takes_longer(vgg13_dir):
    trace = load_trace(vgg13_dir)
    full = run(trace, bandwidth_gbps=100)
    tight = run(trace, bandwidth_gbps=100, capacity_log2=32.5)
    mem = tight.graph.meta["memory"][0]
    assert mem["evictions"] > 0 and mem["fetched_bytes"] > 0
    assert tight.per_gpu[0].peak_memory_bytes <= 2**32.5
    assert tight.makespan_s > full.makespan_s


def test_impossible_capacity_is_an_out_of_memory_error(vgg13_dir):
    with pytest.raises(OutOfMemoryError, match=r"op 3 \(aten::conv2d, trace.csv:4\) needs 3,288,482,048 bytes"):
        run(load_trace(vgg13_dir), capacity_log2=31)


@st.composite
def scenarios(draw):
    model = SyntheticModel(
        layers=draw(st.integers(1, 6)),
        batch_size=draw(st.sampled_from([2, 4, 8])),
        width=draw(st.sampled_from([8, 64, 256])),
        seed=draw(st.integers(0, 10_000)),
    )
    return (
        model,
        draw(st.sampled_from(["gpu", "remote"])),
        draw(st.floats(0.001, 1000)),
        draw(st.floats(0.15, 1.5)),
    )


def check_case0_properties(model, placement, bandwidth, memory_fraction):
    with tempfile.TemporaryDirectory() as tmp:
        trace = load_trace(write_synthetic_trace(tmp, model), batch_size=model.batch_size)
    # Capacity relative to everything the step touches: from out-of-memory to plenty.
    capacity_log2 = math.log2(max(1024, memory_fraction * sum(t.bytes for t in trace.tensors.values())))
    try:
        res = run(trace, placement=placement, bandwidth_gbps=bandwidth, capacity_log2=capacity_log2)
    except OutOfMemoryError:
        return
    g, s = res.graph, res.schedule
    assert dag_violations(g) == []
    assert schedule_violations(g, s) == []
    ops = [g.attrs[t]["op"] for t in range(len(g)) if g.kind[t] == "compute"]
    assert sorted(ops) == list(range(len(trace.ops)))  # each op exactly once
    assert res.per_gpu[0].peak_memory_bytes <= 2**capacity_log2
    assert res.makespan_s >= trace.total_time_s * (1 - 1e-12)
    fetches = [t for t in range(len(g)) if g.kind[t] == "memcpy"]
    last_compute = max(s.end[t] for t in range(len(g)) if g.kind[t] == "compute")
    # Data only moves to be used: every memcpy finishes before some compute that needs it.
    assert all(s.end[t] <= last_compute + 1e-12 for t in fetches)
    assert all(g.succ[t] for t in fetches if (g.attrs[t] or {}).get("direction") == "fetch")
    link = 1 / (bandwidth * 1e9)
    fetched = g.meta["memory"][0]["fetched_bytes"]
    assert res.makespan_s >= fetched * link * (1 - 1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_case0_invariants(scenario):
    check_case0_properties(*scenario)


def test_case0_property_catches_a_planted_bug(monkeypatch):
    """Drop the fetch→compute edges: ops would no longer wait for their inputs to arrive."""
    real = memory_module.plan_memory

    def buggy(graph, *a, **kw):
        add_edge = graph.add_edge

        def skip_fetch_edges(u, v):
            if graph.kind[u] != "memcpy":
                add_edge(u, v)

        edges_to = graph._edges_to  # the edges a new task's ``after`` adds

        def skip_fetch_preds(tid, after):
            return edges_to(tid, [u for u in after if graph.kind[u] != "memcpy"])

        graph.add_edge = skip_fetch_edges
        graph._edges_to = skip_fetch_preds
        try:
            return real(graph, *a, **kw)
        finally:
            del graph.add_edge, graph._edges_to

    monkeypatch.setattr("triosim.graph.single.plan_memory", buggy)
    with pytest.raises(AssertionError):
        check_case0_properties(SyntheticModel(layers=3, batch_size=8, width=256, seed=3), "remote", 0.001, 2.0)
