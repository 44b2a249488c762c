"""Collective algorithms against their closed forms (``collective_cost``): every algorithm (NVLS
on a node whose NVSwitch offers SHARP), in expanded and macro form, under both network models, on groups where its channels use disjoint
links; nccl-tests' bus-bandwidth relation; byte conservation per link; ``auto``; sub-groups in
any order; and planted bugs the properties catch."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import triosim.graph.collectives.algorithms as coll
import triosim.graph.collectives.choice as choice
import triosim.graph.collectives.cost as cc
import triosim.graph.collectives.fragment as fragment
import triosim.graph.collectives.ring_cost as ring_cost
import triosim.graph.collectives.ring_tasks as ring_tasks
from triosim import build_platform
from triosim.graph.collectives.cost import collective_cost
from triosim.hardware.cluster import build_cluster
from triosim.hardware.topology_file import ClusterSpec, LinkSpec
from triosim.report.result import summarize
from triosim.schedule.list_scheduler import schedule
from triosim.schedule.network import attach_network
from triosim.schedule.tasks import TaskGraph
from triosim.schedule.validate import dag_violations

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PLANTED = settings(PROPS, max_examples=300, phases=[Phase.generate])  # stops at the first failure
REL = 1e-9


def run(platform, op, group, nbytes, algo, detail, root=None):
    g = TaskGraph()
    fn = getattr(coll, f"add_{op}")
    kw = {"root": group[0] if root is None else root} if op == "broadcast" else {}
    done = fn(g, platform, group, nbytes, op, detail=detail, algo=algo, **kw)
    attach_network(g, platform)
    return g, done, schedule(g)


@st.composite
def symmetric_cases(draw):
    """(platform, op, group, S, algo, detail) where the algorithm's links are disjoint and even."""
    algo = draw(st.sampled_from(("ring", "direct", "hierarchical", "tree", "one-way-ring", "nvls")))
    network = draw(st.sampled_from(("flow", "exclusive")))
    latency = draw(st.sampled_from((None, 0.0, 2.5)))
    link_lat = draw(st.sampled_from((0.0, 0.5)))
    bw = draw(st.floats(1, 900))
    if algo == "nvls":  # one node of GPUs on an NVSwitch offering SHARP
        n = draw(st.integers(2, 9))
        spec = ClusterSpec(name="sharp", gpus_per_node=n, nvlink=LinkSpec(bw, link_lat, 0.8), nics_per_gpu=1,
                           nic=LinkSpec(50.0), nodes_per_leaf=1, oversubscription=1.0, spine_latency_us=0.0,
                           remote_bandwidth_gbps=None, gpus=None,
                           nvlink_sharp_efficiency=draw(st.sampled_from((0.8, 0.69))))
        p = build_cluster(spec, Path("sharp.yaml"), n, 40, 696, network, "auto", latency)
        ops = ("all_reduce", "reduce_scatter", "all_gather")
    elif algo == "hierarchical":
        per, nodes = draw(st.integers(2, 4)), draw(st.integers(2, 3))
        p = build_platform(per * nodes, topology="nvlink-cluster", gpus_per_node=per, ptp_bandwidth_gbps=bw,
                           node_bandwidth_gbps=draw(st.floats(1, 100)), link_latency_us=link_lat,
                           network=network, collective_latency_us=latency)
        ops = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
    else:
        n = draw(st.integers(2, 9))
        topology = "fully-connected"
        if algo in ("ring", "one-way-ring"):
            topology = draw(st.sampled_from(("ring", "fully-connected")))
        elif network == "flow" and algo == "direct":
            topology = draw(st.sampled_from(("switch", "fully-connected")))
        p = build_platform(n, topology=topology, ptp_bandwidth_gbps=bw, link_latency_us=link_lat,
                           network=network, collective_latency_us=latency)
        ops = {"tree": ("all_reduce",), "direct": cc.OPS}.get(algo, ("all_reduce", "reduce_scatter", "all_gather",
                                                                     "broadcast"))
    op = draw(st.sampled_from(ops))
    group = tuple(range(p.num_gpus))
    if p.topology in ("fully-connected", "sharp") and algo != "one-way-ring":
        group = tuple(draw(st.permutations(group)))
    nbytes = draw(st.integers(0, 2**33))
    detail = draw(st.sampled_from(("expanded", "macro")))
    root = draw(st.sampled_from(group))
    return p, op, group, nbytes, algo, detail, root


def closed_form_property(case):
    p, op, group, nbytes, algo, detail, root = case
    cost = collective_cost(p, group, op, nbytes, algo=algo, root=root)
    g, done, s = run(p, op, group, nbytes, algo, detail, root)
    assert sorted(done) == sorted(group)
    assert dag_violations(g) == []
    want = cost.seconds
    assert s.makespan == pytest.approx(want, rel=REL, abs=1e-18), (cost.algo, s.makespan, want)
    assert max(s.end[t] for t in done.values()) == pytest.approx(want, rel=REL, abs=1e-18)


test_isolated_collective_takes_its_closed_form = PROPS(given(symmetric_cases())(closed_form_property))


def test_closed_form_property_catches_a_wrong_channel_split(monkeypatch):
    # Planted bug: the cost forgets that the payload is split over the channels.
    real = ring_cost._ring_phase

    def unsplit(platform, orders, nbytes, steps, name, **kw):
        return real(platform, orders, nbytes * len(orders), steps, name, **kw)

    monkeypatch.setattr(ring_cost, "_ring_phase", unsplit)
    with pytest.raises(AssertionError):
        PLANTED(given(symmetric_cases())(closed_form_property))()


def test_closed_form_property_catches_a_macro_missing_a_phase(monkeypatch):
    # Planted bug: the macro form of a multi-phase collective drops its last phase.
    real = fragment.phase_macros

    def first_phases(graph, platform, group, op, nbytes, phases, *args):
        return real(graph, platform, group, op, nbytes, phases[:-1] or phases, *args)

    monkeypatch.setattr(fragment, "phase_macros", first_phases)
    with pytest.raises(AssertionError):
        PLANTED(given(symmetric_cases())(closed_form_property))()


# ----------------------------------------------------------------------------- fixed numbers

S = 532_191_392  # vgg13's gradient bytes


def ms(x: float) -> float:
    return x * 1e3


def test_issue_examples_closed_forms():
    nv = build_platform(16, topology="nvlink-cluster", ptp_bandwidth_gbps=450, node_bandwidth_gbps=50)
    assert ms(collective_cost(nv, range(16), "all_reduce", S, "one-way-ring").seconds) == pytest.approx(19.9572, abs=1e-3)
    # Rings over all 8 rails: 2(N−1)/N · S / (8 · 50 GB/s); two-level: in node + 1/8 across.
    assert collective_cost(nv, range(16), "all_reduce", S, "ring").seconds == pytest.approx(
        2 * 15 / 16 * S / 400e9, rel=1e-12)
    assert collective_cost(nv, range(16), "all_reduce", S, "hierarchical").seconds == pytest.approx(
        2 * 7 / 8 * S / 450e9 + 2 * 1 / 2 * (S / 8) / 50e9, rel=1e-12)
    fc = build_platform(8, topology="fully-connected")
    assert collective_cost(fc, range(8), "all_reduce", S, "direct").seconds == pytest.approx(2 * S / 8 / 65e9)
    assert collective_cost(fc, range(8), "all_reduce", S).algo == "direct"
    ring = build_platform(8)
    assert collective_cost(ring, range(8), "all_reduce", S, "ring").seconds == pytest.approx(
        collective_cost(ring, range(8), "all_reduce", S, "one-way-ring").seconds / 2, rel=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_busbw_relation(n):
    """nccl-tests: busbw = algbw · 2(N−1)/N for all-reduce; a one-way ring's busbw is its link."""
    p = build_platform(n, ptp_bandwidth_gbps=100)
    c = collective_cost(p, range(n), "all_reduce", 10**9, "one-way-ring")
    assert c.busbw == pytest.approx(c.algbw * 2 * (n - 1) / n, rel=1e-12)
    assert c.busbw == pytest.approx(100e9, rel=1e-12)
    rs = collective_cost(p, range(n), "reduce_scatter", 10**9, "one-way-ring")
    assert rs.busbw == pytest.approx(100e9, rel=1e-12)


def test_broadcast_is_pipelined_near_s_over_w():
    p = build_platform(8, topology="switch", ptp_bandwidth_gbps=100)
    c = collective_cost(p, range(8), "broadcast", 10**9, "ring")
    assert 10**9 / 100e9 < c.seconds < 1.12 * 10**9 / 100e9


@pytest.mark.parametrize("algo", ["ring", "direct", "hierarchical", "tree", "one-way-ring"])
@pytest.mark.parametrize("detail", ["expanded", "macro"])
def test_bytes_per_link_are_conserved(algo, detail):
    p = build_platform(8, topology="nvlink-cluster", gpus_per_node=4, network="flow")
    cost = collective_cost(p, range(8), "all_reduce", 8 * 10**6, algo)
    g, _done, s = run(p, "all_reduce", tuple(range(8)), 8 * 10**6, algo, detail)
    _gpus, links = summarize(g, s, p)
    got = {k.link: k.bytes for k in links}
    assert set(got) == {k for k, b in cost.link_bytes.items() if b > 0}
    for name, b in cost.link_bytes.items():
        assert got[name] == pytest.approx(b, abs=64), name


def test_auto_picks_latency_bound_algorithms_for_small_messages():
    p = build_platform(64, topology="nvlink-cluster", collective_latency_us=None)
    small = collective_cost(p, range(64), "all_reduce", 1024).algo
    large = collective_cost(p, range(64), "all_reduce", 10**9).algo
    assert small != "ring" and large in ("ring", "hierarchical")
    assert collective_cost(p, range(64), "all_to_all", 10**6).algo == "direct"


def subgroup_property(topology, op, algo, data):
    p = build_platform(8, topology=topology, gpus_per_node=4, network=data.draw(st.sampled_from(("flow", "exclusive"))),
                       collective_latency_us=None)
    group = data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True))
    g, done, s = run(p, op, group, data.draw(st.integers(0, 10**8)), algo,
                     data.draw(st.sampled_from(("expanded", "macro", "auto"))))
    assert sorted(done) == sorted(group) and dag_violations(g) == []
    cost = collective_cost(p, group, op, 10**6, algo)
    assert cost.seconds >= 0 and (len(group) > 1 or cost.seconds == 0)


SUBGROUPS = (st.sampled_from(("ring", "fully-connected", "switch", "nvlink-cluster")), st.sampled_from(cc.OPS),
             st.sampled_from(("auto",) + choice.ALGOS), st.data())
test_any_subgroup_in_any_order = PROPS(given(*SUBGROUPS)(subgroup_property))


def test_subgroup_property_catches_a_gpu_left_without_its_result(monkeypatch):
    # Planted bug: multi-channel rings forget the last GPU's completion sync.
    real = ring_tasks._join

    def drop_last(graph, parts, group, label, attrs):
        out = real(graph, parts, group, label, attrs)
        return {g: t for g, t in out.items() if g != group[-1]}

    monkeypatch.setattr(ring_tasks, "_join", drop_last)
    with pytest.raises(AssertionError):
        PLANTED(given(*SUBGROUPS)(subgroup_property))()


def test_auto_detail_decides_for_a_whole_hierarchical_collective():
    # "auto" expands a collective while it needs at most EXPAND_LIMIT transfers in all: a large
    # hierarchical all-reduce (many small node rings) becomes macro tasks only.
    p = build_platform(64, topology="nvlink-cluster", gpus_per_node=8, network="flow")
    g, _done, s = run(p, "all_reduce", tuple(range(64)), 10**6, "hierarchical", "auto")
    assert "transfer" not in g.kind and "collective" in g.kind
    assert s.makespan == pytest.approx(collective_cost(p, range(64), "all_reduce", 10**6, "hierarchical").seconds,
                                       rel=REL)
    small = build_platform(8, topology="nvlink-cluster", gpus_per_node=4, network="flow")
    g, _done, _s = run(small, "all_reduce", tuple(range(8)), 10**6, "hierarchical", "auto")
    assert "transfer" in g.kind
