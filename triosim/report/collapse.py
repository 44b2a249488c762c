"""Grouping a task DAG into fewer nodes for a picture: per layer, per stage, per collective.

A task DAG of a few hundred tasks is already too wide to read. ``collapse`` maps every task to a
group and returns the groups (with their tasks, summed compute time and bytes) and the edges
between them:

* ``none``: every task is its own group.
* ``layer``: on each GPU, the ops of one pass (forward, backward, optimizer) and micro-batch are
  cut into layers, one op that reads a weight matrix or kernel each (forward: a layer starts at
  such an op; backward: it ends at one), so ``conv2d, add_, batch_norm, relu_`` is one node.
* ``stage``: one node per GPU, pass and micro-batch.

In both collapsed modes every collective (all its ring steps and the syncs after it) is one
node, copies between a GPU and remote memory join the op they feed (or that produced what they
write back), and a run of tasks is also cut where work from outside the GPU (a collective, a
pipeline transfer) enters it, so the picture stays a DAG.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from ..schedule.tasks import TaskGraph

MODES = ("none", "layer", "stage")  # report.repeats adds "repeat" on top of "layer"


@dataclass
class Group:
    """One node of the picture."""

    key: tuple
    kind: str  # a task kind, the kind of the group's tasks (compute for mixed compute/memcpy)
    tasks: list[int] = field(default_factory=list)
    device: int | None = None  # the GPU whose cluster it sits in; None between GPUs
    title: str | None = None  # the node's name when it stands for a run of repeats (report.repeats)
    repeats: int = 1  # how many repeated units (layers, micro-batches, collectives) it stands for

    def compute_s(self, graph: TaskGraph) -> float:
        return sum(graph.duration[t] for t in self.tasks if graph.kind[t] == "compute")

    def nbytes(self, graph: TaskGraph) -> int:
        return sum(graph.nbytes[t] for t in self.tasks if graph.kind[t] != "compute")


@dataclass
class Collapsed:
    groups: list[Group]
    group_of: list[int | None]  # task -> group index (None: filtered out)
    edges: list[tuple[int, int]]


def _attr(graph: TaskGraph, t: int, name: str, default=None):
    attrs = graph.attrs[t]
    return attrs.get(name, default) if attrs else default


def _phase(graph: TaskGraph, t: int) -> str:
    return str(_attr(graph, t, "stage", _attr(graph, t, "direction", "work")))


def _reads_parameters(graph: TaskGraph, t: int, param_ops: Collection[int] | None) -> bool:
    op = _attr(graph, t, "op")
    if param_ops is not None and op is not None:
        return op in param_ops
    # Without the trace, the usual parameter ops by name.
    name = graph.label[t].split("#")[0].lower()
    return any(k in name for k in ("conv", "linear", "addmm", "matmul", "embedding", "mmbackward", "bmm"))


def enters_from_outside(graph: TaskGraph, t: int, preds: Sequence[int], group_of: Sequence[int | None],
                        current: int | None) -> bool:
    """Whether work from elsewhere (a collective, a transfer, another GPU) feeds task ``t``: such
    a task starts a new run, so no group both feeds and waits for the same outside node."""
    devs = graph.devices[t]
    for p in preds:
        if graph.devices[p] != devs or graph.kind[p] not in ("compute", "memcpy", "sync"):
            return True
        if group_of[p] is not None and group_of[p] != current:  # e.g. the sync closing a collective
            return True
    return False


def parameter_ops(trace) -> frozenset[int]:
    """Indices of the trace ops that read a weight matrix or kernel (a parameter of two or more
    dimensions): the conv, linear or embedding a layer is named after. Normalisation weights
    and biases are one-dimensional and belong to the layer, not head one."""
    def is_weight(tid: str) -> bool:
        shape = trace.tensors[tid].shape
        return shape is None or len(shape) >= 2

    weights = {p for p in trace.parameters if is_weight(p)}
    return frozenset(i for i, reads in enumerate(trace.reads) if weights.intersection(reads))


def collapse(graph: TaskGraph, mode: str = "none", gpus: Collection[int] | None = None,
             param_ops: Collection[int] | None = None) -> Collapsed:
    """Group the tasks of ``graph`` (only those touching ``gpus`` when given) by ``mode``."""
    if mode not in MODES:
        raise ValueError(f"unknown collapse mode {mode!r}")
    n = len(graph)
    keep = [gpus is None or any(d in gpus for d in graph.devices[t]) for t in range(n)]
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, vs in enumerate(graph.succ):
        for v in vs:
            preds[v].append(u)

    groups: list[Group] = []
    by_key: dict[tuple, int] = {}
    group_of: list[int | None] = [None] * n

    def put(t: int, key: tuple, kind: str, device: int | None) -> None:
        gi = by_key.get(key)
        if gi is None:
            gi = by_key[key] = len(groups)
            groups.append(Group(key, kind, device=device))
        groups[gi].tasks.append(t)
        group_of[t] = gi

    if mode == "none":
        for t in range(n):
            if keep[t]:
                devs = graph.devices[t]
                put(t, ("task", t), graph.kind[t], devs[0] if len(devs) == 1 else None)
        return Collapsed(groups, group_of, _edges(graph, group_of))

    # Collectives first: every step and sync of one collective is one node.
    for t in range(n):
        coll = _attr(graph, t, "collective")
        if keep[t] and coll is not None and graph.kind[t] in ("transfer", "collective", "sync"):
            put(t, ("collective", coll, _attr(graph, t, "bucket")), "collective", None)

    # Work on one GPU, walked in program order (task ids): runs of one pass and micro-batch.
    run_id: dict[int, int] = {}  # device -> current run number
    last_key: dict[int, tuple] = {}
    open_layer: dict[int, bool] = {}  # device -> the current layer already has its parameter op
    for t in range(n):
        if not keep[t] or group_of[t] is not None or graph.kind[t] not in ("compute", "sync"):
            continue
        devs = graph.devices[t]
        if len(devs) != 1:
            continue
        dev = devs[0]
        if graph.kind[t] == "sync" and dev in run_id:  # a join: part of the run it sits in
            put(t, ("work", dev, run_id[dev]), "compute", dev)
            continue
        base = (dev, _phase(graph, t), _attr(graph, t, "microbatch"))
        current = by_key.get(("work", dev, run_id[dev])) if dev in run_id else None
        new_run = base != last_key.get(dev) or enters_from_outside(graph, t, preds[t], group_of, current)
        if mode == "layer" and graph.kind[t] == "compute" and not new_run:
            heads = _reads_parameters(graph, t, param_ops)
            forward = base[1] == "forward"
            if forward and heads and open_layer.get(dev):
                new_run = True
        if new_run:
            run_id[dev] = run_id.get(dev, 0) + 1
            open_layer[dev] = False
        last_key[dev] = base
        put(t, ("work", dev, run_id[dev]), "compute", dev)
        if mode == "layer" and graph.kind[t] == "compute" and _reads_parameters(graph, t, param_ops):
            open_layer[dev] = True
            if base[1] != "forward" and base[1] != "optimizer":
                last_key[dev] = (*base, "cut")  # backward: the layer ends at its parameter op

    # Copies to and from remote memory join the work they feed, else the work they follow.
    for t in range(n):
        if not keep[t] or group_of[t] is not None:
            continue
        near = [s for s in graph.succ[t] if group_of[s] is not None and groups[group_of[s]].kind == "compute"]
        near = near or [p for p in preds[t] if group_of[p] is not None and groups[group_of[p]].kind == "compute"]
        if graph.kind[t] == "memcpy" and near:
            gi = group_of[near[0]]
            groups[gi].tasks.append(t)
            group_of[t] = gi
        else:  # a point-to-point transfer, or anything no rule above placed: its own node
            devs = graph.devices[t]
            put(t, ("task", t), graph.kind[t], devs[0] if len(devs) == 1 and graph.kind[t] != "transfer" else None)
    return Collapsed(groups, group_of, _edges(graph, group_of))


def _edges(graph: TaskGraph, group_of: Sequence[int | None]) -> list[tuple[int, int]]:
    edges = set()
    for u, vs in enumerate(graph.succ):
        gu = group_of[u]
        if gu is None:
            continue
        for v in vs:
            gv = group_of[v]
            if gv is not None and gv != gu:
                edges.add((gu, gv))
    return sorted(edges)
