"""Representative hybrid builds fuse runs of ops into one task and plan a stage's memory
vectorised: both must give exactly the op-by-op numbers (and the tests must catch it when not)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from triosim.graph import composition
from triosim.graph.memory import composition as composed_memory
from triosim.graph.memory import stage as stage_memory
from triosim.graph.pipeline import rank_program, tp_charges
from triosim.graph.strategy import Strategy
from triosim.hardware.flow_network import Flow, maxmin_rates
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.trace import load_trace
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

REPO = Path(__file__).resolve().parents[2]
GPT = REPO / "sample_trace" / "gpt-cpu-bs8"
GPT16 = REPO / "sample_trace" / "gpt-h16-cpu-bs8"

CONFIGS = [  # (trace, strategy kwargs, GPUs, platform kwargs)
    ("gpt", dict(dp=2, tp=2, pp=2, micro_batch_size=2, schedule="1f1b"), 8,
     dict(topology="nvlink-cluster", gpus_per_node=4)),
    ("gpt", dict(dp=2, tp=2, pp=2, micro_batch_size=2, schedule="gpipe", zero=1), 8, dict(topology="switch")),
    ("gpt", dict(dp=2, tp=1, pp=4, micro_batch_size=1, schedule="1f1b", zero=3, bucket_mb=0.01), 8,
     dict(topology="nvlink-cluster", gpus_per_node=2)),
    ("gpt16", dict(dp=1, tp=4, pp=2, micro_batch_size=1, schedule="1f1b", sequence_parallel=True), 8,
     dict(topology="nvlink-cluster", gpus_per_node=4)),
    ("syn", dict(dp=2, tp=2, pp=2, micro_batch_size=2, schedule="1f1b", tp_style="per-op"), 8,
     dict(topology="ring")),
]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    syn = write_synthetic_trace(tmp_path_factory.mktemp("syn") / "mlp", SyntheticModel(layers=5, batch_size=8, seed=3))
    return {"gpt": load_trace(GPT), "gpt16": load_trace(GPT16), "syn": load_trace(syn, batch_size=8)}


def _build(trace, n, kw, plat, fuse=True):
    p = build_platform(num_gpus=n, **plat)
    g = composition.build(trace, p, Strategy(exact=False, **kw), fuse_runs=fuse)
    return g, schedule(g)


def _peaks(g):
    return {d: m["peak_bytes"] for d, m in g.meta["memory"].items()}


@pytest.mark.parametrize("name,kw,n,plat", CONFIGS)
def test_fused_runs_equal_op_by_op(traces, name, kw, n, plat):
    trace = traces[name]
    gf, sf = _build(trace, n, kw, plat)
    go, so = _build(trace, n, kw, plat, fuse=False)
    assert abs(sf.makespan - so.makespan) <= 1e-9 * so.makespan, (sf.makespan, so.makespan)
    assert _peaks(gf) == _peaks(go)
    fused = [t for t in range(len(gf)) if gf.kind[t] == "compute" and "ops" in (gf.attrs[t] or {})]
    assert fused and len(gf) < len(go)
    # Every op is still accounted for once per micro-batch (fused tasks list theirs).
    count = lambda g: sorted((op, g.attrs[t].get("microbatch")) for t in range(len(g)) if g.kind[t] == "compute"  # noqa: E731
                             for op in g.attrs[t].get("ops", (g.attrs[t]["op"],)))
    assert count(gf) == count(go)
    # A fused task lasts exactly its ops' time.
    assert abs(sum(gf.duration[t] for t in range(len(gf)) if gf.kind[t] == "compute")
               - sum(go.duration[t] for t in range(len(go)) if go.kind[t] == "compute")) <= 1e-12


def test_fusing_across_a_cut_is_caught(traces, monkeypatch):
    """Planted bug: runs fused across TP collectives (those of mid-run ops are lost, and nothing
    waits for the others)."""
    real = rank_program.segment_cuts

    def without_tp_cuts(b, s, params, waits_here, colls, units):
        return real(b, s, params, {i: () for i in waits_here}, {}, units)

    monkeypatch.setattr(rank_program, "segment_cuts", without_tp_cuts)
    differ = 0
    for name, kw, n, plat in CONFIGS:
        _, sf = _build(traces[name], n, kw, plat)
        _, so = _build(traces[name], n, kw, plat, fuse=False)
        differ += abs(sf.makespan - so.makespan) > 1e-9 * so.makespan
    assert differ >= 2


# op by op every config; fused, ZeRO-3 (the third), whose vectorised plan gives one counter value
# per op step as the step-by-step plan does (the others one per task: the most its ops hold)
@pytest.mark.parametrize("name,kw,n,plat,fuse", [(*c, False) for c in CONFIGS] + [(*CONFIGS[2], True)])
def test_vectorised_stage_memory_equals_step_by_step(traces, name, kw, n, plat, fuse, monkeypatch):
    trace = traces[name]
    fast, _ = _build(trace, n, kw, plat, fuse=fuse)
    monkeypatch.setattr(composed_memory, "_stage_memory_fits", lambda *a, **k: None)
    slow, _ = _build(trace, n, kw, plat, fuse=fuse)
    assert _peaks(fast) == _peaks(slow)
    for d, m in slow.meta["memory"].items():
        tasks, occ = m["occupancy"]
        ftasks, focc = fast.meta["memory"][d]["occupancy"]
        assert tuple(tasks) == tuple(ftasks) and np.array_equal(np.asarray(occ), np.asarray(focc))
    assert repr(fast.meta["hybrid"]["memory"]) == repr(slow.meta["hybrid"]["memory"])  # the gathered copies at the peak


def test_vectorised_zero3_memory_without_the_gathered_copies_is_caught(traces, monkeypatch):
    name, kw, n, plat = CONFIGS[2]  # ZeRO-3
    good = _peaks(_build(traces[name], n, kw, plat)[0])
    monkeypatch.setattr(composed_memory, "_gathered_alive", lambda b, s, runs: [0] * sum(len(ops) for _, ops, _ in runs))
    bad = _peaks(_build(traces[name], n, kw, plat)[0])
    assert bad != good


def test_vectorised_stage_memory_catches_a_planted_bug(traces, monkeypatch):
    """Planted bug: buffers another stage sends count as resident from the start (as if external)."""
    name, kw, n, plat = CONFIGS[0]
    good = _peaks(_build(traces[name], n, kw, plat, fuse=False)[0])
    real = stage_memory.stage_occupancy
    monkeypatch.setattr(composed_memory, "stage_occupancy", lambda *a, **k: real(*a[:5], set(), *a[6:], **k))
    bad = _peaks(_build(traces[name], n, kw, plat, fuse=False)[0])
    assert bad != good


def test_a_flow_alone_gets_the_rate_of_the_general_solver():
    # Two flows on disjoint links: the general loop's rates; each alone: the fast path's.
    a = Flow(1, 1e6, 5e9, [(0, 1 / 4e9), (1, 1 / 8e9)])
    b = Flow(2, 1e6, 9e9, [(2, 1 / 6e9)])
    maxmin_rates([a, b])
    ra, rb = a.rate, b.rate
    maxmin_rates([a])
    maxmin_rates([b])
    assert a.rate == pytest.approx(ra, rel=1e-12) and b.rate == pytest.approx(rb, rel=1e-12)
    assert a.rate == pytest.approx(4e9, rel=1e-12) and b.rate == pytest.approx(6e9, rel=1e-12)


# ----------------------------------------------------------------------------- canonical groups

SHIFT_GROUPS = [(3, 4), (4, 5, 6, 7), (5, 9, 13, 17), (2, 6, 10, 14, 18, 22, 26, 30), (8, 9, 12, 13), (29, 30, 31, 0)]


@pytest.mark.parametrize("topology", ["nvlink-cluster", "switch"])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
def test_a_group_costs_the_same_as_its_canonical_shift(topology, op):
    from triosim.graph.collectives.group_comm import GroupComm, closed_form_seconds
    from triosim.schedule.tasks import TaskGraph

    p = build_platform(num_gpus=32, topology=topology, gpus_per_node=4, node_bandwidth_gbps=50)
    comm = GroupComm(TaskGraph(), p, "macro", exact=False)
    for group in SHIFT_GROUPS:
        base = comm.canonical(group)
        assert min(base) < 4 and len(base) == len(group)
        for nbytes in (4096, 3 << 20, 1 << 28):
            assert closed_form_seconds(p, base, op, nbytes) == closed_form_seconds(p, group, op, nbytes)


def test_shifting_by_part_of_a_node_is_caught():
    """Planted bug: shifting by GPUs rather than whole nodes moves a cross-node pair into one node."""
    from triosim.graph.collectives.group_comm import closed_form_seconds

    p = build_platform(num_gpus=32, topology="nvlink-cluster", gpus_per_node=4, node_bandwidth_gbps=50)
    group = (3, 4)
    wrong = tuple(g - min(group) for g in group)  # (0, 1): one node
    assert closed_form_seconds(p, wrong, "all_reduce", 1 << 20) != closed_form_seconds(p, group, "all_reduce", 1 << 20)


# A stage's TP collectives in a representative build are added from a charge found once per (op,
# bytes); the long way looks each one up through GroupComm.run. Micro-batches of 3, 3 and 2
# samples: two payload sizes per collective.
CHARGE_CONFIGS = [
    ("gpt", dict(dp=2, tp=2, pp=2, micro_batch_size=3, schedule="1f1b"), 8,
     dict(topology="nvlink-cluster", gpus_per_node=4)),
    ("gpt16", dict(dp=1, tp=4, pp=2, micro_batch_size=3, schedule="gpipe", sequence_parallel=True), 8,
     dict(topology="switch")),
    ("gpt", dict(dp=1, tp=4, pp=1, micro_batch_size=3, schedule="1f1b"), 4, dict(topology="ring")),
]


def _graph_facts(g):
    return (g.kind, g.label, g.duration, [tuple(g.resource_names[r] for r in rs) for rs in g.resources], g.devices,
            g.nbytes, g.latency, g.attrs, g.succ, g.npred, g.meta["hybrid"])


def _charge_once_vs_long_way(trace, n, kw, plat, monkeypatch):
    fast, sf = _build(trace, n, kw, plat)
    with monkeypatch.context() as m:
        m.setattr(rank_program, "charges_once", lambda *a: False)
        slow, ss = _build(trace, n, kw, plat)
    return fast, sf, slow, ss


@pytest.mark.parametrize("name,kw,n,plat", CHARGE_CONFIGS)
def test_tp_charges_found_once_equal_the_long_way(traces, name, kw, n, plat, monkeypatch):
    fast, sf, slow, ss = _charge_once_vs_long_way(traces[name], n, kw, plat, monkeypatch)
    assert any(fast.kind[t] == "collective" and (fast.attrs[t] or {}).get("group_kind") == "tp"
               for t in range(len(fast)))
    assert _graph_facts(fast) == _graph_facts(slow)
    assert sf.makespan == ss.makespan


def test_tp_charge_reused_across_payload_sizes_is_caught(traces, monkeypatch):
    """Planted bug: a charge found once per op, whatever its payload (the last micro-batch's
    smaller collectives take the full ones' time)."""
    def per_op_only(comm, charged, c, nbytes, group, parallel):
        hit = charged.get(c.op)
        if hit is None:
            hit = charged[c.op] = (comm.charge(c.kind, group, nbytes, parallel),
                                   tp_charges.wire_bytes_per_gpu(c.kind, len(group), nbytes))
        return hit

    monkeypatch.setattr(rank_program, "tp_charge", per_op_only)
    name, kw, n, plat = CHARGE_CONFIGS[0]
    fast, _, slow, _ = _charge_once_vs_long_way(traces[name], n, kw, plat, monkeypatch)
    assert _graph_facts(fast) != _graph_facts(slow)
