"""A link task of the DAG seen as a flow of the max-min network model
(:mod:`triosim.hardware.flow_network`): its bytes, solo rate and per-link capacity shares."""

from __future__ import annotations

from itertools import compress

import numpy as np

from ..hardware.flow_network import Flow, alone_rate, loaded_flow, transfer_flow
from .tasks import TaskGraph


def alike_links(graph: TaskGraph, bandwidth: dict[int, float], holds_links: list[bool] | None = None) -> frozenset[int]:
    """Links that another link stands for in every flow: held by the same link tasks' charges
    with the same bytes and bandwidth (a macro collective's ring of 8,192 alike links). Each
    flow uses every such link as it uses the first of them (the same share of its rate), so
    max-min filling gives them the same residual, demand and freeze, and leaving them out of
    the flows' links changes no rate. Returns the links left out.

    Found by refining one class of every link: by bandwidth, then by each charge (the links it
    holds, with the bytes it puts on each), with numpy over the links. ``holds_links``: per task,
    whether it holds a link (the others charge none: only those are read, when given)."""
    names = graph.resource_names
    charges: dict[tuple, tuple] = {}  # (links, id of the load dict, uniform bytes) -> (links, uniform, load)
    tasks = zip(graph.resources, graph.attr_rows)
    for rs, attrs in tasks if holds_links is None else compress(tasks, holds_links):
        if not rs or (len(rs) == 1 and rs[0] not in bandwidth):
            continue
        load = attrs.get("link_load") if attrs else None
        uniform = attrs.get("link_bytes") if attrs and load is None else None
        key = (rs, id(load) if load is not None else None, uniform)
        if key not in charges:
            charges[key] = (rs, uniform, load)  # the graph holds the load dict: its id is not reused
    links = sorted(bandwidth)
    if len(links) < 2 or not charges:
        return frozenset()
    at = {r: k for k, r in enumerate(links)}
    cls = _refine(np.zeros(len(links), dtype=np.int64), np.array([bandwidth[r] for r in links], dtype=np.float64))
    positions: dict[tuple, tuple] = {}  # links tuple -> (positions, its link indices, their names, all links)
    for rs, uniform, load in charges.values():
        hit = positions.get(rs)
        if hit is None:
            mine = [k for k, r in enumerate(rs) if r in bandwidth]
            hit = positions[rs] = (np.array([at[rs[k]] for k in mine], dtype=np.int64), mine,
                                   tuple(names[r] for r in rs), len(mine) == len(rs))
        pos, mine, rs_names, all_links = hit
        held = np.zeros(len(links), dtype=np.float64)
        np.add.at(held, pos, 1.0)  # how many times it holds each (a link twice in a tuple counts twice)
        cls = _refine(cls, held)
        if load is not None:  # a macro collective's tasks name its load's links in the load's order
            if all_links and tuple(load) == rs_names:
                values = np.fromiter(load.values(), dtype=np.float64, count=len(load))
            else:
                values = np.array([load[names[rs[k]]] for k in mine], dtype=np.float64)
        elif uniform is not None:
            values = np.full(len(mine), float(uniform))
        else:  # a transfer: 1/bandwidth on every link
            continue
        value = np.zeros(len(links), dtype=np.float64)
        value[pos] = values
        cls = _refine(cls, value)
    first = np.unique(cls, return_index=True)[1]
    keep = np.zeros(len(links), dtype=bool)
    keep[first] = True
    return frozenset(r for r, kept in zip(links, keep.tolist()) if not kept)


def _refine(cls: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Classes ``cls`` split by ``value`` (exact floats, by their bits)."""
    bits = value.view(np.int64)
    order = np.lexsort((bits, cls))
    c, b = cls[order], bits[order]
    step = np.empty(len(order), dtype=np.int64)
    step[0] = 0
    step[1:] = (c[1:] != c[:-1]) | (b[1:] != b[:-1])
    out = np.empty_like(cls)
    out[order] = np.cumsum(step)
    return out


def link_charge(graph: TaskGraph, task: int) -> tuple[dict | None, int | None]:
    """A link task's per-link load (a macro collective's bytes on each link) and its uniform bytes
    per link, where its attributes give them."""
    attrs = graph.attr_rows[task]
    if not attrs:
        return None, None
    return attrs.get("link_load"), attrs.get("link_bytes")


def flow_of(graph: TaskGraph, task: int, bandwidth: dict[int, float],
            memo: dict[tuple, tuple] | None = None, alike: frozenset[int] = frozenset()) -> Flow:
    """The flow of link task ``task`` (see :mod:`triosim.hardware.flow_network`). ``memo`` remembers the flow of
    tasks with the same links, bytes per link (uniform, or one charge's per-link load) and
    transfer time (a collective repeated per micro-batch): their flows differ only in the task.
    ``alike``: links left out of the flow's links (:func:`alike_links`)."""
    xfer = graph.duration[task] - graph.latency[task]
    load, uniform = link_charge(graph, task)
    key = None
    if memo is not None:
        # A per-link load is one dict per charge, shared by every task of that charge: its
        # identity stands for its contents (the memo holds it, so the id is never reused).
        key = (graph.resources[task], uniform, xfer, None if load is None else id(load))
        hit = memo.get(key)
        if hit is not None:
            return Flow(task, hit[0], hit[1], hit[2], alone=hit[3])
    rs = graph.resources[task]
    rids = memo.get(("links", rs)) if memo is not None else None
    if rids is None:
        # Without the alike links: each has its representative's bytes and bandwidth here, so
        # the flow's size (its most loaded link) and slowest link are found over the others.
        rids = [r for r in rs if r in bandwidth and r not in alike]
        if memo is not None:
            memo[("links", rs)] = rids
    f = _new_flow(graph, task, bandwidth, xfer, load, uniform, rids)
    if key is not None:
        f.alone = alone_rate(f)
        memo[key] = (f.remaining, f.solo_rate, f.coefs, f.alone, load)
    return f


def _new_flow(graph: TaskGraph, task: int, bandwidth: dict[int, float], xfer: float, load, uniform,
              rids: list[int] | None = None) -> Flow:
    if rids is None:
        rids = [r for r in graph.resources[task] if r in bandwidth]
    if load is not None or uniform is not None:
        names = graph.resource_names
        # a macro collective's size is the bytes of its most loaded link (payloads may round to 0)
        return loaded_flow(task, [(r, load[names[r]] if load is not None else float(uniform)) for r in rids],
                           bandwidth, xfer)
    return transfer_flow(task, rids, bandwidth, xfer)
