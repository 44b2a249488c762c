"""Closed form of the ``tree`` algorithm: NCCL's double binary tree all-reduce, as one phase.

Binary trees built over nodes with a chain through each node (two per channel; two over the
GPUs of a flat group), each carrying its share of the payload in chunks, reduce up and
broadcast down, pipelined (:mod:`triosim.graph.collectives.double_tree`). The pipeline's time is not linear in
the payload (the chunk count and the critical path change with it), so it is the longest path
of the pipeline, kept per payload size, rather than a formula scaled from one byte.
"""

from __future__ import annotations

from collections.abc import Callable

from ...hardware.platform import Platform, gpu_node
from . import double_tree
from .phases import Phase, add_load
from .protocols import NCCL_PROTOCOL_STEP_LATENCY_US, base_latency_s, protocol, step_latency_s
from .ring_tree_links import UniformRing, arc_counts, arc_load, repeated_sums, uniform_ring
from .tree_shapes import tree_shapes


def tree_edges(platform: Platform, group: tuple[int, ...]) -> list[list[tuple[int, int]]]:
    """(child, parent) edges of every tree the all-reduce runs over ``group``
    (:func:`~triosim.graph.collectives.tree_shapes.tree_shapes`)."""
    return [shape.edges() for shape in tree_shapes(platform, group)]


def tree_link_load(platform: Platform, group: tuple[int, ...], nbytes: float) -> dict[str, float]:
    """Bytes per directed link of the tree all-reduce: every edge of each of the T trees carries
    S/T up and S/T down (found for one byte once per group, then scaled)."""
    key = ("tree-load", group)
    unit = platform._plans.get(key)
    if unit is None:
        unit = {}
        edges = tree_edges(platform, group)
        share = 1.0 / len(edges)
        ring = uniform_ring(platform)
        if ring is not None:  # by arcs: 4,096 GPUs' routes name 1.6e7 links
            unit = arc_load(ring, _pairs(edges), share)
        else:
            for tree in edges:
                for child, parent in tree:
                    add_load(unit, platform.route(gpu_node(child), gpu_node(parent)), share)
                    add_load(unit, platform.route(gpu_node(parent), gpu_node(child)), share)
        platform._plans[key] = unit
    return {x: b * nbytes for x, b in unit.items()}


def tree_port_bound(platform: Platform, group: tuple[int, ...], nbytes: float) -> float:
    """A time the tree all-reduce cannot beat, without a route: the bytes each GPU must send
    (receive) over the summed bandwidth of its outgoing (incoming) GPU links, the largest.
    Linear in ``nbytes``: found once per group for one byte (a run asks once per op)."""
    return _per_byte(platform, "tree-port-bound", _port_bound, group) * nbytes


def _per_byte(platform: Platform, name: str, bound: Callable[[Platform, tuple[int, ...], float], float],
              group: tuple[int, ...]) -> float:
    """``bound`` for one byte, found once per canonical group (the bounds are linear in the
    payload and depend only on the links of the group's routes: :meth:`Platform.canonical_group`)."""
    group = platform.canonical_group(group)
    key = (name, group)
    unit = platform._plans.get(key)
    if unit is None:
        unit = platform._plans[key] = bound(platform, group, 1.0)
    return unit


def _port_bound(platform: Platform, group: tuple[int, ...], nbytes: float) -> float:
    out: dict[int, float] = {}
    edges = tree_edges(platform, group)
    share = nbytes / len(edges)
    for tree in edges:
        for child, parent in tree:  # S/T up from the child and S/T down from the parent
            out[child] = out.get(child, 0.0) + share
            out[parent] = out.get(parent, 0.0) + share
    succ, pred = platform.graph.succ, platform.graph.pred  # a GPU's out- and in-edges, in the graph's order
    worst = 0.0
    for gpu, sent in out.items():  # every edge moves as much in as out: ins mirror outs
        name = gpu_node(gpu)
        cap_out = sum(a["bandwidth"] for a in succ[name].values() if a.get("kind") != "pcie")
        cap_in = sum(a["bandwidth"] for a in pred[name].values() if a.get("kind") != "pcie")
        worst = max(worst, sent / cap_out, sent / cap_in)
    return worst


def tree_volume_bound(platform: Platform, group: tuple[int, ...], nbytes: float) -> float:
    """On the ``ring`` topology (links only between ring neighbours, so a route's hop count is
    the cyclic distance in ring order), a time the tree all-reduce cannot beat without a route:
    every byte crosses at least that many links, and all GPU links together carry at most their
    summed bandwidth. 0 on other topologies. Linear in ``nbytes``: found once per group."""
    return _per_byte(platform, "tree-volume-bound", _volume_bound, group) * nbytes


def _volume_bound(platform: Platform, group: tuple[int, ...], nbytes: float) -> float:
    if platform.topology != "ring" or platform.router is not None or platform.num_gpus < 2:
        return 0.0
    n = platform.num_gpus
    where = {g: i for i, g in enumerate(platform.ring)}
    edges = tree_edges(platform, group)
    share = nbytes / len(edges)
    volume = 0.0
    for tree in edges:
        for child, parent in tree:
            d = abs(where[child] - where[parent])
            volume += 2 * share * min(d, n - d)  # up and down
    capacity = sum(a["bandwidth"] for _x, _y, a in platform.graph.edges(data=True) if a.get("kind") != "pcie")
    return volume / capacity


def tree_latency_bound(platform: Platform, group: tuple[int, ...]) -> float:
    """A time the tree all-reduce cannot beat, without a route: its first chunk climbs from the
    deepest leaf to the root and back down, a step of at least the smallest λ each, after the
    call's base latency."""
    lam = platform.collective_latency_us
    if lam is not None:
        lam *= 1e-6
    else:
        table = NCCL_PROTOCOL_STEP_LATENCY_US[protocol(platform)]
        lam = min(v for (family, _kind), v in table.items() if family == "tree") * 1e-6
    key = ("tree-depth", group)
    depth = platform._plans.get(key)
    if depth is None:
        depth = platform._plans[key] = max(max(shape.height_depth()[1]) for shape in tree_shapes(platform, group))
    return base_latency_s(platform, "tree") + 2 * depth * lam


def _link_bound(platform: Platform, group: tuple[int, ...], nbytes: float) -> float:
    """The busiest link's bytes at its bandwidth; the per-byte load is kept per group (a DDP
    run asks once per bucket), per canonical group."""
    group = platform.canonical_group(group)
    key = ("tree-link-bound", group, platform.collective_protocol)
    per_byte = platform._plans.get(key)
    if per_byte is None and (ring := uniform_ring(platform)) is not None:
        per_byte = platform._plans[key] = _ring_link_bound(platform, ring, group)
    if per_byte is None:
        load = tree_link_load(platform, group, 1.0)
        per_byte = platform._plans[key] = max((b / platform.link_bandwidth(x) for x, b in load.items()), default=0.0)
    return per_byte * nbytes


def _ring_link_bound(platform: Platform, ring: UniformRing, group: tuple[int, ...]) -> float:
    """:func:`_link_bound`'s per-byte load on a ring of alike links: a link's load is the
    per-tree share added once per route crossing it (:func:`tree_link_load` adds it route by
    route, the same sum), at the one bandwidth."""
    edges = tree_edges(platform, group)
    counts = {c for direction in arc_counts(ring, _pairs(edges)) for c in direction if c}
    if not counts:
        return 0.0
    sums = repeated_sums(1.0 / len(edges), max(counts))
    return max(sums[c] * 1.0 / ring.bandwidth for c in counts)


def _pairs(edges: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """(source, destination) of each transfer route of the trees, in the order the walk takes
    them: tree by tree, edge by edge, up then down."""
    return [pair for tree in edges for child, parent in tree for pair in ((child, parent), (parent, child))]


def tree_lower_bound(platform: Platform, group: tuple[int, ...], nbytes: float, beat: float | None = None) -> float:
    """A time the tree all-reduce cannot beat (``auto`` skips the pipeline's walk when this
    already loses to another algorithm, :mod:`~triosim.graph.collectives.choice`): the bounds
    that need no route (:func:`tree_port_bound`, :func:`tree_volume_bound`,
    :func:`tree_latency_bound`) and, unless they
    already reach ``beat``, the busiest link's bytes at its bandwidth (a link never carries
    more than its bandwidth, whatever the pipeline's order)."""
    bound = max(tree_port_bound(platform, group, nbytes), tree_volume_bound(platform, group, nbytes),
                tree_latency_bound(platform, group))
    if beat is not None and bound >= beat:
        return bound
    return max(bound, _link_bound(platform, group, nbytes))


def _tree_step_latency(platform: Platform) -> Callable[[tuple[str, ...]], float]:
    """λ of a tree step over a route."""
    return lambda route: step_latency_s(platform, "tree", route)


def tree_plan(platform: Platform, group: tuple[int, ...], nbytes: float) -> double_tree.TreePlan:
    """The pipelined transfers of the tree all-reduce (the expanded form's tasks)."""
    return double_tree.build_plan(platform, group, nbytes, _tree_step_latency(platform),
                                  base_latency_s(platform, "tree"))


def tree_seconds(platform: Platform, group: tuple[int, ...], nbytes: float) -> float:
    """The tree all-reduce's time alone: the longest path of its pipeline, per payload size,
    walked once per canonical group (the walk depends only on the links of the trees' routes:
    the data-parallel groups of every pipeline stage of a cluster are alike)."""
    group = platform.canonical_group(group)
    key = ("tree", group, float(nbytes), platform.collective_latency_us)
    hit = platform._plans.get(key)
    if hit is None:
        hit = platform._plans[key] = double_tree.plan_seconds(
            platform, group, nbytes, _tree_step_latency(platform), base_latency_s(platform, "tree"))
    return hit


def tree_phases(platform: Platform, group: tuple[int, ...], nbytes: float) -> list[Phase]:
    """Double binary tree all-reduce as one phase: its links' bytes and its pipeline's time.

    The phase's latency is what the time has beyond its busiest link's bytes, so a macro task
    under the flow model moves those bytes at the busiest link's full bandwidth when alone.
    """
    seconds = tree_seconds(platform, group, nbytes)
    load = tree_link_load(platform, group, nbytes)
    busiest = max((b / platform.link_bandwidth(name) for name, b in load.items()), default=0.0)
    return [Phase("tree", 1, max(0.0, seconds - busiest), load, fixed_seconds=seconds)]
