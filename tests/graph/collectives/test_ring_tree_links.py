"""The tree all-reduce's bookkeeping by arcs on a ring of alike links
(``triosim.graph.collectives.ring_tree_links``) equals the walk over every route's link names:
the links each route crosses and its time, the pipeline's time (the walk that keeps a plan
always goes route by route), every link's load (its keys in the walk's order) and the busiest
link's per-byte load, bit for bit, on random rings
and on the all-reduces that resnet50's ``-case 3`` asks for."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triosim.graph.collectives import double_tree, ring_tree_links, tree_cost
from triosim.graph.collectives.phases import add_load
from triosim.graph.collectives.ring_tree_links import arc_counts, arc_load, uniform_ring
from triosim.hardware.platform import gpu_node, link_name
from triosim.hardware.presets import build_platform

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _ring(n: int, latency_us: float, **kw):
    return build_platform(n, link_latency_us=latency_us, **kw)


@st.composite
def rings_and_pairs(draw):
    n = draw(st.integers(3, 24))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=40))
    return n, draw(st.sampled_from((0.0, 0.37, 1.1))), pairs


def check_arcs(n: int, latency_us: float, pairs: list[tuple[int, int]]) -> None:
    p = _ring(n, latency_us)
    ring = uniform_ring(p)
    assert ring is not None
    walked: dict[str, int] = {}
    for src, dst in pairs:
        route = p.route(gpu_node(src), gpu_node(dst))
        assert ring.hops(src, dst) == len(route)
        for nbytes in (0.0, 3.0, 524288.0):
            assert ring.route_time(len(route), nbytes) == p.route_time(route, nbytes)
        for x in route:
            walked[x] = walked.get(x, 0) + 1
    for share in (1.0, 0.5, 1 / 3):
        load: dict[str, float] = {}
        for src, dst in pairs:
            add_load(load, p.route(gpu_node(src), gpu_node(dst)), share)
        assert list(arc_load(ring, pairs, share).items()) == list(load.items())  # same keys, order, sums
    up, down = arc_counts(ring, pairs)
    by_arcs = {}
    for j in range(n):
        for counts, to in ((up, (j + 1) % n), (down, (j - 1) % n)):
            if counts[j]:
                by_arcs[link_name(gpu_node(j), gpu_node(to))] = counts[j]
    assert by_arcs == walked


@PROPS
@given(rings_and_pairs())
def test_arcs_are_the_routes_links(case):
    check_arcs(*case)


@st.composite
def tree_runs(draw):
    n = draw(st.integers(3, 20))
    size = draw(st.integers(2, n))
    group = tuple(draw(st.permutations(range(n)))[:size])
    network = draw(st.sampled_from(("flow", "exclusive")))
    p = _ring(n, draw(st.sampled_from((0.0, 0.37, 1.1))), network=network,
              collective_latency_us=draw(st.sampled_from((None, 0.0, 2.5))))
    nbytes = draw(st.one_of(st.integers(0, 2**12), st.integers(0, 2**27)))
    return p, group, float(nbytes)


def check_tree(p, group: tuple[int, ...], nbytes: float) -> None:
    assert uniform_ring(p) is not None
    by_arcs = double_tree.plan_seconds(p, group, nbytes, tree_cost._tree_step_latency(p),
                                       tree_cost.base_latency_s(p, "tree"))
    walked = double_tree.longest_path(tree_cost.tree_plan(p, group, nbytes))  # a plan walks the routes
    assert by_arcs == walked
    edges = tree_cost.tree_edges(p, group)
    load: dict[str, float] = {}
    for tree in edges:
        for child, parent in tree:
            add_load(load, p.route(gpu_node(child), gpu_node(parent)), 1.0 / len(edges))
            add_load(load, p.route(gpu_node(parent), gpu_node(child)), 1.0 / len(edges))
    assert list(tree_cost.tree_link_load(p, group, 1.0).items()) == list(load.items())
    assert tree_cost._link_bound(p, group, 1.0) == max(b / p.link_bandwidth(x) for x, b in load.items())


@PROPS
@given(tree_runs())
def test_tree_time_and_link_bound_by_arcs_equal_the_walk(case):
    check_tree(*case)


def test_two_gpus_and_unlike_links_walk_the_routes():
    assert uniform_ring(_ring(2, 0.5)) is None  # one link each way: up and down are the same link
    assert uniform_ring(build_platform(4, topology="mesh", num_rows=2, num_cols=2)) is None
    p = _ring(6, 0.5)
    p.graph.edges["gpu2", "gpu3"]["bandwidth"] *= 2
    assert uniform_ring(p) is None


def _case3_tree_calls(trace_dir, n: int) -> list[tuple]:
    """(platform, group, payload) of every tree time and link bound ``triosim run -case 3`` on
    ``n`` GPUs asks for."""
    from triosim.cli import main

    seen: list[tuple] = []
    walk, bound = double_tree.plan_seconds, tree_cost._link_bound

    def spy_walk(platform, group, nbytes, step_latency, base):
        seen.append((platform, group, nbytes))
        return walk(platform, group, nbytes, step_latency, base)

    def spy_bound(platform, group, nbytes):
        seen.append((platform, group, nbytes))
        return bound(platform, group, nbytes)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(double_tree, "plan_seconds", spy_walk)
        mp.setattr(tree_cost, "_link_bound", spy_bound)
        assert main(["run", "-trace-dir", str(trace_dir), "-case", "3", "-GPUnumber", str(n), "-q"]) == 0
    return seen


@pytest.mark.parametrize("n", [64, 256])
def test_case3_resnet50_trees_by_arcs_equal_the_walk(resnet50_dir, n, capsys):
    calls = _case3_tree_calls(resnet50_dir, n)
    assert calls  # the run does ask for the tree's time
    for platform, group, nbytes in calls:
        assert platform.num_gpus == n and uniform_ring(platform) is not None
        check_tree(platform.with_network(), group, float(nbytes))  # a copy: none of the run's cached plans


ARCS_CASE = (7, 0.37, [(0, 3), (5, 1), (2, 6), (4, 4), (6, 1)])


def _tree_case():
    return _ring(9, 0.37, network="flow", collective_latency_us=None), (0, 4, 8, 2, 6, 1), 3e7


def _plant(mp, bug: str) -> None:
    spans, counts = ring_tree_links.UniformRing.spans, ring_tree_links.arc_counts
    if bug == "arc-not-wrapped":  # an arc past GPU n−1 stops there instead of going on from 0
        mp.setattr(ring_tree_links.UniformRing, "spans", lambda self, s, d: spans(self, s, d)[:1])
    elif bug == "latency-once":  # a route pays one link's latency, not one per hop
        mp.setattr(ring_tree_links.UniformRing, "route_latency", lambda self, hops: self.latency if hops else 0.0)
    elif bug == "routes-dropped":  # the link load misses the down routes (every second pair)
        mp.setattr(tree_cost, "arc_counts", lambda ring, pairs: counts(ring, pairs[::2]))


@pytest.mark.parametrize("bug, check", [("arc-not-wrapped", "arcs"), ("arc-not-wrapped", "tree"),
                                        ("latency-once", "arcs"), ("latency-once", "tree"),
                                        ("routes-dropped", "tree")])
def test_planted_bugs_are_caught(bug, check):
    with pytest.MonkeyPatch.context() as mp:
        _plant(mp, bug)
        with pytest.raises(AssertionError):
            check_arcs(*ARCS_CASE) if check == "arcs" else check_tree(*_tree_case())


def test_planted_cases_pass_unplanted():
    check_arcs(*ARCS_CASE)
    check_tree(*_tree_case())
