"""Closed form of the ``tree`` algorithm: NCCL's double binary tree all-reduce, as one phase.

Two binary trees, each carrying half the payload in chunks, reduce up and broadcast down,
pipelined (:mod:`triosim.graph.collectives.double_tree`). The pipeline's time is not linear in
the payload (the chunk count and the critical path change with it), so it is the longest path
of the pipeline, kept per payload size, rather than a formula scaled from one byte.
"""

from __future__ import annotations

from collections.abc import Callable

from ...hardware.platform import Platform, gpu_node
from . import double_tree
from .phases import Phase, add_load
from .protocols import base_latency_s, step_latency_s


def tree_edges(order: tuple[int, ...]) -> list[list[tuple[int, int]]]:
    """NCCL-style double binary tree: (child, parent) edges of the two trees over ``order``
    (:func:`~triosim.graph.collectives.double_tree.tree_orders`: the parent of position i is
    (i−1)//2, the second tree over the reversed order)."""
    n = len(order)
    return [[(seq[i], seq[(i - 1) // 2]) for i in range(1, n)] for seq in double_tree.tree_orders(order)]


def tree_link_load(platform: Platform, group: tuple[int, ...], nbytes: float) -> dict[str, float]:
    """Bytes per directed link of a double binary tree all-reduce: every edge carries S/2 up and S/2 down."""
    load: dict[str, float] = {}
    for edges in tree_edges(group):
        for child, parent in edges:
            add_load(load, platform.route(gpu_node(child), gpu_node(parent)), nbytes / 2)
            add_load(load, platform.route(gpu_node(parent), gpu_node(child)), nbytes / 2)
    return load


def _tree_step_latency(platform: Platform) -> Callable[[tuple[str, ...]], float]:
    """λ of a tree step over a route."""
    return lambda route: step_latency_s(platform, "tree", route)


def tree_plan(platform: Platform, group: tuple[int, ...], nbytes: float) -> double_tree.TreePlan:
    """The pipelined transfers of the tree all-reduce (the expanded form's tasks)."""
    return double_tree.build_plan(platform, group, nbytes, _tree_step_latency(platform),
                                  base_latency_s(platform, "tree"))


def tree_seconds(platform: Platform, group: tuple[int, ...], nbytes: float) -> float:
    """The tree all-reduce's time alone: the longest path of its pipeline, per payload size."""
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
