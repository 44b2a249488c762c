"""DESIGN §4 invariants across every case, topology and memory setting (hypothesis).

Each case has its own, deeper property tests next to its builder; this one crosses them with
every topology, placement and capacity so that no combination escapes: the DAG is acyclic and
has no dangling task, every trace op runs the expected number of times, the schedule respects
precedence and exclusive resources, and the makespan is at least the critical path and the
busiest resource.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triosim.schedule.list_scheduler as scheduler_module
from triosim import build_platform, load_trace, simulate
from triosim.errors import ConfigError, OutOfMemoryError
from triosim.graph.strategy import Strategy
from triosim.schedule.validate import dag_violations, schedule_violations
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace


@st.composite
def configurations(draw):
    model = SyntheticModel(layers=draw(st.integers(2, 5)), batch_size=8, width=draw(st.sampled_from([16, 128])),
                           seed=draw(st.integers(0, 1000)), tp_fraction=draw(st.sampled_from([0.0, 0.5, 1.0])))
    case = draw(st.integers(0, 4))
    gpus = draw(st.integers(1, 6))
    topology = draw(st.sampled_from(["ring", "fully-connected", "switch", "nvlink-cluster", "mesh"]))
    platform = dict(
        ptp_bandwidth_gbps=draw(st.sampled_from([0.01, 1.0, 100.0])),
        bandwidth_gbps=draw(st.sampled_from([0.01, 10.0])),
        link_latency_us=draw(st.sampled_from([0.0, 5.0])),
        topology=topology,
        gpus_per_node=draw(st.integers(1, 4)),
        num_rows=1,
    )
    strategy = Strategy(
        case=case,
        micro_batch_size=draw(st.sampled_from([None, 1, 3, 8])),
        bucket_mb=draw(st.sampled_from([0.001, 25.0])),
        schedule=draw(st.sampled_from(["gpipe", "1f1b"])),
        partition=draw(st.sampled_from(["time", "count"])),
        initial_placement=draw(st.sampled_from(["gpu", "remote"])),
        collective_detail=draw(st.sampled_from(["expanded", "macro"])),
    )
    memory_fraction = draw(st.sampled_from([0.6, 10.0]))
    return model, gpus, platform, strategy, memory_fraction


def check_invariants(model, gpus, platform_kw, strategy, memory_fraction):
    with tempfile.TemporaryDirectory() as tmp:
        trace = load_trace(write_synthetic_trace(tmp, model), batch_size=model.batch_size)
    total = sum(t.bytes for t in trace.tensors.values())
    n = 1 if strategy.case == 0 else gpus
    try:
        plat = build_platform(n, capacity_log2=math.log2(max(1024, memory_fraction * total)), num_cols=n,
                              **platform_kw)
        res = simulate(trace, plat, strategy)
    except (OutOfMemoryError, ConfigError):
        return  # too little memory for one op, or more stages than forward ops
    g, s = res.graph, res.schedule
    assert dag_violations(g) == []
    assert schedule_violations(g, s) == []
    runs = Counter((g.attrs[t] or {}).get("op") for t in range(len(g)) if g.kind[t] == "compute")
    micro = 1 if strategy.micro_batch_size is None else math.ceil(model.batch_size / strategy.micro_batch_size)
    for i, op in enumerate(trace.ops):
        if strategy.case in (0, 1, 2, 3):
            assert runs[i] == n, f"op {i} runs {runs[i]} times on {n} GPUs"
        elif op.stage == "optimizer":
            assert 1 <= runs[i] <= n  # split over the stages that own parameters
        else:
            assert runs[i] == micro, f"op {i} runs {runs[i]} times for {micro} micro-batches"
    busiest = max((sum(g.duration[t] for t in range(len(g)) if r in g.resources[t]) for r in
                   range(len(g.resource_names))), default=0.0)
    assert res.makespan_s >= busiest * (1 - 1e-12)
    assert all(gs.peak_memory_bytes <= plat.capacity_bytes for gs in res.per_gpu)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configurations())
def test_every_case_topology_and_memory_setting_keeps_the_invariants(config):
    check_invariants(*config)


def test_the_cross_case_property_catches_a_planted_bug(monkeypatch):
    """Planted bug: the scheduler forgets that links are exclusive (only compute streams are)."""
    real = scheduler_module.schedule

    def links_not_exclusive(graph, progress=None):
        saved = graph.resources
        graph.resources = [tuple(r for r in res if graph.resource_names[r].endswith(".compute")) for res in saved]
        try:
            return real(graph, progress)
        finally:
            graph.resources = saved

    monkeypatch.setattr("triosim.simulation.schedule", links_not_exclusive)
    with pytest.raises(AssertionError):
        test_every_case_topology_and_memory_setting_keeps_the_invariants()
