"""The ``hierarchical`` algorithm as a task-DAG fragment (closed form:
:mod:`triosim.graph.collectives.hierarchical_cost`): multi-channel ring collectives inside
every node and across every rail, one level after the other; a GPU starts a level once it is
done with the previous one.
"""

from __future__ import annotations

from typing import Any

from ...hardware.platform import Platform
from ...schedule.tasks import TaskGraph
from . import fragment, ring_tasks
from .hierarchical_cost import hierarchical_levels, sub_root


def hierarchical(graph: TaskGraph, platform: Platform, group: tuple[int, ...], op: str, nbytes: int, label: str,
                 pre: dict[int, list[int]], detail: str, attrs: dict[str, Any], base: float,
                 root: int | None) -> dict[int, int]:
    """Ring collectives inside every node and across every rail, one level after the other."""
    r = group[0] if root is None else root
    nodes, levels = hierarchical_levels(platform, group, op, r)
    per = len(nodes[0])
    done = {g: list(pre[g]) for g in group}
    # "auto" decides for the whole collective (all its sub-rings together), not per sub-ring.
    detail = fragment.resolve_detail(detail, sum(ring_tasks.ring_transfers(platform, tuple(g), sub)
                                                 for sub, _lv, _dv, groups in levels for g in groups))
    for i, (sub, level, divided, groups) in enumerate(levels):
        size = nbytes // per if divided else nbytes
        for sg in groups:
            sub_pre = {g: done[g] for g in sg}
            out = ring_tasks.multi_ring(graph, platform, tuple(sg), sub, size, f"{label} {level}", sub_pre, detail,
                                        {**attrs, "level": level}, base if i == 0 else 0.0,
                                        sub_root(nodes, r, sg) if sub == "broadcast" else None,
                                        nominal=nbytes / per if divided else float(nbytes))
            for g, t in out.items():
                done[g] = [t]
    return fragment.done_syncs(graph, label, attrs, done)
