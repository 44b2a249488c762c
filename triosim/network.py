"""The flow-level network model: transfers share links max-min fairly.

Under ``--network flow`` every task that holds links (memcpy, transfer, macro collective) is a
**flow**: after its fixed latency (link latency plus collective latency) it moves its bytes at a
rate the solver sets, and ends when they are through. Rates are max-min fair and recomputed
whenever a flow starts or ends, by progressive filling: all unfrozen flows' rates rise together
until a link is full (or a flow reaches the rate it would have alone); the flows on full links
freeze; repeat. A multi-hop flow is therefore limited by its bottleneck link.

A flow has a size B (bytes), a solo rate R (the rate it gets alone, so it takes B/R = its
duration minus its latency) and, per link l, a coefficient c_l: at rate r it uses r·c_l of
l's capacity (c_l = 1/bandwidth for a transfer; for a macro collective, whose links carry
different shares of its payload, B is the bytes of its most loaded link and
c_l = bytes on l / (B · bandwidth)).

Rates are recomputed only over the active flows (a set kept incrementally as flows start and
end), so an event costs O(active flows · their links · filling rounds), independent of the
number of tasks: the schedule stays near-linear in tasks while few flows overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

from .graph.tasks import TaskGraph
from .platform import Platform

NETWORK_META = "network"
BANDWIDTH_META = "link_bandwidth"


def attach_network(graph: TaskGraph, platform: Platform) -> TaskGraph:
    """Record the platform's network model and link bandwidths on ``graph`` for the scheduler."""
    graph.meta[NETWORK_META] = platform.network
    links = set(platform.links())
    graph.meta[BANDWIDTH_META] = {name: platform.link_bandwidth(name) for name in graph.resource_names
                                  if name in links}
    return graph


@dataclass
class Flow:
    task: int
    remaining: float  # bytes
    solo_rate: float  # B/s
    coefs: list[tuple[int, float]]  # (link resource id, capacity share per B/s)
    rate: float = 0.0


def flow_of(graph: TaskGraph, task: int, bandwidth: dict[int, float]) -> Flow:
    """The flow of link task ``task`` (see the module docstring)."""
    xfer = graph.duration[task] - graph.latency[task]
    rids = [r for r in graph.resources[task] if r in bandwidth]
    attrs = graph.attrs[task] or {}
    load = attrs.get("link_load")
    uniform = attrs.get("link_bytes")
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


def maxmin_rates(flows: list[Flow]) -> None:
    """Set every flow's ``rate`` by progressive filling (max-min fair, capped at its solo rate)."""
    residual: dict[int, float] = {}
    on_link: dict[int, list[Flow]] = {}
    for f in flows:
        f.rate = 0.0
        for r, _c in f.coefs:
            residual[r] = 1.0
            on_link.setdefault(r, []).append(f)
    unfrozen = {id(f): f for f in flows}
    level = 0.0
    while unfrozen:
        demand: dict[int, float] = {}
        for f in unfrozen.values():
            for r, c in f.coefs:
                demand[r] = demand.get(r, 0.0) + c
        step = min((f.solo_rate - level for f in unfrozen.values()), default=0.0)
        for r, d in demand.items():
            if d > 0:
                step = min(step, residual[r] / d)
        step = max(step, 0.0)
        level += step
        for r, d in demand.items():
            residual[r] -= step * d
        frozen = [k for k, f in unfrozen.items() if f.solo_rate - level <= 1e-12 * f.solo_rate]
        for r, d in demand.items():
            if d > 0 and residual[r] <= 1e-12:
                frozen.extend(id(f) for f in on_link[r] if id(f) in unfrozen)
        if not frozen:  # numerical safety: never loop forever
            frozen = list(unfrozen)
        for k in set(frozen):
            unfrozen.pop(k).rate = level


__all__ = ["Flow", "attach_network", "flow_of", "maxmin_rates"]
