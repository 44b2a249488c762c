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

The set of active flows on each link is kept incrementally. Max-min rates decompose over the
connected components of the "shares a link" relation, so a flow starting or ending re-rates only
the flows reachable from its links; flows elsewhere keep their rates and their finish times (a
heap with lazy invalidation). An event therefore costs O(component · links · filling rounds +
log flows), independent of the number of tasks, and the schedule stays near-linear in tasks.
Links with the same users are one class in the filling, and a component of a shape already
rated in the schedule (the same gathers meeting again at every layer) takes the rates it got,
which are the same numbers to the bit.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class Flow:
    task: int
    remaining: float  # bytes
    solo_rate: float  # B/s
    coefs: list[tuple[int, float]]  # (link resource id, capacity share per B/s)
    rate: float = 0.0
    since: float = 0.0  # when ``remaining`` was last brought up to date
    version: int = 0  # bumped at every rate change: older finish-time entries are stale
    alone: float = 0.0  # its rate with no other flow on its links, once known (0: not yet)

    def settle(self, t: float) -> None:
        """Bring ``remaining`` to time ``t`` at the current rate."""
        self.remaining -= self.rate * (t - self.since)
        self.since = t


def loaded_flow(task: int, loads: list[tuple[int, float]], bandwidth: dict[int, float], xfer: float) -> Flow:
    """The flow of a link task putting ``loads`` ((link, bytes) each) on its links, ``xfer``
    seconds alone: a macro collective's size is the bytes of its most loaded link (the module
    docstring); nothing to move (size or time 0) is a flow of no links."""
    size = max((b for _r, b in loads), default=0.0)
    if size <= 0 or xfer <= 0:
        return Flow(task, 0.0, 1.0, [])
    return Flow(task, size, size / xfer, [(r, b / (size * bandwidth[r])) for r, b in loads])


def transfer_flow(task: int, links: list[int], bandwidth: dict[int, float], xfer: float) -> Flow:
    """The flow of a transfer over ``links`` taking ``xfer`` seconds alone: every byte on every
    link, at its slowest link's bandwidth."""
    if xfer <= 0 or not links:
        return Flow(task, 0.0, 1.0, [])
    bw = min(bandwidth[r] for r in links)
    return Flow(task, xfer * bw, bw, [(r, 1.0 / bandwidth[r]) for r in links])


def alone_rate(f: Flow) -> float:
    """``f``'s max-min rate with no other flow on its links: what the progressive filling below
    gives a single flow, in one pass."""
    demand: dict[int, float] = {}
    for r, c in f.coefs:
        demand[r] = demand.get(r, 0.0) + c
    step = f.solo_rate
    for d in demand.values():
        if d > 0:
            step = min(step, 1.0 / d)
    return max(step, 0.0)


def maxmin_rates(flows: list[Flow]) -> None:
    """Set every flow's ``rate`` by progressive filling (max-min fair, capped at its solo rate)."""
    if len(flows) == 1:  # the common case in large runs: the same numbers as the loop below, at once
        f = flows[0]
        f.rate = f.alone if f.alone > 0 else alone_rate(f)
        return
    _fill(flows, link_classes(flows))


def link_classes(flows: list[Flow]) -> tuple[tuple[tuple[int, ...], tuple[float, ...]], ...]:
    """The links of ``flows`` as classes of links with the same users: each class's (flow
    positions, coefficients), in the order a link's demand is summed (flow order, then
    coefficient order). Links of one class have the same demand and the same residual at every
    round of the filling, to the bit, so one stands for them all: a collective's flow loads many
    links alike, and a component has a few classes for many links. With the solo rates they are
    all the rates depend on (no link id): a component of the same shape gets the same rates."""
    users: dict[int, list] = {}
    for pos, f in enumerate(flows):
        for r, c in f.coefs:
            e = users.get(r)
            if e is None:
                users[r] = [pos, c]
            else:
                e += (pos, c)
    return tuple((e[0::2], e[1::2]) for e in dict.fromkeys(map(tuple, users.values())))


def _fill(flows: list[Flow], classes) -> None:
    """Progressive filling over ``classes`` (:func:`link_classes`)."""
    solo = [f.solo_rate for f in flows]
    live = [True] * len(flows)
    left = len(flows)
    residual = [1.0] * len(classes)
    level = 0.0
    while left:
        demand = []
        for on, coefs in classes:
            d = 0.0
            for p, c in zip(on, coefs):
                if live[p]:
                    d += c
            demand.append(d)
        step = min([solo[p] - level for p in range(len(solo)) if live[p]])
        for r, d in enumerate(demand):
            if d > 0:
                step = min(step, residual[r] / d)
        step = max(step, 0.0)
        level += step
        for r, d in enumerate(demand):
            residual[r] -= step * d
        frozen = [p for p in range(len(solo)) if live[p] and solo[p] - level <= 1e-12 * solo[p]]
        for r, d in enumerate(demand):
            if d > 0 and residual[r] <= 1e-12:
                frozen.extend(p for p in classes[r][0] if live[p])
        if not frozen:  # numerical safety: never loop forever
            frozen = [p for p in range(len(solo)) if live[p]]
        for p in set(frozen):
            live[p] = False
            left -= 1
            flows[p].rate = level


SHAPES_KEPT = 100_000


class SeenComponents:
    """``rates`` (:func:`maxmin_rates` or another rule) remembered per component shape (solo rates
    and :func:`link_classes`) for one schedule: the same gathers and exchanges meet again at every
    layer and micro-batch, so most components are a shape already rated. A rule other than
    ``maxmin_rates`` must depend on nothing but that shape.

    The same flows' coefficient lists (one list per distinct flow of the scheduler's memo) met
    again are looked up first, by the lists' identities and the solo rates: no link walked. The
    lists are held beside the rates, so an identity is never another list's while it is kept."""

    def __init__(self, rates: Callable[[list[Flow]], None]) -> None:
        self.rates = rates
        self.seen: dict[tuple, tuple[float, ...]] = {}
        self.by_lists: dict[tuple, tuple[tuple[float, ...], list]] = {}

    def __call__(self, flows: list[Flow]) -> None:
        if len(flows) == 1:
            self.rates(flows)
            return
        lists = [f.coefs for f in flows]
        same = (tuple(map(id, lists)), tuple([f.solo_rate for f in flows]))
        hit = self.by_lists.get(same)
        if hit is None:
            classes = link_classes(flows)
            shape = (same[1], classes)
            got = self.seen.get(shape)
            if got is None:
                if self.rates is maxmin_rates:
                    _fill(flows, classes)
                else:
                    self.rates(flows)
                got = tuple([f.rate for f in flows])
                if len(self.seen) >= SHAPES_KEPT:  # a bound on memory, not on correctness
                    self.seen.clear()
                self.seen[shape] = got
            if len(self.by_lists) >= SHAPES_KEPT:
                self.by_lists.clear()
            self.by_lists[same] = (got, lists)
        else:
            got = hit[0]
        for f, rate in zip(flows, got):
            f.rate = rate


class ActiveFlows:
    """The active flows, the flows on each link, and the heap of their finish times.

    A flow added with :meth:`add_alone` (alone on links only flows of its ``key`` may hold) is
    left out of the per-link sets, which only serve to find who shares a link: until another
    flow of that key joins (:meth:`link` enters it then), no flow can share one with it.
    """

    def __init__(self) -> None:
        self.flows: dict[int, Flow] = {}
        self.on_link: dict[int, set[int]] = {}
        self.finish: list[tuple[float, int, int]] = []  # (time, version, task)
        self.alone: dict[object, int] = {}  # key -> the flow added alone on its links
        self.key_of: dict[int, object] = {}  # that flow -> its key
        self.link_sets: dict[int, tuple[frozenset[int], list]] = {}  # id of a coefficient list -> its links, it

    def __bool__(self) -> bool:
        return bool(self.flows)

    def add_alone(self, f: Flow, key: object, t: float, rates: Callable[[list[Flow]], None]) -> None:
        """``f`` starts at ``t`` on links that only flows of ``key`` hold, none of them active:
        the rate and finish time :meth:`add` gives a flow alone, without entering its links."""
        f.since = t
        self.flows[f.task] = f
        self.alone[key] = f.task
        self.key_of[f.task] = key
        rates([f])
        f.version += 1
        heapq.heappush(self.finish, (t + f.remaining / f.rate, f.version, f.task))

    def link(self, key: object) -> None:
        """Enter the links of ``key``'s lone flow, if one is active (another flow of ``key`` joins)."""
        task = self.alone.pop(key, None)
        if task is None:
            return
        del self.key_of[task]
        on_link = self.on_link
        for r, _c in self.flows[task].coefs:
            users = on_link.get(r)
            if users is None:
                on_link[r] = {task}
            else:
                users.add(task)

    def add(self, new: list[Flow], t: float, rates: Callable[[list[Flow]], None]) -> None:
        """Flows starting together at ``t``: one re-rate for all of them."""
        links: list[int] = []
        shared = False
        on_link = self.on_link
        for f in new:
            f.since = t
            self.flows[f.task] = f
            for r, _c in f.coefs:
                users = on_link.get(r)
                if users is None:  # link sets are dropped when they empty: present means in use
                    on_link[r] = {f.task}
                else:
                    users.add(f.task)
                    shared = True
                links.append(r)
        if len(new) == 1 and not shared:  # a flow alone on its links: its component is itself
            f = new[0]
            rates(new)
            f.version += 1
            heapq.heappush(self.finish, (t + f.remaining / f.rate, f.version, f.task))
            return
        self._rerate(links, t, rates)

    def remove(self, tasks: list[int], t: float, rates: Callable[[list[Flow]], None]) -> None:
        links: list[int] = []
        for task in tasks:
            f = self.flows.pop(task)
            if self.key_of and task in self.key_of:  # alone on its links: no per-link sets to update
                del self.alone[self.key_of.pop(task)]
                continue
            for r, _c in f.coefs:
                users = self.on_link[r]
                users.discard(task)
                if not users:
                    del self.on_link[r]
                else:
                    links.append(r)
        if links:  # flows still on those links speed up; none left: nothing to re-rate
            self._rerate(links, t, rates)

    def component(self, links: list[int]) -> list[Flow]:
        """Every active flow connected to ``links`` through shared links (deterministic order)."""
        seen_links = set(links)
        stack = list(links)
        found: dict[int, Flow] = {}
        on_link, flows, link_sets = self.on_link, self.flows, self.link_sets
        while stack:
            users = on_link.get(stack.pop())
            if users is None:
                continue
            for task in users:
                if task not in found:
                    f = found[task] = flows[task]
                    # the flow's links as a set, once per coefficient list (flows of one memo
                    # entry share theirs; the list is held with it, so its identity stays its own)
                    got = link_sets.get(id(f.coefs))
                    if got is None:
                        got = link_sets[id(f.coefs)] = (frozenset([r for r, _c in f.coefs]), f.coefs)
                    new = got[0] - seen_links
                    if new:
                        seen_links |= new
                        stack += new
        return [found[k] for k in sorted(found)]

    def _rerate(self, links: list[int], t: float, rates: Callable[[list[Flow]], None]) -> None:
        comp = self.component(links)
        for f in comp:
            f.settle(t)
        rates(comp)
        for f in comp:
            f.version += 1
            heapq.heappush(self.finish, (t + f.remaining / f.rate, f.version, f.task))

    def next_finish(self) -> float:
        """When the next active flow ends (inf if none); drops stale heap entries."""
        heap = self.finish
        while heap:
            t, version, task = heap[0]
            f = self.flows.get(task)
            if f is not None and f.version == version:
                return t
            heapq.heappop(heap)
        return float("inf")

    def due(self, t: float) -> list[int]:
        """The flows that end at ``t`` (to rounding), popped from the heap."""
        limit = t * (1 + 1e-13)
        out = []
        heap = self.finish
        while heap and heap[0][0] <= limit:
            _t, version, task = heapq.heappop(heap)
            f = self.flows.get(task)
            if f is not None and f.version == version:
                out.append(task)
        return sorted(out)


__all__ = ["ActiveFlows", "Flow", "SeenComponents", "alone_rate", "link_classes", "loaded_flow", "maxmin_rates",
           "transfer_flow"]
