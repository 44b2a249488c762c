"""Cluster-file platforms at scale: the link graph written in bulk equals the generic inserts',
and groups renamed to their canonical nodes (:meth:`Platform.canonical_groups`) cost what the
groups cost, so the closed forms are found once for every pipeline stage's alike groups."""

from __future__ import annotations

import random

import networkx as nx

from triosim import build_platform
from triosim.graph.collectives.choice import supported
from triosim.graph.collectives.cost import collective_cost
from triosim.graph.collectives.group_comm import GroupComm
from triosim.graph.collectives.plans import _build_phases, _unit
from triosim.graph.collectives.ring_tasks import make_ring
from triosim.graph.collectives.tree_cost import tree_lower_bound, tree_seconds
from triosim.hardware.cluster import edge_attrs
from triosim.hardware.topology_file import packaged_dir
from triosim.schedule.tasks import TaskGraph

A100 = str(packaged_dir() / "dgx-a100-superpod.yaml")  # 20 nodes a leaf
H100 = str(packaged_dir() / "dgx-h100-superpod.yaml")  # 32 nodes a leaf


def test_bulk_graph_is_the_generic_inserts_graph():
    # 50 nodes of 8 GPUs: 3 scalable units of 20 nodes, the last one partial (a narrower uplink).
    p = build_platform(400, topology_file=A100)
    g = nx.DiGraph()
    g.add_nodes_from(p.graph.nodes(data=True))
    g.add_edges_from((x, y, edge_attrs(x, y, bw, lat, kind, p.link_efficiency))
                     for a, b, bw, lat, kind in _one_way(p) for x, y in ((a, b), (b, a)))
    assert list(g.nodes(data=True)) == list(p.graph.nodes(data=True))
    assert list(g.edges(data=True)) == list(p.graph.edges(data=True))
    assert all(list(g.pred[n].items()) == list(p.graph.pred[n].items()) for n in g)
    # Every edge owns its attributes (a test or a tool may change one link).
    assert len({id(d) for _a, _b, d in p.graph.edges(data=True)}) == p.graph.number_of_edges()
    assert p.link_bandwidth("leaf2r0->spine") < p.link_bandwidth("leaf0r0->spine")


def _one_way(p):
    """(a, b, nominal bandwidth, latency, kind) of each link, as build_cluster lists them."""
    seen = set()
    for a, b, d in p.graph.edges(data=True):
        if (b, a) in seen:
            continue
        seen.add((a, b))
        yield a, b, d.get("nominal_bandwidth", d["bandwidth"]), d["latency"], d["kind"]


def test_canonical_groups_keep_units_rails_and_order():
    p = build_platform(400, topology_file=A100)
    # Nodes 5 and 17 (unit 0), 23 (unit 1), 44 (unit 2, partial): renumbered 0, 1, 20, 40.
    group = (17 * 8 + 3, 5 * 8 + 3, 44 * 8 + 3, 23 * 8 + 6, 5 * 8 + 1)
    assert p.canonical_group(group) == (1 * 8 + 3, 0 * 8 + 3, 40 * 8 + 3, 20 * 8 + 6, 0 * 8 + 1)
    # Renamed together, two groups on one node stay on one node.
    assert p.canonical_groups([(100, 101), (102, 400 - 1)]) == [(4, 5), (6, 40 * 8 + 7)]
    # Platforms without a renaming keep the groups.
    ring = build_platform(16)
    assert ring.canonical_group((3, 9, 4)) == (3, 9, 4)


def test_alike_groups_cost_the_same_on_a_fresh_platform():
    rng = random.Random(7)
    for path, gpus in ((A100, 400), (H100, 1024)):
        for _ in range(6):
            group = tuple(rng.sample(range(gpus), rng.choice((4, 8, 24, 40))))
            canon = build_platform(gpus, topology_file=path).canonical_group(group)
            for op in ("all_reduce", "all_gather"):
                a = collective_cost(build_platform(gpus, topology_file=path), group, op, 3 << 20, algo="auto")
                b = collective_cost(build_platform(gpus, topology_file=path), canon, op, 3 << 20, algo="auto")
                assert (a.seconds, a.algo) == (b.seconds, b.algo)
            fresh = build_platform(gpus, topology_file=path)
            assert tree_seconds(fresh, group, 5e6) == tree_seconds(build_platform(gpus, topology_file=path), canon, 5e6)
            assert tree_lower_bound(fresh, group, 5e6) == tree_lower_bound(
                build_platform(gpus, topology_file=path), canon, 5e6)


def test_every_stage_walks_the_tree_once():
    # tp 8 x pp 4 x dp 32 on 1,024 H100s (2 units), stages a node apart: TP rank 0's
    # data-parallel groups of every stage are alike (one GPU a node, rail 0, across both units).
    p = build_platform(1024, topology_file=H100, collective_algo="tree")
    stages = [tuple(8 * s + 32 * d for d in range(32)) for s in range(4)]
    times = {tree_seconds(p, g, 8e6) for g in stages}
    assert len(times) == 1
    assert sum(1 for key in p._plans if key[0] == "tree") == 1


def test_sharing_is_counted_once_for_alike_stages():
    p = build_platform(512, topology_file=H100)
    comm = GroupComm(TaskGraph(), p, "macro", exact=False)
    # Per stage (16 nodes), 2 data-parallel groups of 64; stages 0, 1 in unit 0, 2, 3 in unit 1.
    for s in range(4):
        groups = [tuple(d + 64 * t + 128 * s for d in range(64)) for t in range(2)]
        assert comm.sharing(groups[0], lambda groups=groups: groups) == _count(p, groups[0], groups)
    assert len(comm._sharing) == 4 and len(comm._sharing_alike) == 2


def test_sharing_of_renamed_groups_is_the_groups_count():
    rng = random.Random(3)
    p = build_platform(400, topology_file=A100)
    shared = 0
    for _ in range(30):
        gpus = rng.sample(range(400), 24)
        groups = [tuple(gpus[i::3]) for i in range(3)]  # 3 parallel groups of 8, across rails and nodes
        comm = GroupComm(TaskGraph(), p, "macro", exact=False)
        got = comm.sharing(groups[1], lambda groups=groups: groups)
        assert got == _count(p, groups[1], groups)
        shared += got > 1
    assert shared  # some of them do share a link


def _count(p, group, groups):
    """How many of ``groups`` cross the busiest link of ``group``'s ring, counted on the groups themselves."""
    count = {}
    for g in groups:
        for link in set(make_ring(p, g).links()):
            count[link] = count.get(link, 0) + 1
    return max(count.get(link, 1) for link in make_ring(p, group).links())


def test_a_plan_renamed_from_the_canonical_group_is_the_groups_own():
    rng = random.Random(11)
    for path, gpus in ((A100, 400), (H100, 1024)):
        p = build_platform(gpus, topology_file=path)
        for _ in range(5):
            group = tuple(rng.sample(range(gpus), rng.choice((6, 16, 32))))
            for op, algo in (("all_reduce", "ring"), ("all_gather", "ring"), ("reduce_scatter", "direct"),
                             ("all_reduce", "hierarchical")):
                if algo == "hierarchical" and not supported(p, group, op, algo):
                    continue
                own = _build_phases(build_platform(gpus, topology_file=path), group, op, 1.0, algo, None)
                renamed, _times = _unit(p, group, op, algo, None)
                assert [list(ph.link_load.items()) for ph in renamed] == [list(ph.link_load.items()) for ph in own]
                assert [(ph.name, ph.steps, ph.step_latency, ph.fill) for ph in renamed] == [
                    (ph.name, ph.steps, ph.step_latency, ph.fill) for ph in own]
    # Groups of a stage alike: the second is renamed from the first's plan, not planned again.
    p = build_platform(1024, topology_file=H100)
    stages = [tuple(8 * s + 32 * d for d in range(32)) for s in range(2)]
    for g in stages:
        _unit(p, g, "all_reduce", "ring", None)
    assert sum(1 for key in p._plans if isinstance(key[0], tuple) and key[1:3] == ("all_reduce", "ring")) == 3
