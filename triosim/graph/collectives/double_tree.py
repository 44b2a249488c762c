"""NCCL's double binary tree all-reduce as a pipelined schedule of chunk transfers, and its time.

The trees are :func:`~triosim.graph.collectives.tree_shapes.tree_shapes`: on a node-structured
group, per channel two binary trees over the nodes with a chain through each node's GPUs, as
NCCL builds them; on a flat group two heap-ordered trees over the group's order and its reverse,
so the leaves of one are mostly inner GPUs of the other. Each of the T trees carries 1/T of the
payload, cut into k chunks. Chunk c is reduced **up** its tree (a GPU sends it to its parent
once it has received it from its children) and broadcast **down** (the root starts as soon as
it has reduced it; a GPU forwards it to its children once it has it). An edge sends its chunks
in order, so chunks pipeline.

Links carry one transfer at a time (under the flow model, a link m times wider than every
route crossing it carries m at once). Transfers that share a directed link (two children sending
into one GPU over its switch port, or the two trees meeting on a link) take it in the order of
the ideal pipeline's slots: the up transfer from a GPU of height h (leaves 0) in slot c + h,
the down transfer to a GPU at depth d in slot c + D + d − 1 (D: the tree's height), ties by
tree, direction and position. Every data dependency goes to a later slot, so this order is a
topological order of the schedule, and with a link's users chained in it no two transfers ever
share a link: the expanded task DAG takes the same time under the exclusive and the flow
network models, and that time is this plan's longest path (:func:`longest_path`), the closed
form of the tree.

Time of one transfer: its route's time for its chunk (link latencies included). The first
chunk also pays the per-step collective latency λ on every hop, before the transfer and on no
link (λ is the pipeline's start-up per hop, not wire time, and every tree of every channel waits
it out on its own connection, as NCCL's model charges 2·D·λ whatever the channel count): a
small message costs about 2·D·λ and a large one about (k + 2D − 1) chunk times.

Chunks: k = ⌈S / T / 512 KiB⌉ per tree (NCCL's Simple protocol moves a 4 MiB buffer in 8
steps of 512 KiB), at least 1, at most :data:`MAX_CHUNKS`, and fewer on large groups so that a
plan has at most :data:`TRANSFER_BUDGET` transfers.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...hardware.platform import Platform, gpu_node
from .fragment import chunk_sizes
from .ring_tree_links import UniformRing, uniform_ring
from .tree_shapes import TreeShape, tree_shapes

CHUNK_BYTES = 512 * 1024
MAX_CHUNKS = 64
# Caps k on large groups: a plan has 4(N−1)·k transfers and its longest path is walked once
# per group and payload size.
TRANSFER_BUDGET = 1 << 14


def chunks_per_tree(n: int, nbytes: float, trees: int = 2) -> int:
    """k, the number of chunks each of ``trees`` trees cuts its share of the payload into."""
    if n < 2:
        return 1
    want = max(1, math.ceil(nbytes / trees / CHUNK_BYTES))
    return max(1, min(want, MAX_CHUNKS, TRANSFER_BUDGET // (2 * trees * (n - 1))))


def heap_shape(n: int) -> tuple[list[int], list[int]]:
    """(height, depth) of every position of a heap-ordered binary tree of ``n`` nodes."""
    height = [0] * n
    for i in range(n - 1, 0, -1):
        p = (i - 1) // 2
        height[p] = max(height[p], height[i] + 1)
    depth = [(i + 1).bit_length() - 1 for i in range(n)]
    return height, depth


def tree_orders(group: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The GPU order each of the two heap trees of a flat group is heap-ordered over."""
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
    delay: list[float] = field(default_factory=list)  # λ (and the call's latency) before it, on no link
    duration: list[float] = field(default_factory=list)  # computed from the nominal chunk S / (T·k)
    latency: list[float] = field(default_factory=list)
    data_preds: list[tuple[int, ...]] = field(default_factory=list)  # data it needs first
    link_preds: list[tuple[int, ...]] = field(default_factory=list)  # earlier users of its links' lanes
    end: list[float] = field(default_factory=list)  # when each transfer ends when the plan runs alone

    def __len__(self) -> int:
        return len(self.src)


def _lanes(platform: Platform, routes: list[tuple[str, ...]]) -> dict[str, int]:
    """How many of the plan's transfers each link carries at once: 1, or under the flow model
    more on a link at least that many times wider than every route crossing it (a leaf's uplink
    to the spine, the NVLink legs of routes to another rail's NIC). Under the exclusive model a
    transfer reserves every link of its route whole, so every link has one lane."""
    if platform.network == "exclusive":
        return {x: 1 for route in routes for x in route}
    bandwidth: dict[str, float] = {}
    widest: dict[str, float] = {}
    for route in set(routes):
        for x in route:
            if x not in bandwidth:
                bandwidth[x] = platform.link_bandwidth(x)
        if route:
            rate = min(bandwidth[x] for x in route)
            for x in route:
                widest[x] = max(widest.get(x, 0.0), rate)
    return {x: max(1, int(bandwidth[x] / rate * (1 + 1e-12))) for x, rate in widest.items()}


def _links_of(platform: Platform, shapes: list[TreeShape]) -> tuple[dict, list[int], dict]:
    """The routes of the trees' edges, and the lane heaps each transfer takes: (route per
    (tree, direction, position), lanes of each heap, heap indices per (tree, direction, position)).

    A link's heap holds its lanes (when free, lane, last transfer); a transfer takes the lane
    free first. Links crossed by exactly the same routes, with as many lanes, see the same
    transfers in the same order, so their heaps stay equal: one heap stands for the group. On a
    ring a route crosses thousands of links but few groups, and each transfer pops one heap per
    group instead of one per link (the times and the lane picks are the same). None of this
    depends on the payload, so it is found once per tree shape and platform, for every payload.
    """
    key = ("tree-links", tuple((sh.gpu, sh.parent) for sh in shapes))
    hit = platform._plans.get(key)
    if hit is not None:
        return hit
    routes: dict[tuple[int, int, int], tuple[str, ...]] = {}
    for t, sh in enumerate(shapes):
        for i, p in enumerate(sh.parent):
            if p >= 0:
                a, b = gpu_node(sh.gpu[i]), gpu_node(sh.gpu[p])
                routes[(t, 0, i)] = platform.route(a, b)
                routes[(t, 1, i)] = platform.route(b, a)
    lanes = _lanes(platform, list(routes.values()))
    crossing: dict[str, list[int]] = {}
    distinct = list(dict.fromkeys(routes.values()))
    for r, route in enumerate(distinct):
        for x in route:
            crossing.setdefault(x, []).append(r)
    heap_of_key: dict[tuple, int] = {}
    heap_of_link: dict[str, int] = {}
    for x, users in crossing.items():
        heap_of_link[x] = heap_of_key.setdefault((lanes[x], tuple(users)), len(heap_of_key))
    lane_counts = [m for m, _users in heap_of_key]
    per_route = {route: tuple(dict.fromkeys(map(heap_of_link.__getitem__, route))) for route in distinct}
    hit = platform._plans[key] = (routes, lane_counts, {k: per_route[route] for k, route in routes.items()})
    return hit


def build_plan(platform: Platform, group: tuple[int, ...], nbytes: float,
               step_latency: Callable[[tuple[str, ...]], float], base: float = 0.0) -> TreePlan:
    """The pipelined transfers of an all-reduce of ``nbytes`` over ``group`` (≥ 2 GPUs), timed.

    ``step_latency(route)``: λ of a step over that route; ``base``: the per-call latency, added
    to each GPU's first send of the first chunk.
    """
    shapes = tree_shapes(platform, group)
    plan = TreePlan(chunks_per_tree(len(group), nbytes, len(shapes)))
    _walk(platform, shapes, nbytes, step_latency, base, plan)
    return plan


def plan_seconds(platform: Platform, group: tuple[int, ...], nbytes: float,
                 step_latency: Callable[[tuple[str, ...]], float], base: float = 0.0) -> float:
    """The time of :func:`build_plan`'s plan run alone (its longest path), without keeping the plan."""
    return _walk(platform, tree_shapes(platform, group), nbytes, step_latency, base, None)



def _feeds(parent: Sequence[int], children, t: int, down: int, i: int, c: int, k: int, n: int) -> list[int]:
    """The transfers that transfer (tree t, direction down, chunk c, position i) waits for, numbered
    ((t·2 + d)·k + c)·n + i: its children's up-transfers (or its parent's down-transfer), and its
    own previous chunk."""
    if down:
        p = parent[i]
        if parent[p] < 0:  # the root sends chunk c down once it has reduced it
            feed = [((t * 2) * k + c) * n + j for j in children[p]]
        else:
            feed = [((t * 2 + 1) * k + c) * n + p]
    else:
        feed = [((t * 2) * k + c) * n + j for j in children[i]]
    if c > 0:
        feed.append(((t * 2 + down) * k + c) * n + i - n)
    return feed

def _walk(platform: Platform, shapes: list[TreeShape], nbytes: float,
          step_latency: Callable[[tuple[str, ...]], float], base: float, plan: TreePlan | None) -> float:
    """Time the transfers in topological order (each starts when its data and its link lanes
    are free); with ``plan``, record them. Returns the time of the last one."""
    n = len(shapes[0].gpu)
    trees = len(shapes)
    k = chunks_per_tree(n, nbytes, trees)
    nominal = nbytes / (trees * k)
    shape_info = [(sh, sh.children(), *sh.height_depth()) for sh in shapes]
    ring = uniform_ring(platform) if plan is None else None
    if ring is not None:
        return _walk_ring(ring, shape_info, k, nominal, step_latency, base)
    routes, lane_counts, heap_index = _links_of(platform, shapes)
    # Per route: (time of a chunk, link latency, λ).
    times = {r: (platform.route_time(r, nominal), platform.route_time(r, 0.0), step_latency(r))
             for r in set(routes.values())}
    free = [[(0.0, j, -1) for j in range(m)] for m in lane_counts]
    heaps = {key: [free[h] for h in idx] for key, idx in heap_index.items()}
    keys = _slot_order(shape_info, k)
    # Transfer (tree t, direction d, chunk c, position i) is number ((t·2 + d)·k + c)·n + i.
    end = [0.0] * (2 * trees * k * n)
    pos = [0] * (2 * trees * k * n) if plan is not None else None
    sizes = [chunk_sizes(h, k) for h in chunk_sizes(int(nbytes), trees)] if plan is not None else None
    last = 0.0
    for _slot, t, down, i, c in keys:
        sh, children, _height, _depth = shape_info[t]
        me = ((t * 2 + down) * k + c) * n + i
        feed = _feeds(sh.parent, children, t, down, i, c, k, n)
        route = routes[(t, down, i)]
        chunk_s, link_s, lam = times[route]
        pops = heaps[(t, down, i)]
        if c:
            lam = 0.0
        first = base if (c == 0 and not feed) else 0.0
        # The step's latency runs before the bytes and holds no link (each channel's own
        # connection waits it out): the transfer starts once its data is there and λ is over.
        start = 0.0
        for f in feed:
            if end[f] > start:
                start = end[f]
        start += lam + first
        picks = []
        for heap in pops:
            at, lane, user = heapq.heappop(heap)
            picks.append((heap, lane, user))
            if at > start:
                start = at
        done = end[me] = start + chunk_s
        if done > last:
            last = done
        if plan is None:
            for heap, lane, _user in picks:
                heapq.heappush(heap, (done, lane, me))
            continue
        index = pos[me] = len(plan.src)
        for heap, lane, _user in picks:
            heapq.heappush(heap, (done, lane, index))
        a, b = sh.gpu[i], sh.gpu[sh.parent[i]]
        if down:
            a, b = b, a
        plan.tree.append(t)
        plan.up.append(not down)
        plan.chunk.append(c)
        plan.src.append(a)
        plan.dst.append(b)
        plan.route.append(route)
        plan.nbytes.append(sizes[t][c])
        plan.delay.append(lam + first)
        plan.duration.append(chunk_s)
        plan.latency.append(link_s)
        plan.data_preds.append(tuple(pos[f] for f in feed))
        plan.link_preds.append(tuple(dict.fromkeys(u for _h, _l, u in picks if u >= 0)))
        plan.end.append(done)
    return last


def _slot_order(shape_info: list, k: int) -> list[tuple[int, int, int, int, int]]:
    """(slot, tree, direction, position, chunk) of every transfer, sorted: a topological order.
    The up transfer from a position of height h goes in slot c + h, the down transfer to a
    position of depth d in slot c + D + d − 1 (D: the root's height)."""
    keys = []
    for t, (sh, _ch, height, depth) in enumerate(shape_info):
        top = max(height)
        for c in range(k):
            for i, p in enumerate(sh.parent):
                if p >= 0:
                    keys.append((c + height[i], t, 0, i, c))
                    keys.append((c + top + depth[i] - 1, t, 1, i, c))
    keys.sort()
    return keys


def _walk_ring(ring: UniformRing, shape_info: list, k: int, nominal: float,
               step_latency: Callable[[tuple[str, ...]], float], base: float) -> float:
    """:func:`_walk`'s time on a ring of alike links (:mod:`.ring_tree_links`): each link has
    one lane, so a lane heap holds one entry, the end of the link's last transfer; a transfer
    waits for the largest over its arc's links, and leaves them all busy until it ends. The
    same maxima in the same order as the heaps: the same time, in O(arc) array slices."""
    n = len(shape_info[0][0].gpu)
    lam0 = step_latency(ring.probe)
    # Per direction, each link's free time: numpy arrays, so that the largest over an arc and
    # the arc's new free time are one call each (arcs of a heap tree span up to half the ring).
    free = [np.zeros(ring.n), np.zeros(ring.n)]
    arcs = {}
    for t, (sh, _ch, _h, _d) in enumerate(shape_info):
        for i, p in enumerate(sh.parent):
            if p >= 0:
                a, b = sh.gpu[i], sh.gpu[p]
                for down, (src, dst) in ((0, (a, b)), (1, (b, a))):
                    spans = [(free[d], lo, hi) for d, lo, hi in ring.spans(src, dst)]
                    arcs[(t, down, i)] = (spans, ring.route_time(ring.hops(src, dst), nominal))
    end = [0.0] * (2 * len(shape_info) * k * n)
    last = 0.0
    for _slot, t, down, i, c in _slot_order(shape_info, k):
        sh, children, _height, _depth = shape_info[t]
        me = ((t * 2 + down) * k + c) * n + i
        feed = _feeds(sh.parent, children, t, down, i, c, k, n)
        spans, chunk_s = arcs[(t, down, i)]
        first = base if (c == 0 and not feed) else 0.0
        start = 0.0
        for f in feed:
            if end[f] > start:
                start = end[f]
        start += (0.0 if c else lam0) + first
        for links, lo, hi in spans:
            at = links[lo:hi].max()
            if at > start:
                start = float(at)
        done = end[me] = start + chunk_s
        if done > last:
            last = done
        for links, lo, hi in spans:
            links[lo:hi] = done
    return last


def longest_path(plan: TreePlan) -> float:
    """The time of the plan run alone (its longest path from the start)."""
    return max(plan.end, default=0.0)


__all__ = ["CHUNK_BYTES", "MAX_CHUNKS", "TRANSFER_BUDGET", "TreePlan", "build_plan", "chunks_per_tree",
           "heap_shape", "longest_path", "plan_seconds", "tree_orders"]
