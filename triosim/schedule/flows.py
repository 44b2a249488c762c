"""A link task of the DAG seen as a flow of the max-min network model
(:mod:`triosim.hardware.flow_network`): its bytes, solo rate and per-link capacity shares."""

from __future__ import annotations

from ..hardware.flow_network import Flow, alone_rate
from .tasks import TaskGraph


def alike_links(graph: TaskGraph, bandwidth: dict[int, float]) -> frozenset[int]:
    """Links that another link stands for in every flow: held by the same link tasks' tuples
    with the same bytes and bandwidth (a macro collective's ring of 8,192 alike links). Each
    flow uses every such link as it uses the first of them (the same share of its rate), so
    max-min filling gives them the same residual, demand and freeze, and leaving them out of
    the flows' links changes no rate. Returns the links left out."""
    names = graph.resource_names
    charges: dict[tuple, tuple] = {}  # (links, id of the load dict, uniform bytes) -> (links, uniform, load)
    for rs, attrs in zip(graph.resources, graph.attrs):
        if not rs or (len(rs) == 1 and rs[0] not in bandwidth):
            continue
        load = attrs.get("link_load") if attrs else None
        uniform = attrs.get("link_bytes") if attrs and load is None else None
        key = (rs, id(load) if load is not None else None, uniform)
        if key not in charges:
            charges[key] = (rs, uniform, load)  # the graph holds the load dict: its id is not reused
    sig: dict[int, list] = {}
    for k, (rs, uniform, load) in enumerate(charges.values()):
        for r in rs:
            if r in bandwidth:
                b = load[names[r]] if load is not None else uniform
                hit = sig.get(r)
                if hit is None:
                    sig[r] = [k, b, bandwidth[r]]
                else:
                    hit += (k, b, bandwidth[r])
    first: dict[tuple, int] = {}
    dropped = []
    for r, key in sig.items():
        key = tuple(key)
        if first.setdefault(key, r) != r:
            dropped.append(r)
    return frozenset(dropped)


def flow_of(graph: TaskGraph, task: int, bandwidth: dict[int, float],
            memo: dict[tuple, tuple] | None = None, alike: frozenset[int] = frozenset()) -> Flow:
    """The flow of link task ``task`` (see :mod:`triosim.hardware.flow_network`). ``memo`` remembers the flow of
    tasks with the same links, bytes per link (uniform, or one charge's per-link load) and
    transfer time (a collective repeated per micro-batch): their flows differ only in the task.
    ``alike``: links left out of the flow's links (:func:`alike_links`)."""
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
    if alike:
        f.coefs = [rc for rc in f.coefs if rc[0] not in alike]
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
