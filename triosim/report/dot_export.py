"""The task DAG as Graphviz DOT: colour by task kind, one cluster per GPU (or pipeline stage),
every task or groups of them (:mod:`triosim.report.collapse`, :mod:`triosim.report.repeats`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..schedule.tasks import KINDS, TaskGraph
from .collapse import Collapsed, Group, collapse, parameter_ops
from .repeats import repeats_picture

if TYPE_CHECKING:  # imported where a picture is drawn: a run that draws none skips it
    import graphviz

KIND_COLOURS = {
    "compute": "#9ecae1",
    "memcpy": "#fdae6b",
    "transfer": "#fc9272",
    "collective": "#fed976",
    "sync": "#d9d9d9",
}


def human_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _node_text(graph: TaskGraph, t: int) -> str:
    dur = graph.duration[t] * 1e3
    text = f"{graph.label[t]}\\n{graph.kind[t]} {dur:.3f} ms"
    if graph.nbytes[t]:
        text += f"\\n{human_bytes(graph.nbytes[t])}"
    return text


def _short_label(label: str) -> str:
    """``conv2d#1 mb0 gpu0`` → ``conv2d#1`` (the group's node already says which GPU and micro-batch)."""
    words = [w for w in label.split() if not (w.startswith(("gpu", "mb")) and w[-1:].isdigit())]
    return " ".join(words) or label


def task_counts(graph: TaskGraph, tasks: list[int]) -> str:
    """``tasks: 36 compute · 36 collective``: how many tasks of each kind a node stands for."""
    counts = {k: 0 for k in KINDS}
    for t in tasks:
        counts[graph.kind[t]] += 1
    return "tasks: " + " · ".join(f"{n:,} {k}" for k, n in counts.items() if n)


def _titled_text(graph: TaskGraph, group: Group) -> str:
    text = f"{group.title}\\n{task_counts(graph, group.tasks)}"
    compute_ms, moved = group.compute_s(graph) * 1e3, group.nbytes(graph)
    if compute_ms or not moved:
        text += f"\\n{compute_ms:.3f} ms compute"
        if moved:
            text += f" · {human_bytes(moved)} moved"
    else:
        text += f"\\n{human_bytes(moved)} moved"
    return text


def _group_text(graph: TaskGraph, group: Group, mode: str, stage_names: dict) -> str:
    tasks = group.tasks
    if group.title is not None:
        return _titled_text(graph, group)
    if len(tasks) == 1 and group.key[0] == "task":
        return _node_text(graph, tasks[0])
    if group.kind == "collective":
        steps = sum(1 for t in tasks if graph.kind[t] in ("transfer", "collective"))
        return f"{group.key[1]}\\n{steps} transfer(s) · {human_bytes(group.nbytes(graph))}"
    computes = [t for t in tasks if graph.kind[t] == "compute"]
    first = computes[0] if computes else tasks[0]
    attrs = graph.attrs[first] or {}
    mb = attrs.get("microbatch")
    if mode == "stage" or len(computes) <= 1:
        head = f"{attrs.get('stage', graph.kind[first])}" + (f" · mb {mb}" if mb is not None else "")
        if len(computes) == 1:
            head = _short_label(graph.label[first]) + (f" · mb {mb}" if mb is not None else "")
    else:
        head = f"{_short_label(graph.label[computes[0]])} … {_short_label(graph.label[computes[-1]])}"
        head += f" · mb {mb}" if mb is not None else ""
    text = f"{head}\\n{len(computes)} op(s) · {group.compute_s(graph) * 1e3:.3f} ms"
    copied = group.nbytes(graph)
    if copied:
        text += f"\\n+ {human_bytes(copied)} copied"
    return text


def to_dot(graph: TaskGraph, name: str = "triosim", collapsed: Collapsed | None = None, mode: str = "none",
           rankdir: str = "TB") -> graphviz.Digraph:
    """DOT of ``graph`` (or of its groups, when ``collapsed`` is given): top to bottom by default,
    colour by task kind, one cluster per GPU (or pipeline stage)."""
    import graphviz

    if collapsed is None:
        collapsed = collapse(graph, "none")
    dot = graphviz.Digraph(name=name, graph_attr={"rankdir": rankdir, "fontname": "Helvetica",
                                                  "nodesep": "0.25", "ranksep": "0.35"},
                           node_attr={"shape": "box", "style": "filled,rounded", "fontname": "Helvetica",
                                      "fontsize": "10"})
    stage_names = graph.meta.get("cluster_names", {})
    clusters: dict[int, list[int]] = {}
    loose: list[int] = []
    for gi, group in enumerate(collapsed.groups):
        # Work local to one GPU sits in that GPU's cluster; communication between GPUs sits
        # between clusters, so the picture shows what crosses.
        # (A node of repeats that runs on one GPU sits there, its collectives included.)
        if group.device is not None and (group.kind in ("compute", "memcpy", "sync") or group.title is not None):
            clusters.setdefault(group.device, []).append(gi)
        else:
            loose.append(gi)

    def node(target: graphviz.Digraph, gi: int) -> None:
        group = collapsed.groups[gi]
        target.node(f"g{gi}", _group_text(graph, group, mode, stage_names), fillcolor=KIND_COLOURS[group.kind])

    for dev in sorted(clusters):
        with dot.subgraph(name=f"cluster_gpu{dev}") as sub:
            sub.attr(label=stage_names.get(dev, f"GPU {dev}"), style="rounded", color="#636363")
            for gi in clusters[dev]:
                node(sub, gi)
    for gi in loose:
        node(dot, gi)
    for u, v in collapsed.edges:
        dot.edge(f"g{u}", f"g{v}")
    with dot.subgraph(name="cluster_legend") as leg:
        leg.attr(label="task kinds", style="dashed")
        for kind, colour in KIND_COLOURS.items():
            leg.node(f"legend_{kind}", kind, fillcolor=colour)
    return dot


AUTO_ORDER = ("none", "layer", "stage", "repeat")  # what --collapse auto tries, finest first
COLLAPSE_MODES = AUTO_ORDER
HOW = {"layer": "per layer", "stage": "per stage",
       "repeat": "by repeats (each run of identical layers, micro-batches or collectives is one node; its "
                 "first and last stay)"}


@dataclass(frozen=True)
class Picture:
    dot: graphviz.Digraph
    mode: str  # the collapse mode used
    nodes: int
    note: str  # why the mode was chosen ("" when the user chose it)
    tasks: int = 0  # the tasks the nodes stand for (every task, or those of --show-gpus)
    edges: int = 0


def dag_picture(graph: TaskGraph, trace=None, collapse_mode: str = "auto", gpus: Collection[int] | None = None,
                max_nodes: int = 150, rankdir: str = "TB") -> Picture:
    """The DOT picture of ``graph``: ``collapse_mode`` none/layer/stage/repeat, or ``auto``: every
    task while that is at most ``max_nodes`` nodes, else per layer, else per stage, else by
    repeats (and say so). ``repeat`` draws as much detail as ``max_nodes`` allows."""
    params = parameter_ops(trace) if trace is not None else None
    modes = AUTO_ORDER if collapse_mode == "auto" else (collapse_mode,)
    note = ""
    for i, mode in enumerate(modes):
        if collapse_mode == "auto" and mode == "none" and gpus is None and len(graph) > max_nodes:
            continue  # one node per task: more than fit, no need to count
        if mode == "repeat":
            collapsed = repeats_picture(graph, max_nodes, gpus=gpus, param_ops=params)
        else:
            collapsed = collapse(graph, mode, gpus=gpus, param_ops=params)
        if len(collapsed.groups) <= max_nodes or i == len(modes) - 1:
            break
    shown = sum(len(g.tasks) for g in collapsed.groups)
    if collapse_mode == "auto" and mode != "none":
        note = (f"{shown:,} tasks are more than --max-nodes {max_nodes}: drawn collapsed {HOW[mode]} "
                f"({len(collapsed.groups):,} nodes; --expand draws every task)")
    dot = to_dot(graph, collapsed=collapsed, mode=mode, rankdir=rankdir)
    return Picture(dot, mode, len(collapsed.groups), note, shown, len(collapsed.edges))
