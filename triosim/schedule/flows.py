"""A link task of the DAG seen as a flow of the max-min network model
(:mod:`triosim.hardware.flow_network`): its bytes, solo rate and per-link capacity shares."""

from __future__ import annotations

from ..hardware.flow_network import Flow, alone_rate
from .tasks import TaskGraph


def flow_of(graph: TaskGraph, task: int, bandwidth: dict[int, float],
            memo: dict[tuple, tuple] | None = None) -> Flow:
    """The flow of link task ``task`` (see :mod:`triosim.hardware.flow_network`). ``memo`` remembers the flow of
    tasks with the same links, bytes per link (uniform, or one charge's per-link load) and
    transfer time (a collective repeated per micro-batch): their flows differ only in the task."""
    xfer = graph.duration[task] - graph.latency[task]
    attrs = graph.attrs[task] or {}
    load = attrs.get("link_load")
    uniform = attrs.get("link_bytes")
    key = None
    if memo is not None:
        # A per-link load is one dict per charge, shared by every task of that charge: its
        # identity stands for its contents (the memo holds it, so the id is never reused).
        key = (graph.resources[task], uniform, xfer, None if load is None else id(load))
        hit = memo.get(key)
        if hit is not None:
            return Flow(task, hit[0], hit[1], hit[2], alone=hit[3])
    f = _new_flow(graph, task, bandwidth, xfer, load, uniform)
    if key is not None:
        f.alone = alone_rate(f)
        memo[key] = (f.remaining, f.solo_rate, f.coefs, f.alone, load)
    return f


def _new_flow(graph: TaskGraph, task: int, bandwidth: dict[int, float], xfer: float, load, uniform) -> Flow:
    rids = [r for r in graph.resources[task] if r in bandwidth]
    if load is not None or uniform is not None:
        names = graph.resource_names
        loads = [(r, load[names[r]] if load is not None else float(uniform)) for r in rids]
        # A macro collective's size is the bytes of its most loaded link (payloads may round to 0).
        size = max((b for _r, b in loads), default=0.0)
        if size <= 0 or xfer <= 0:
            return Flow(task, 0.0, 1.0, [])
        return Flow(task, size, size / xfer, [(r, b / (size * bandwidth[r])) for r, b in loads])
    if xfer <= 0 or not rids:
        return Flow(task, 0.0, 1.0, [])
    bw = min(bandwidth[r] for r in rids)
    return Flow(task, xfer * bw, bw, [(r, 1.0 / bandwidth[r]) for r in rids])
