"""The ``tree`` algorithm (NCCL's double binary tree all-reduce) as a task-DAG fragment: the
pipelined chunk transfers of :mod:`triosim.graph.collectives.double_tree`, each after the data
it needs and after the earlier users of its links, or one macro task for the plan's longest
path (closed form: :mod:`triosim.graph.collectives.tree_cost`).
"""

from __future__ import annotations

from typing import Any

from ...hardware.platform import Platform, gpu_node
from ...schedule.tasks import TaskGraph
from . import double_tree, fragment, plans
from .tree_cost import tree_plan
from .tree_shapes import tree_shapes


def tree(graph: TaskGraph, platform: Platform, group: tuple[int, ...], nbytes: int, label: str,
         pre: dict[int, list[int]], detail: str, attrs: dict[str, Any]) -> dict[int, int]:
    """Double binary tree all-reduce of ``nbytes`` on ``group``, expanded or macro."""
    n = len(group)
    trees = len(tree_shapes(platform, group))
    k = double_tree.chunks_per_tree(n, nbytes, trees)
    if fragment.resolve_detail(detail, 2 * trees * (n - 1) * k) == "macro":
        phases = plans.plan(platform, group, "all_reduce", nbytes, "tree")
        return fragment.phase_macros(graph, platform, group, "all_reduce", nbytes, phases, label, pre, attrs)
    plan = tree_plan(platform, group, nbytes)
    tasks: list[int] = []
    finals: dict[int, list[int]] = {g: [] for g in group}
    for x in range(len(plan)):
        src, dst, c = plan.src[x], plan.dst[x], plan.chunk[x]
        data = [tasks[p] for p in plan.data_preds[x]]
        if c == 0:
            data.extend(pre[src])  # a GPU's first send of a tree waits for its own predecessors
        phase = "up" if plan.up[x] else "down"
        if plan.delay[x] > 0:  # λ before the bytes, holding no link (double_tree's module doc)
            data = [graph.add_task("transfer", f"{label} tree{plan.tree[x]} {phase}{c} latency gpu{src}->gpu{dst}",
                                   plan.delay[x], (), (src, dst), 0, after=list(dict.fromkeys(data)),
                                   latency_s=plan.delay[x], collective=label, phase=phase, chunk=c,
                                   tree=plan.tree[x], **attrs)]
        deps = data + [tasks[p] for p in plan.link_preds[x]]
        t = graph.add_task(
            "transfer", f"{label} tree{plan.tree[x]} {phase}{c} gpu{src}->gpu{dst}", plan.duration[x], plan.route[x],
            (src, dst), plan.nbytes[x], after=list(dict.fromkeys(deps)), latency_s=plan.latency[x],
            src=gpu_node(src), dst=gpu_node(dst), collective=label, phase=phase, chunk=c, tree=plan.tree[x], **attrs,
        )
        tasks.append(t)
        if c == plan.k - 1:  # a GPU is done when its last chunks are sent and received
            finals[src].append(t)
            finals[dst].append(t)
    return fragment.done_syncs(graph, label, attrs, finals)
