"""A collective's group of GPUs: checked against the platform, and split by node.

Every algorithm starts from the group's order (a tuple of GPU ids, no repeats); the
node-structured ones (the multi-node rings, the hierarchical algorithm, the protocols'
bandwidth shares) also need to know which members share a node.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...hardware.platform import Platform, gpu_node


def check_group(platform: Platform, group: Sequence[int]) -> tuple[int, ...]:
    """``group`` as a tuple of GPU ids, after checking it has no repeats and every GPU exists
    (a group checked before on the platform is not checked again: a case-3 run checks its one
    group of 4,096 GPUs per collective)."""
    if isinstance(group, tuple):
        # The checked tuple of ints itself: a group equal to it (numpy integers, say) converts to it.
        hit = platform._plans.get(("checked", group))
        if hit is not None:
            return hit
    order = tuple(int(g) for g in group)
    if len(set(order)) != len(order):
        raise ValueError(f"collective group has repeated GPUs: {order}")
    for g in order:
        if not 0 <= g < platform.num_gpus:
            raise ValueError(f"GPU {g} is not on the platform ({platform.num_gpus} GPUs)")
    platform._plans[("checked", order)] = order
    return order


def node_groups(platform: Platform, group: tuple[int, ...]) -> list[list[int]] | None:
    """The group split by node (in order of first appearance), or None if the platform is flat."""
    if platform.node_of is None:
        return None
    nodes: dict[int, list[int]] = {}
    for g in group:
        nodes.setdefault(platform.node_of[g], []).append(g)
    return list(nodes.values())


def spans_even_nodes(nodes: list[list[int]] | None) -> bool:
    """Whether :func:`node_groups` found ≥ 2 nodes holding the same ≥ 2 GPUs of the group each:
    the shape whose GPUs pair up across nodes by local rank (rails)."""
    return not (nodes is None or len(nodes) < 2 or len({len(x) for x in nodes}) != 1 or len(nodes[0]) < 2)


def sharp_switch(platform: Platform, group: tuple[int, ...]) -> str | None:
    """The switch every GPU of ``group`` is linked to that offers NVLink SHARP (a
    ``sharp_efficiency`` on the switch node, set by a topology file's ``nvlink: {sharp: true}``),
    or None: then NVLS cannot run on the group."""
    graph = platform.graph
    common: set[str] | None = None
    for g in group:
        hubs = {s for s in graph.successors(gpu_node(g)) if graph.nodes[s].get("sharp_efficiency") is not None}
        common = hubs if common is None else common & hubs
        if not common:
            return None
    return min(common) if common else None
