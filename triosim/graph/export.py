"""The task DAG as Graphviz DOT: colour by task kind, one cluster per GPU (or pipeline stage)."""

from __future__ import annotations

import graphviz

from .tasks import TaskGraph

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


def to_dot(graph: TaskGraph, name: str = "triosim") -> graphviz.Digraph:
    dot = graphviz.Digraph(name=name, graph_attr={"rankdir": "LR", "fontname": "Helvetica"},
                           node_attr={"shape": "box", "style": "filled,rounded", "fontname": "Helvetica",
                                      "fontsize": "10"})
    clusters: dict[int, list[int]] = {}
    loose: list[int] = []
    for t, kind in enumerate(graph.kind):
        devs = graph.devices[t]
        # Work local to one GPU sits in that GPU's cluster; communication between GPUs sits
        # between clusters, so the picture shows what crosses.
        if kind in ("compute", "memcpy") and len(devs) == 1:
            clusters.setdefault(devs[0], []).append(t)
        elif kind == "sync" and len(devs) == 1:
            clusters.setdefault(devs[0], []).append(t)
        else:
            loose.append(t)
    stage_names = graph.meta.get("cluster_names", {})
    for dev in sorted(clusters):
        with dot.subgraph(name=f"cluster_gpu{dev}") as sub:
            sub.attr(label=stage_names.get(dev, f"GPU {dev}"), style="rounded", color="#636363")
            for t in clusters[dev]:
                sub.node(str(t), _node_text(graph, t), fillcolor=KIND_COLOURS[graph.kind[t]])
    for t in loose:
        dot.node(str(t), _node_text(graph, t), fillcolor=KIND_COLOURS[graph.kind[t]])
    for u, vs in enumerate(graph.succ):
        for v in sorted(set(vs)):
            dot.edge(str(u), str(v))
    with dot.subgraph(name="cluster_legend") as leg:
        leg.attr(label="task kinds", style="dashed")
        for kind, colour in KIND_COLOURS.items():
            leg.node(f"legend_{kind}", kind, fillcolor=colour)
    return dot
