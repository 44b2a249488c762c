"""Closed form of the ``hierarchical`` algorithm for node-structured groups.

A group spanning ≥ 2 nodes with the same L ≥ 2 GPUs on each runs ring collectives level by
level: all-reduce is a reduce-scatter inside each node, an all-reduce of 1/L across nodes over
each local rank's rail, and an all-gather inside each node; reduce-scatter and all-gather are
the halves of that; broadcast goes along the root's rail, then inside every node. The sub-rings
of one level run at once on disjoint groups, so each level is one phase.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...hardware.platform import Platform
from .groups import node_groups, spans_even_nodes
from .phases import Phase, summed_load
from .ring_cost import ring_phases

# One level of a hierarchical collective: (sub-operation, "node" or "rail", payload divided by
# L, the sub-groups it runs on).
Level = tuple[str, str, bool, list[list[int]]]


def hierarchical_split(platform: Platform, group: tuple[int, ...]) -> tuple[list[list[int]], list[list[int]]] | None:
    """(node groups, rail groups) when the group spans ≥ 2 nodes with the same ≥ 2 GPUs each."""
    nodes = node_groups(platform, group)
    if not spans_even_nodes(nodes):
        return None
    rails = [[x[i] for x in nodes] for i in range(len(nodes[0]))]
    return nodes, rails


def sub_root(nodes: list[list[int]], root: int, sub_group: Sequence[int]) -> int:
    """A broadcast's root inside one sub-group: the root itself, or the GPU on the root's rail."""
    if root in sub_group:
        return root
    local = next(x.index(root) for x in nodes if root in x)
    return next(x[local] for x in nodes if x[local] in sub_group)


def hierarchical_steps(op: str) -> list[tuple[str, str, bool]]:
    """(sub-operation, level, payload divided by L) of each hierarchical phase."""
    return {
        "all_reduce": [("reduce_scatter", "node", False), ("all_reduce", "rail", True),
                       ("all_gather", "node", False)],
        "reduce_scatter": [("reduce_scatter", "node", False), ("reduce_scatter", "rail", True)],
        "all_gather": [("all_gather", "rail", True), ("all_gather", "node", False)],
        "broadcast": [("broadcast", "rail", False), ("broadcast", "node", False)],
    }[op]


def hierarchical_levels(platform: Platform, group: tuple[int, ...], op: str,
                        root: int) -> tuple[list[list[int]], list[Level]]:
    """(node groups, the levels of ``op`` with their sub-groups): a broadcast crosses nodes only
    on the root's rail."""
    split = hierarchical_split(platform, group)
    assert split is not None
    nodes, rails = split
    levels = []
    for sub, level, divided in hierarchical_steps(op):
        groups = nodes if level == "node" else rails
        if op == "broadcast" and level == "rail":
            groups = [g for g in rails if root in g]
        levels.append((sub, level, divided, groups))
    return nodes, levels


def _merge(phases: list[Phase], name: str) -> Phase:
    """Concurrent phases of the same shape on disjoint groups, as one phase."""
    return Phase(name, max(p.steps for p in phases), max(p.step_latency for p in phases), summed_load(phases),
                 fill=max(p.fill for p in phases))


def hierarchical_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float,
                        root: int | None = None) -> list[Phase]:
    """The hierarchical algorithm as phases: one per level (two for a level's all-reduce)."""
    r = group[0] if root is None else root
    nodes, levels = hierarchical_levels(platform, group, op, r)
    per = len(nodes[0])
    out = []
    for sub, level, divided, groups in levels:
        size = nbytes / per if divided else nbytes
        parts = []
        for g in groups:
            parts.extend(ring_phases(platform, tuple(g), sub, size,
                                     sub_root(nodes, r, g) if sub == "broadcast" else None))
        if sub == "all_reduce":  # two ring phases per group: merge rs with rs and ag with ag
            out.append(_merge(parts[0::2], f"{level} rs"))
            out.append(_merge(parts[1::2], f"{level} ag"))
        else:
            out.append(_merge(parts, f"{level} {sub}"))
    return out
