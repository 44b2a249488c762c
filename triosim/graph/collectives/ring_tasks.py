"""The ring algorithms as task-DAG fragments: the original one-way ring and the multi-channel
ring (closed forms: :mod:`triosim.graph.collectives.ring_cost`).

- **expanded**: one ``transfer`` task per ring step and GPU, each holding the links of its ring
  hop, with the data dependencies of the algorithm (a GPU forwards a chunk only after it has
  received it). Exact under contention with other traffic; O(N²) tasks.
- **macro**: one ``collective`` task that holds every link of the ring for the closed-form
  time (the one-way ring), or one per phase of the plan (the multi-channel ring). O(1) tasks.

The payload S is split into N chunks whose integer sizes sum to S exactly (the first ``S mod N``
chunks get one byte more). Transfer durations use the nominal chunk S/N, so the expanded form
reproduces the closed form exactly; the byte counts stay integral and conserved. A broadcast
is a pipelined chain from the root in ring order. The multi-channel ring splits the payload
evenly over the topology's channels, one ring (or chain) each.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...hardware.platform import Platform, gpu_node
from ...schedule.tasks import TaskGraph
from . import fragment, plans
from .groups import check_group
from .phases import Phase
from .protocols import ring_step_latency_s, step_latency_s
from .ring_cost import (
    BROADCAST_CHUNKS,
    chain_positions,
    ring_broadcast_time,
    ring_orders,
    ring_step_time,
)

# (name, chunk offset) of the ring phases of each operation (see :func:`_ring_steps`).
RING_PHASES = {"all_reduce": (("rs", 0), ("ag", 1)), "reduce_scatter": (("rs", 0),), "all_gather": (("ag", 0),)}


@dataclass(frozen=True)
class Ring:
    """A group in ring order with the route of each hop ``group[i] -> group[i+1]``."""

    group: tuple[int, ...]
    hops: tuple[tuple[str, ...], ...]

    @property
    def n(self) -> int:
        return len(self.group)

    def links(self, hops: Iterable[int] | None = None) -> tuple[str, ...]:
        """Distinct directed links of the given hops (default all), in first-use order."""
        idx = range(self.n) if hops is None else hops
        return tuple(dict.fromkeys(link for i in idx for link in self.hops[i]))


def make_ring(platform: Platform, group: Sequence[int]) -> Ring:
    """``group`` (checked) as a ring in its order, with the route of every hop."""
    order = check_group(platform, group)
    n = len(order)
    hops = tuple(
        platform.route(gpu_node(order[i]), gpu_node(order[(i + 1) % n])) for i in range(n)
    ) if n > 1 else ()
    return Ring(order, hops)


def slowest_hop(platform: Platform, ring: Ring, nbytes: float, hops: Iterable[int] | None = None) -> tuple[float, float]:
    """(bandwidth W, latency α) of the hop whose transfer of S/N bytes takes longest."""
    idx = list(range(ring.n) if hops is None else hops)
    best_t, best = -1.0, (float("inf"), 0.0)
    chunk = nbytes / ring.n
    for i in idx:
        route = ring.hops[i]
        t = platform.route_time(route, chunk)
        if t > best_t:
            lat = sum(platform.link(name)["latency"] for name in route)
            bw = min(platform.link(name)["bandwidth"] for name in route)
            best_t, best = t, (bw, lat)
    return best


def _hop_transfer(graph: TaskGraph, platform: Platform, ring: Ring, pos: int, nbytes: int,
                  duration: float, label: str, after: list[int], attrs: dict[str, Any], latency: float = 0.0) -> int:
    """A transfer of ``nbytes`` from ring position ``pos`` to ``pos + 1`` taking ``duration``."""
    src = ring.group[pos]
    dst = ring.group[(pos + 1) % ring.n]
    return graph.add_task(
        "transfer", label, duration, ring.hops[pos], (src, dst), nbytes, after=after, latency_s=latency,
        src=gpu_node(src), dst=gpu_node(dst), **attrs,
    )


def _macro(graph: TaskGraph, ring: Ring, op: str, nbytes: int, duration: float, link_bytes: int,
           label: str, pre: dict[int, list[int]], attrs: dict[str, Any], hops: Iterable[int] | None = None,
           latency: float = 0.0) -> dict[int, int]:
    """One ``collective`` task holding the links of the ring's ``hops`` (default all) for ``duration``."""
    deps = list(dict.fromkeys(p for g in ring.group for p in pre[g]))
    tags = {"collective": label, **attrs}
    task = graph.add_task(
        "collective", label, duration, ring.links(hops), ring.group, nbytes, after=deps, latency_s=latency,
        **{"op": op, **tags, "link_bytes": link_bytes},
    )
    return fragment.done_syncs(graph, label, attrs, {g: [task] for g in ring.group})


def _ring_steps(graph: TaskGraph, platform: Platform, ring: Ring, nbytes: int, label: str,
                pre: dict[int, list[int]], attrs: dict[str, Any], phases: Sequence[tuple[str, int]],
                nominal: float | None = None, lam: float = 0.0, base: float = 0.0,
                step_latency: float | None = None) -> dict[int, int]:
    """Expanded ring phases, back to back. ``phases``: (name, chunk offset) per phase of N−1 steps.

    In step k of a phase with offset o, the GPU at ring position i sends chunk (i + o − k) mod N
    to position i+1: that is the chunk it received in the previous step, so following one chunk
    around the ring visits every GPU. Reduce-scatter has o = 0, all-gather after it o = 1
    (position i then owns the reduced chunk i+1), a standalone all-gather o = 0.

    ``nominal``: the payload durations are computed from (default ``nbytes``: a channel's share
    of a multi-channel ring is fractional); ``lam``: per-step collective latency; ``base``: the
    per-call latency, added to every GPU's first send; ``step_latency``: the latency of every
    hop's step (link latency and λ together) instead of each hop's own.
    """
    n = ring.n
    chunks = fragment.chunk_sizes(nbytes, n)
    size = nbytes if nominal is None else nominal
    step_lat = [platform.route_time(ring.hops[i], 0.0) + lam for i in range(n)]
    if step_latency is not None:  # one latency per step for every hop, as the closed form charges
        step_lat = [step_latency] * n
    step_s = [platform.route_time(ring.hops[i], size / n) - platform.route_time(ring.hops[i], 0.0) + step_lat[i]
              for i in range(n)]
    last = [list(pre[g]) for g in ring.group]  # position i's latest send (or its predecessors)
    sent: list[int | None] = [None] * n
    k_total = 0
    for phase, offset in phases:
        for k in range(n - 1):
            new: list[int] = []
            for i in range(n):
                deps = list(last[i])
                prev = sent[(i - 1) % n]
                if prev is not None:
                    deps.append(prev)  # the chunk position i forwards arrived in the last step
                c = (i + offset - k) % n
                src, dst = ring.group[i], ring.group[(i + 1) % n]
                first = base if k_total == 0 else 0.0
                new.append(_hop_transfer(
                    graph, platform, ring, i, chunks[c], step_s[i] + first,
                    f"{label} {phase}{k} gpu{src}->gpu{dst}", deps,
                    {"collective": label, "phase": phase, "step": k_total, "chunk": c, **attrs},
                    latency=step_lat[i] + first,
                ))
            for i in range(n):
                sent[i] = new[i]
                last[i] = [new[i]]
            k_total += 1
    return fragment.done_syncs(graph, label, attrs,
                               {g: [sent[i], sent[(i - 1) % n]] for i, g in enumerate(ring.group)})


def _chain(graph: TaskGraph, platform: Platform, ring: Ring, nbytes: int, nominal: float, k: int, root: int,
           label: str, pre: dict[int, list[int]], attrs: dict[str, Any], lam: float, base: float,
           ) -> dict[int, int]:
    """Pipelined chain broadcast from ``root`` in ring order, in ``k`` chunks.

    Chunk c crosses hop p (p = 1 … N−1 from the root) after it crossed hop p−1 and after chunk
    c−1 crossed hop p, so the last chunk arrives after k + N − 2 chunk times.
    """
    n = ring.n
    hop_idx = chain_positions(n, ring.group.index(root))  # ring position sending over the p-th hop
    chunks = fragment.chunk_sizes(nbytes, k)
    prev_hop: list[int] | None = None
    last_send: dict[int, int] = {}
    last_recv: dict[int, int] = {}
    for pos in hop_idx:
        src, dst = ring.group[pos], ring.group[(pos + 1) % n]
        dur = platform.route_time(ring.hops[pos], nominal / k) + lam
        lat = platform.route_time(ring.hops[pos], 0.0) + lam
        row: list[int] = []
        for c in range(k):
            deps = list(pre[src]) if c == 0 else [row[-1]]
            if prev_hop is not None:
                deps.append(prev_hop[c])
            first = base if (c == 0 and prev_hop is None) else 0.0
            row.append(_hop_transfer(
                graph, platform, ring, pos, chunks[c], dur + first, f"{label} bc{c} gpu{src}->gpu{dst}", deps,
                {"collective": label, "phase": "bc", "chunk": c, **attrs}, latency=lat + first,
            ))
        last_send[src] = row[-1]
        last_recv[dst] = row[-1]
        prev_hop = row
    done: dict[int, list[int]] = {}
    for g in ring.group:
        deps = [t for t in (last_send.get(g), last_recv.get(g)) if t is not None]
        if g not in last_send:
            deps.extend(pre[g])  # the chain's end sends nothing: still respect its predecessors
        done[g] = deps
    return fragment.done_syncs(graph, label, attrs, done)


def one_way_ring(graph: TaskGraph, platform: Platform, ring: Ring, op: str, nbytes: int, label: str,
                 pre: dict[int, list[int]], detail: str, attrs: dict[str, Any], base: float) -> dict[int, int]:
    """The original single ring in the group's order (reduce-scatter, all-gather, all-reduce)."""
    phases = RING_PHASES[op]
    n = ring.n
    steps = len(phases) * (n - 1)
    lam = max(step_latency_s(platform, "ring", hop) for hop in ring.hops)
    if fragment.resolve_detail(detail, steps * n) == "expanded":
        return _ring_steps(graph, platform, ring, nbytes, label, pre, attrs, phases, lam=lam, base=base)
    bw, lat = slowest_hop(platform, ring, nbytes)
    duration = steps * ring_step_time(nbytes, n, bw, lat + lam) + base
    return _macro(graph, ring, op, nbytes, duration, steps * nbytes // n, label, pre, attrs,
                  latency=steps * (lat + lam) + base)


def one_way_broadcast(graph: TaskGraph, platform: Platform, ring: Ring, nbytes: int, label: str, root: int | None,
                      pre: dict[int, list[int]], detail: str, attrs: dict[str, Any], base: float) -> dict[int, int]:
    """The original broadcast: a chain from the root in the group's order, in N chunks."""
    n = ring.n
    root = ring.group[0] if root is None else root
    hop_idx = chain_positions(n, ring.group.index(root))
    lam = max(step_latency_s(platform, "ring", ring.hops[i]) for i in hop_idx)
    if fragment.resolve_detail(detail, n * (n - 1)) == "macro":
        bw, lat = slowest_hop(platform, ring, nbytes, hop_idx)
        return _macro(graph, ring, "broadcast", nbytes, ring_broadcast_time(n, nbytes, bw, lat + lam) + base, nbytes,
                      label, pre, attrs, hops=hop_idx, latency=2 * (n - 1) * (lat + lam) + base)
    return _chain(graph, platform, ring, nbytes, nbytes, n, root, label, pre, attrs, lam, base)


def _join(graph: TaskGraph, parts: list[dict[int, int]], group: tuple[int, ...], label: str,
          attrs: dict[str, Any]) -> dict[int, int]:
    """The channels' results joined per GPU (nothing to join for one channel)."""
    if len(parts) == 1:
        return parts[0]
    return fragment.done_syncs(graph, label, attrs, {g: [p[g] for p in parts] for g in group})


def ring_transfers(platform: Platform, group: tuple[int, ...], op: str) -> int:
    """How many transfer tasks the expanded ``ring`` algorithm needs for ``op`` on ``group``."""
    n = len(group)
    nch = len(ring_orders(platform, group))
    if op == "broadcast":
        return nch * max(n, BROADCAST_CHUNKS) * (n - 1)
    return nch * n * (2 * (n - 1) if op == "all_reduce" else n - 1)


def multi_ring(graph: TaskGraph, platform: Platform, group: tuple[int, ...], op: str, nbytes: int, label: str,
               pre: dict[int, list[int]], detail: str, attrs: dict[str, Any], base: float,
               root: int | None, nominal: float | None = None) -> dict[int, int]:
    """The ``ring`` algorithm: the payload split evenly over the topology's channels.

    ``nominal``: the (possibly fractional) payload times are computed from; default ``nbytes``.
    """
    size = float(nbytes) if nominal is None else nominal
    orders = ring_orders(platform, group)
    n, nch = len(group), len(orders)
    k = max(n, BROADCAST_CHUNKS)
    if fragment.resolve_detail(detail, ring_transfers(platform, group, op)) == "macro":
        phases = plans.plan(platform, group, op, size, "ring", root)
        if not base:  # a sub-collective of a hierarchical one: the call's latency is charged once
            phases = [Phase(p.name, p.steps, p.step_latency, p.link_load, 0.0, p.fill, scaled=p.scaled) for p in phases]
        return fragment.phase_macros(graph, platform, group, op, nbytes, phases, label, pre, attrs)
    shares = fragment.chunk_sizes(nbytes, nch)
    parts = []
    for ci, order in enumerate(orders):
        ring = make_ring(platform, order)
        lam = max(step_latency_s(platform, "ring", hop) for hop in ring.hops)
        # the channels' sends a GPU runs together are one kernel on the collective's SMs: each
        # channel holds its integer share of them (schedule.sm_sharing), not all of them
        tags = {**attrs, "channel": ci, "sm_part": (ci, nch)} if nch > 1 else attrs
        if op == "broadcast":
            parts.append(_chain(graph, platform, ring, shares[ci], size / nch, k, group[0] if root is None else root,
                                label, pre, tags, lam, base))
        else:
            parts.append(_ring_steps(graph, platform, ring, shares[ci], label, pre, tags, RING_PHASES[op],
                                     nominal=size / nch, lam=lam, base=base,
                                     step_latency=ring_step_latency_s(platform, ring.hops, n - 1)))
    return _join(graph, parts, group, label, attrs)
