"""The double binary tree all-reduce (``triosim.graph.collectives.double_tree``): its expanded form (pipelined
chunk transfers) and its macro form take exactly the closed form ``collective_cost(..., "tree")``
under both network models, on switch, fully-connected, nvlink-cluster and the DGX SuperPOD file,
for any group in any order (sizes 1 and 2 included); hand-computed cases; a planted bug."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import triosim.graph.collectives.algorithms as coll
import triosim.graph.collectives.double_tree as dt
from triosim import build_platform
from triosim.graph.collectives.cost import collective_cost
from triosim.schedule.list_scheduler import schedule
from triosim.schedule.network import attach_network
from triosim.schedule.tasks import TaskGraph
from triosim.schedule.validate import dag_violations

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PLANTED = settings(PROPS, max_examples=300, phases=[Phase.generate])  # stops at the first failure
REL = 1e-9


def run_tree(platform, group, nbytes, detail):
    g = TaskGraph()
    done = coll.add_all_reduce(g, platform, group, nbytes, "ar", detail=detail, algo="tree")
    attach_network(g, platform)
    return g, done, schedule(g)


@st.composite
def tree_cases(draw):
    topology = draw(st.sampled_from(("switch", "fully-connected", "nvlink-cluster", "superpod")))
    network = draw(st.sampled_from(("flow", "exclusive")))
    latency = draw(st.sampled_from((None, 0.0, 2.5)))
    if topology == "superpod":
        p = build_platform(draw(st.sampled_from((8, 16))), topology_file="dgx-h100-superpod", network=network,
                           collective_latency_us=latency)
    else:
        per = draw(st.integers(2, 4))
        n = per * draw(st.integers(1, 3)) if topology == "nvlink-cluster" else draw(st.integers(2, 9))
        p = build_platform(n, topology=topology, gpus_per_node=per, ptp_bandwidth_gbps=draw(st.floats(1, 900)),
                           node_bandwidth_gbps=draw(st.floats(1, 100)),
                           link_latency_us=draw(st.sampled_from((0.0, 0.5))), network=network,
                           collective_latency_us=latency)
    group = draw(st.permutations(range(p.num_gpus)))[:draw(st.integers(1, p.num_gpus))]
    nbytes = draw(st.one_of(st.integers(0, 2**12), st.integers(0, 2**28)))
    return p, tuple(group), nbytes, draw(st.sampled_from(("expanded", "macro")))


def tree_property(case):
    p, group, nbytes, detail = case
    cost = collective_cost(p, group, "all_reduce", nbytes, algo="tree")
    g, done, s = run_tree(p, group, nbytes, detail)
    assert sorted(done) == sorted(group) and dag_violations(g) == []
    assert s.makespan == pytest.approx(cost.seconds, rel=REL, abs=1e-18), (p.topology, p.network, s.makespan)
    assert max(s.end[t] for t in done.values()) == pytest.approx(cost.seconds, rel=REL, abs=1e-18)


test_tree_takes_its_closed_form = PROPS(given(tree_cases())(tree_property))


def test_tree_property_catches_transfers_sharing_a_link(monkeypatch):
    # Planted bug: the plan lets every link carry many transfers at once, so its longest path
    # misses the links' queueing that both network models then impose.
    monkeypatch.setattr(dt, "_lanes", lambda platform, routes: {x: 64 for r in routes for x in r})
    with pytest.raises(AssertionError):
        PLANTED(given(tree_cases())(tree_property))()


def test_two_gpus_by_hand():
    # Two GPUs, 10 GB/s each way, link latency α, λ: each tree sends its half up, then down;
    # the two trees use the two directions at once. One chunk: 2(α + λ + S/2/W).
    p = build_platform(2, topology="fully-connected", ptp_bandwidth_gbps=10, link_latency_us=1.0,
                       collective_latency_us=3.0)
    s = 1000
    assert collective_cost(p, (0, 1), "all_reduce", s, "tree").seconds == pytest.approx(
        2 * (1e-6 + 3e-6 + s / 2 / 10e9), rel=1e-12)
    # 8 MiB: k = 8 chunks of S/16 per tree. Each direction's link carries one tree's half going
    # up and the other's coming down: 16 chunks back to back, each paying α, the two first
    # chunks also λ: 2λ + 16α + S/W.
    s = 8 << 20
    assert dt.chunks_per_tree(2, s) == 8
    want = 2 * 3e-6 + 16 * 1e-6 + s / 10e9
    assert collective_cost(p, (0, 1), "all_reduce", s, "tree").seconds == pytest.approx(want, rel=1e-12)
    for network in ("flow", "exclusive"):
        _g, _done, sched = run_tree(p.with_network(network=network), (0, 1), s, "expanded")
        assert sched.makespan == pytest.approx(want, rel=1e-12)


def test_small_messages_pay_two_latencies_per_tree_level():
    # One chunk, no bytes: the pipeline's start-up is 2·D hops of λ, D = ⌊log2 N⌋, where every
    # tree edge has its own link; on a switch a GPU's port takes its children one after another.
    for n in (2, 3, 4, 7, 8, 16, 64):
        fc = build_platform(n, topology="fully-connected", collective_latency_us=5.0)
        sw = build_platform(n, topology="switch", collective_latency_us=5.0)
        depth = n.bit_length() - 1
        assert collective_cost(fc, range(n), "all_reduce", 0, "tree").seconds == pytest.approx(2 * depth * 5e-6)
        assert collective_cost(sw, range(n), "all_reduce", 0, "tree").seconds >= 2 * depth * 5e-6 * (1 - 1e-12)


def test_chunk_count_follows_the_payload_and_the_group():
    assert dt.chunks_per_tree(8, 0) == 1
    assert dt.chunks_per_tree(8, 2 * dt.CHUNK_BYTES) == 1
    assert dt.chunks_per_tree(8, 2 * dt.CHUNK_BYTES + 1) == 2
    assert dt.chunks_per_tree(8, 10**12) == dt.MAX_CHUNKS
    assert dt.chunks_per_tree(1024, 10**12) * 4 * 1023 <= dt.TRANSFER_BUDGET


def test_wide_spine_links_carry_several_transfers_at_once():
    # 512 GPUs = two scalable units: tree edges between them share the leaves' uplinks, 32 times
    # a NIC's bandwidth. The flow model lets 32 transfers cross one at once, the exclusive model
    # one; the expanded tree takes the closed form of either.
    times = {}
    for network in ("flow", "exclusive"):
        p = build_platform(512, topology_file="dgx-h100-superpod", network=network, collective_latency_us=None)
        lanes = dt._lanes(p, [p.route("gpu0", "gpu511")])
        assert max(lanes.values()) == (32 if network == "flow" else 1)
        cost = collective_cost(p, range(512), "all_reduce", 4096, "tree")
        _g, _done, s = run_tree(p, tuple(range(512)), 4096, "expanded")
        assert s.makespan == pytest.approx(cost.seconds, rel=REL)
        times[network] = cost.seconds
    assert times["flow"] < times["exclusive"]


@pytest.mark.parametrize("network", ["flow", "exclusive"])
def test_routes_to_another_rail_on_the_superpod(network):
    # The case that found the exclusive model's one lane per link: NVLink legs of PXN routes.
    p = build_platform(16, topology_file="dgx-h100-superpod", network=network, collective_latency_us=None)
    cost = collective_cost(p, (0, 8, 9, 3), "all_reduce", 1048577, "tree")
    _g, _done, s = run_tree(p, (0, 8, 9, 3), 1048577, "expanded")
    assert s.makespan == pytest.approx(cost.seconds, rel=REL)
