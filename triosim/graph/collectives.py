"""Collective communication over a group of GPUs: ring all-reduce, reduce-scatter, all-gather
and broadcast, as task-DAG fragments.

Every collective comes in two forms that give the same time when run in isolation:

- **expanded**: one ``transfer`` task per ring step and GPU, each holding the links of its ring
  hop, with the data dependencies of the algorithm (a GPU forwards a chunk only after it has
  received it). Exact under contention with other traffic; O(N²) tasks.
- **macro**: one ``collective`` task that holds every link of the ring for the closed-form time.
  O(1) tasks, used for large groups.

The payload S is split into N chunks whose integer sizes sum to S exactly (the first ``S mod N``
chunks get one byte more). Transfer durations use the nominal chunk S/N, so the expanded form
reproduces the closed form exactly; the byte counts stay integral and conserved.

With W and α the bandwidth and total latency of the slowest ring hop (the one whose transfer of
S/N bytes takes longest) the closed forms are

- all-reduce (reduce-scatter then all-gather): ``2(N−1)(α + S/(N·W))``
- reduce-scatter, all-gather (S = the full, gathered size): ``(N−1)(α + S/(N·W))``
- broadcast (pipelined chain from the root in ring order, N chunks): ``2(N−1)(α + S/(N·W))``

Each builder returns ``{gpu: sync task}``; the sync ends when that GPU holds the result and its
own sends are done, so a caller chains the GPU's next work after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..platform import Platform, gpu_node
from .tasks import TaskGraph

DETAILS = ("auto", "expanded", "macro")
# "auto" expands a collective while it needs at most this many transfer tasks.
EXPAND_LIMIT = 512

After = Iterable[int] | Mapping[int, Iterable[int]]


# ----------------------------------------------------------------------------- closed forms


def ring_step_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """One ring step: a chunk of ``nbytes / n`` over a hop of ``bandwidth`` B/s, ``latency`` s."""
    return latency + nbytes / (n * bandwidth)


def ring_all_reduce_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` GPUs: ``2(n−1)(α + S/(n·W))``."""
    if n < 2:
        return 0.0
    return 2 * (n - 1) * ring_step_time(nbytes, n, bandwidth, latency)


def ring_reduce_scatter_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Ring reduce-scatter of ``nbytes`` (each GPU keeps 1/n): ``(n−1)(α + S/(n·W))``."""
    if n < 2:
        return 0.0
    return (n - 1) * ring_step_time(nbytes, n, bandwidth, latency)


def ring_all_gather_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Ring all-gather to ``nbytes`` in total (each GPU brings 1/n): ``(n−1)(α + S/(n·W))``."""
    return ring_reduce_scatter_time(n, nbytes, bandwidth, latency)


def ring_broadcast_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Pipelined chain broadcast in n chunks over n−1 hops: ``2(n−1)(α + S/(n·W))``."""
    return ring_all_reduce_time(n, nbytes, bandwidth, latency)


def chunk_sizes(nbytes: int, n: int) -> list[int]:
    """``n`` integer chunk sizes summing to ``nbytes``; the first ``nbytes mod n`` get one more."""
    base, extra = divmod(int(nbytes), n)
    return [base + (1 if c < extra else 0) for c in range(n)]


# ----------------------------------------------------------------------------- the ring


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
    order = tuple(int(g) for g in group)
    if len(set(order)) != len(order):
        raise ValueError(f"collective group has repeated GPUs: {order}")
    for g in order:
        if not 0 <= g < platform.num_gpus:
            raise ValueError(f"GPU {g} is not on the platform ({platform.num_gpus} GPUs)")
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


def _resolve_detail(detail: str, transfers: int) -> str:
    if detail not in DETAILS:
        raise ValueError(f"collective detail must be one of {DETAILS}, got {detail!r}")
    if detail == "auto":
        return "expanded" if transfers <= EXPAND_LIMIT else "macro"
    return detail


def _preds(graph: TaskGraph, group: tuple[int, ...], after: After, label: str) -> dict[int, list[int]]:
    """Per-GPU predecessors; common predecessors are joined once so edges stay O(N)."""
    if isinstance(after, Mapping):
        return {g: list(after.get(g, ())) for g in group}
    common = list(after)
    if len(common) > 1 and len(group) > 1:
        common = [graph.add_sync(f"{label} start", common, devices=group)]
    return {g: common for g in group}


def _trivial(graph: TaskGraph, group: tuple[int, ...], pre: dict[int, list[int]], label: str,
             attrs: dict[str, Any]) -> dict[int, int]:
    tags = {"collective": label, **attrs}
    return {g: graph.add_sync(f"{label} done gpu{g}", pre[g], devices=(g,), **tags) for g in group}


def _hop_transfer(graph: TaskGraph, platform: Platform, ring: Ring, pos: int, nbytes: int,
                  duration: float, label: str, after: list[int], attrs: dict[str, Any]) -> int:
    """A transfer of ``nbytes`` from ring position ``pos`` to ``pos + 1`` taking ``duration``."""
    src = ring.group[pos]
    dst = ring.group[(pos + 1) % ring.n]
    return graph.add_task(
        "transfer", label, duration, ring.hops[pos], (src, dst), nbytes, after=after,
        src=gpu_node(src), dst=gpu_node(dst), **attrs,
    )


def _macro(graph: TaskGraph, ring: Ring, op: str, nbytes: int, duration: float, link_bytes: int,
           label: str, pre: dict[int, list[int]], attrs: dict[str, Any], hops: Iterable[int] | None = None,
           ) -> dict[int, int]:
    deps = list(dict.fromkeys(p for g in ring.group for p in pre[g]))
    tags = {"collective": label, **attrs}
    task = graph.add_task(
        "collective", label, duration, ring.links(hops), ring.group, nbytes, after=deps,
        **{"op": op, **tags, "link_bytes": link_bytes},
    )
    return {g: graph.add_sync(f"{label} done gpu{g}", [task], devices=(g,), **tags) for g in ring.group}


def _ring_steps(graph: TaskGraph, platform: Platform, ring: Ring, nbytes: int, label: str,
                pre: dict[int, list[int]], attrs: dict[str, Any], phases: Sequence[tuple[str, int]],
                ) -> dict[int, int]:
    """Expanded ring phases, back to back. ``phases``: (name, chunk offset) per phase of N−1 steps.

    In step k of a phase with offset o, the GPU at ring position i sends chunk (i + o − k) mod N
    to position i+1: that is the chunk it received in the previous step, so following one chunk
    around the ring visits every GPU. Reduce-scatter has o = 0, all-gather after it o = 1
    (position i then owns the reduced chunk i+1), a standalone all-gather o = 0.
    """
    n = ring.n
    chunks = chunk_sizes(nbytes, n)
    step_s = [platform.route_time(ring.hops[i], nbytes / n) for i in range(n)]
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
                new.append(_hop_transfer(
                    graph, platform, ring, i, chunks[c], step_s[i],
                    f"{label} {phase}{k} gpu{src}->gpu{dst}", deps,
                    {"collective": label, "phase": phase, "step": k_total, "chunk": c, **attrs},
                ))
            for i in range(n):
                sent[i] = new[i]
                last[i] = [new[i]]
            k_total += 1
    tags = {"collective": label, **attrs}
    return {
        g: graph.add_sync(f"{label} done gpu{g}", [sent[i], sent[(i - 1) % n]], devices=(g,), **tags)
        for i, g in enumerate(ring.group)
    }


def _ring_collective(graph: TaskGraph, platform: Platform, group: Sequence[int], nbytes: int,
                     label: str, after: After, detail: str, attrs: dict[str, Any], op: str,
                     phases: Sequence[tuple[str, int]]) -> dict[int, int]:
    if nbytes < 0:
        raise ValueError(f"{label}: negative payload {nbytes}")
    ring = make_ring(platform, group)
    pre = _preds(graph, ring.group, after, label)
    n = ring.n
    if n < 2:
        return _trivial(graph, ring.group, pre, label, attrs)
    steps = len(phases) * (n - 1)
    if _resolve_detail(detail, steps * n) == "expanded":
        return _ring_steps(graph, platform, ring, nbytes, label, pre, attrs, phases)
    bw, lat = slowest_hop(platform, ring, nbytes)
    duration = steps * ring_step_time(nbytes, n, bw, lat)
    return _macro(graph, ring, op, nbytes, duration, steps * nbytes // n, label, pre, attrs)


# ----------------------------------------------------------------------------- public API


def add_all_reduce(graph: TaskGraph, platform: Platform, group: Sequence[int], nbytes: int, label: str,
                   after: After = (), detail: str = "auto", **attrs: Any) -> dict[int, int]:
    """Ring all-reduce of ``nbytes`` on every GPU of ``group`` (in ring order).

    ``after``: common predecessors, or ``{gpu: predecessors}`` (a GPU's first send waits for
    its own). Returns ``{gpu: sync}``: the GPU holds the reduced buffer when the sync ends.
    """
    return _ring_collective(graph, platform, group, nbytes, label, after, detail, attrs,
                            "all_reduce", (("rs", 0), ("ag", 1)))


def add_reduce_scatter(graph: TaskGraph, platform: Platform, group: Sequence[int], nbytes: int, label: str,
                       after: After = (), detail: str = "auto", **attrs: Any) -> dict[int, int]:
    """Ring reduce-scatter of an ``nbytes`` buffer; GPU at ring position i keeps chunk i+1."""
    return _ring_collective(graph, platform, group, nbytes, label, after, detail, attrs,
                            "reduce_scatter", (("rs", 0),))


def add_all_gather(graph: TaskGraph, platform: Platform, group: Sequence[int], nbytes: int, label: str,
                   after: After = (), detail: str = "auto", **attrs: Any) -> dict[int, int]:
    """Ring all-gather into an ``nbytes`` buffer; GPU at ring position i brings chunk i."""
    return _ring_collective(graph, platform, group, nbytes, label, after, detail, attrs,
                            "all_gather", (("ag", 0),))


def add_broadcast(graph: TaskGraph, platform: Platform, group: Sequence[int], nbytes: int, label: str,
                  root: int, after: After = (), detail: str = "auto", **attrs: Any) -> dict[int, int]:
    """Broadcast ``nbytes`` from ``root`` along the ring (root, next, …), pipelined in N chunks.

    Chunk c crosses hop p (p = 1 … N−1 from the root) after it crossed hop p−1 and after chunk
    c−1 crossed hop p, so the last chunk arrives after 2(N−1) chunk times.
    """
    if nbytes < 0:
        raise ValueError(f"{label}: negative payload {nbytes}")
    ring = make_ring(platform, group)
    if root not in ring.group:
        raise ValueError(f"{label}: broadcast root {root} is not in the group {ring.group}")
    pre = _preds(graph, ring.group, after, label)
    n = ring.n
    if n < 2:
        return _trivial(graph, ring.group, pre, label, attrs)
    r = ring.group.index(root)
    hop_idx = [(r + p) % n for p in range(n - 1)]  # ring position sending over the p-th hop
    if _resolve_detail(detail, n * (n - 1)) == "macro":
        bw, lat = slowest_hop(platform, ring, nbytes, hop_idx)
        return _macro(graph, ring, "broadcast", nbytes, ring_broadcast_time(n, nbytes, bw, lat), nbytes,
                      label, pre, attrs, hops=hop_idx)
    chunks = chunk_sizes(nbytes, n)
    prev_hop: list[int] | None = None
    last_send: dict[int, int] = {}
    last_recv: dict[int, int] = {}
    for pos in hop_idx:
        src, dst = ring.group[pos], ring.group[(pos + 1) % n]
        dur = platform.route_time(ring.hops[pos], nbytes / n)
        row: list[int] = []
        for c in range(n):
            deps = list(pre[src]) if c == 0 else [row[-1]]
            if prev_hop is not None:
                deps.append(prev_hop[c])
            row.append(_hop_transfer(
                graph, platform, ring, pos, chunks[c], dur, f"{label} bc{c} gpu{src}->gpu{dst}", deps,
                {"collective": label, "phase": "bc", "chunk": c, **attrs},
            ))
        last_send[src] = row[-1]
        last_recv[dst] = row[-1]
        prev_hop = row
    out = {}
    for g in ring.group:
        deps = [t for t in (last_send.get(g), last_recv.get(g)) if t is not None]
        if g not in last_send:
            deps.extend(pre[g])  # the chain's end sends nothing: still respect its predecessors
        out[g] = graph.add_sync(f"{label} done gpu{g}", deps, devices=(g,), **{"collective": label, **attrs})
    return out


__all__ = [
    "DETAILS",
    "EXPAND_LIMIT",
    "add_all_gather",
    "add_all_reduce",
    "add_broadcast",
    "add_reduce_scatter",
    "chunk_sizes",
    "ring_all_gather_time",
    "ring_all_reduce_time",
    "ring_broadcast_time",
    "ring_reduce_scatter_time",
]
