"""NCCL's double binary tree all-reduce as a pipelined schedule of chunk transfers, and its time.

Two binary trees span the group: tree 0 is heap-ordered over the group's order (the parent of
position i is (i − 1) // 2), tree 1 is the same over the reversed order, so the leaves of one are
mostly inner GPUs of the other. Each tree carries half of the payload, cut into k chunks. Chunk
c is reduced **up** its tree (a GPU sends it to its parent once it has received it from its
children) and broadcast **down** (the root starts as soon as it has reduced it; a GPU forwards
it to its children once it has it). An edge sends its chunks in order, so chunks pipeline.

Links carry one transfer at a time. Transfers that share a directed link (two children sending
into one GPU over its switch port, or the two trees meeting on a link) take it in the order of
the ideal pipeline's slots: the up transfer from a GPU of height h (leaves 0) in slot c + h,
the down transfer to a GPU at depth d in slot c + D + d − 1 (D: the tree's height), ties by
tree, direction and position. Every data dependency goes to a later slot, so this order is a
topological order of the schedule, and with a link's users chained in it no two transfers ever
share a link: the expanded task DAG takes the same time under the exclusive and the flow
network models, and that time is this plan's longest path (:func:`longest_path`), the closed
form of the tree.

Time of one transfer: its route's time for its chunk (link latencies included). The first
chunk also pays the per-step collective latency λ on every hop: λ is the pipeline's start-up
per hop, so a small message costs about 2·D·λ and a large one about (k + 2D − 1) chunk times.

Chunks: k = ⌈S / 2 / 512 KiB⌉ per tree (NCCL's Simple protocol moves a 4 MiB buffer in 8
steps of 512 KiB), at least 1, at most :data:`MAX_CHUNKS`, and fewer on large groups so that a
plan has at most :data:`TRANSFER_BUDGET` transfers.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..platform import Platform, gpu_node

CHUNK_BYTES = 512 * 1024
MAX_CHUNKS = 64
# Caps k on large groups: a plan has 4(N−1)·k transfers and its longest path is walked once
# per group and payload size.
TRANSFER_BUDGET = 1 << 14


def chunks_per_tree(n: int, nbytes: float) -> int:
    """k, the number of chunks each tree cuts its half of the payload into (see the module doc)."""
    if n < 2:
        return 1
    want = max(1, math.ceil(nbytes / 2 / CHUNK_BYTES))
    return max(1, min(want, MAX_CHUNKS, TRANSFER_BUDGET // (4 * (n - 1))))


def heap_shape(n: int) -> tuple[list[int], list[int]]:
    """(height, depth) of every position of a heap-ordered binary tree of ``n`` nodes."""
    height = [0] * n
    for i in range(n - 1, 0, -1):
        p = (i - 1) // 2
        height[p] = max(height[p], height[i] + 1)
    depth = [(i + 1).bit_length() - 1 for i in range(n)]
    return height, depth


def tree_orders(group: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The GPU order each of the two trees is heap-ordered over."""
    return group, group[::-1]


@dataclass
class TreePlan:
    """The transfers of a double binary tree all-reduce, in a topological order (columns)."""

    k: int
    tree: list[int] = field(default_factory=list)
    up: list[bool] = field(default_factory=list)
    chunk: list[int] = field(default_factory=list)
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    route: list[tuple[str, ...]] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)  # integer bytes; they add up to the payload per tree
    duration: list[float] = field(default_factory=list)  # computed from the nominal chunk S / (2k)
    latency: list[float] = field(default_factory=list)
    data_preds: list[tuple[int, ...]] = field(default_factory=list)  # data it needs first
    link_preds: list[tuple[int, ...]] = field(default_factory=list)  # earlier users of its links' lanes
    end: list[float] = field(default_factory=list)  # when each transfer ends when the plan runs alone

    def __len__(self) -> int:
        return len(self.src)


def _split(nbytes: int, parts: int) -> list[int]:
    base, extra = divmod(int(nbytes), parts)
    return [base + (1 if c < extra else 0) for c in range(parts)]


def _lanes(platform: Platform, routes: list[tuple[str, ...]]) -> dict[str, int]:
    """How many of the plan's transfers each link carries at once: 1, or more on a link at least
    that many times wider than every route crossing it (a leaf's uplink to the spine)."""
    widest: dict[str, float] = {}
    for route in routes:
        if route:
            rate = min(platform.link_bandwidth(x) for x in route)
            for x in route:
                widest[x] = max(widest.get(x, 0.0), rate)
    return {x: max(1, int(platform.link_bandwidth(x) / rate * (1 + 1e-12))) for x, rate in widest.items()}


def build_plan(platform: Platform, group: tuple[int, ...], nbytes: float,
               step_latency: Callable[[tuple[str, ...]], float], base: float = 0.0) -> TreePlan:
    """The pipelined transfers of an all-reduce of ``nbytes`` over ``group`` (≥ 2 GPUs), timed.

    ``step_latency(route)``: λ of a step over that route; ``base``: the per-call latency, added
    to each GPU's first send of the first chunk.
    """
    n = len(group)
    k = chunks_per_tree(n, nbytes)
    height, depth = heap_shape(n)
    top = height[0]
    nominal = nbytes / (2 * k)
    halves = _split(int(nbytes), 2)
    orders = tree_orders(group)
    routes = {}
    for t in range(2):
        seq = orders[t]
        for i in range(1, n):
            a, b = gpu_node(seq[i]), gpu_node(seq[(i - 1) // 2])
            routes[(t, 0, i)] = platform.route(a, b)
            routes[(t, 1, i)] = platform.route(b, a)
    # Per route: (time of a chunk, link latency, λ).
    times = {r: (platform.route_time(r, nominal), platform.route_time(r, 0.0), step_latency(r))
             for r in set(routes.values())}
    lanes = _lanes(platform, list(routes.values()))
    # (slot, tree, direction, position, chunk): sorting gives the topological order.
    keys = []
    for t in range(2):
        for c in range(k):
            for i in range(1, n):
                keys.append((c + height[i], t, 0, i, c))
                keys.append((c + top + depth[i] - 1, t, 1, i, c))
    keys.sort()
    plan = TreePlan(k)
    index: dict[tuple[int, int, int, int], int] = {}
    # Per link, a heap of its lanes (when free, lane, last transfer): a transfer takes the lane free first.
    free: dict[str, list[tuple[float, int, int]]] = {}
    end = plan.end
    sizes = [_split(h, k) for h in halves]
    for _slot, t, down, i, c in keys:
        seq = orders[t]
        parent = (i - 1) // 2
        if down:
            a, b = seq[parent], seq[i]
            feed = [index[(t, 0, c, j)] for j in (1, 2) if j < n] if parent == 0 else [index[(t, 1, c, parent)]]
        else:
            a, b = seq[i], seq[parent]
            feed = [index[(t, 0, c, j)] for j in (2 * i + 1, 2 * i + 2) if j < n]
        if c > 0:
            feed.append(index[(t, down, c - 1, i)])
        route = routes[(t, down, i)]
        chunk_s, link_s, lam = times[route]
        lam = lam if c == 0 else 0.0
        first = base if (c == 0 and not feed) else 0.0
        pos = len(plan.src)
        index[(t, down, c, i)] = pos
        start = max((end[p] for p in feed), default=0.0)
        users = []
        picks = []
        for x in route:
            heap = free.get(x)
            if heap is None:
                heap = free[x] = [(0.0, j, -1) for j in range(lanes[x])]
            at, lane, user = heapq.heappop(heap)
            picks.append((heap, lane))
            start = max(start, at)
            if user >= 0:
                users.append(user)
        duration = chunk_s + lam + first
        end.append(start + duration)
        for heap, lane in picks:
            heapq.heappush(heap, (end[pos], lane, pos))
        plan.tree.append(t)
        plan.up.append(not down)
        plan.chunk.append(c)
        plan.src.append(a)
        plan.dst.append(b)
        plan.route.append(route)
        plan.nbytes.append(sizes[t][c])
        plan.duration.append(duration)
        plan.latency.append(link_s + lam + first)
        plan.data_preds.append(tuple(feed))
        plan.link_preds.append(tuple(dict.fromkeys(users)))
    return plan


def longest_path(plan: TreePlan) -> float:
    """The time of the plan run alone (its longest path from the start)."""
    return max(plan.end, default=0.0)


__all__ = ["CHUNK_BYTES", "MAX_CHUNKS", "TRANSFER_BUDGET", "TreePlan", "build_plan", "chunks_per_tree",
           "heap_shape", "longest_path", "tree_orders"]
