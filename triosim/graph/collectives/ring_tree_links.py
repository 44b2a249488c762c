"""The double binary tree's links on the built-in ``ring`` topology, in closed form.

On a ring whose links are all alike (same latency, bandwidth and kind), the route between two
GPUs is an arc: ``hops`` consecutive links up or down the ring (:func:`ring_arc`). The tree's
bookkeeping then needs no route's link names:

- a route's time for ``b`` bytes is its links' latencies summed in order plus ``b`` at the one
  bandwidth; the sum of ``h`` equal latencies is kept per ``h``, added in the same order, so it
  is bit for bit what the platform's route time adds;
- every link carries one transfer at a time (its bandwidth is every crossing route's rate, so
  the flow model gives it one lane too), and after a transfer each link of its arc is free when
  the transfer ends: a link's free time is a float per link, and a transfer waits for the
  largest over its arc (a slice of an array, not a heap per link group);
- a link's load is the tree's per-tree share times the number of arcs crossing it, found with a
  difference array, and summed share by share as the route-by-route sum adds it; the links come
  in the order the routes first cross them, as the route-by-route dict has them.

A route's λ depends only on the kinds of its links, all alike here, so one one-hop route
stands for all. Anything else (a topology file, remote memory, unlike links) is None: the
callers walk the routes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...hardware.platform import Platform, gpu_node, link_name
from ...hardware.ring_routes import ring_arc


@dataclass
class UniformRing:
    """A ring of ``n`` alike links each way: GPU i's up link goes to i + 1, its down link to i − 1."""

    n: int
    latency: float
    bandwidth: float
    probe: tuple[str, ...]  # a one-hop route: every route's λ is its λ
    _latency_sums: list[float] = field(default_factory=lambda: [0.0])

    def route_latency(self, hops: int) -> float:
        """The latencies of ``hops`` links, summed one by one from 0.0 (as the platform sums a route's)."""
        sums = self._latency_sums
        while len(sums) <= hops:
            sums.append(sums[-1] + self.latency)
        return sums[hops]

    def route_time(self, hops: int, nbytes: float) -> float:
        """The platform's time of a route of ``hops`` links for ``nbytes`` (0 for none, as the
        platform's empty route from a GPU to itself)."""
        if not hops:
            return 0.0
        return self.route_latency(hops) + nbytes / self.bandwidth

    def spans(self, src: int, dst: int) -> list[tuple[int, int, int]]:
        """(direction 0 up / 1 down, first link, end link) slices of the links the route from
        ``src`` to ``dst`` crosses: up link j joins j → j + 1, down link j joins j → j − 1."""
        step, hops = ring_arc(self.n, src, dst)
        if step == 1:
            lo, direction = src, 0
        else:
            lo, direction = (src - hops + 1) % self.n, 1
        hi = lo + hops
        if hi <= self.n:
            return [(direction, lo, hi)]
        return [(direction, lo, self.n), (direction, 0, hi - self.n)]

    def hops(self, src: int, dst: int) -> int:
        return ring_arc(self.n, src, dst)[1]


def uniform_ring(platform: Platform) -> UniformRing | None:
    """The platform's ring when it is the built-in one of alike links (found once), else None."""
    key = ("uniform-ring",)
    if key in platform._plans:
        return platform._plans[key]
    platform._plans[key] = hit = _find(platform)
    return hit


def _find(platform: Platform) -> UniformRing | None:
    n = platform.num_gpus
    # Two GPUs share one link each way, which the up/down bookkeeping would count twice.
    if platform.topology != "ring" or platform.router is not None or n < 3:
        return None
    seen = set()
    for i in range(n):
        for j in ((i + 1) % n, (i - 1) % n):
            try:
                attrs = platform.link(link_name(gpu_node(i), gpu_node(j)))
            except KeyError:
                return None
            seen.add((attrs["latency"], attrs["bandwidth"], attrs.get("kind", "nvlink")))
    if len(seen) != 1:
        return None
    latency, bandwidth, _kind = seen.pop()
    return UniformRing(n, latency, bandwidth, platform.route(gpu_node(0), gpu_node(1)))


def arc_counts(ring: UniformRing, pairs: list[tuple[int, int]]) -> list[list[int]]:
    """How many of the routes from ``src`` to ``dst`` (``pairs``) cross each link: [up, down]."""
    diff = [[0] * (ring.n + 1), [0] * (ring.n + 1)]
    for src, dst in pairs:
        for direction, lo, hi in ring.spans(src, dst):
            diff[direction][lo] += 1
            diff[direction][hi] -= 1
    out = []
    for d in diff:
        run, counts = 0, []
        for v in d[:-1]:
            run += v
            counts.append(run)
        out.append(counts)
    return out


def arc_load(ring: UniformRing, pairs: list[tuple[int, int]], share: float) -> dict[str, float]:
    """Bytes per link when each route from ``src`` to ``dst`` (``pairs``) carries ``share``: what
    adding ``share`` on every link of every route, route by route, gives (the walk), keyed in the
    order the routes first cross the links as the walk's dict is, without a route's link names.
    A link crossed c times holds ``share`` added c times from 0.0 (:func:`repeated_sums`)."""
    counts = arc_counts(ring, pairs)
    crossed = sum(1 for direction in counts for c in direction if c)
    if not crossed:
        return {}
    sums = repeated_sums(share, max(max(direction) for direction in counts))
    seen = [np.zeros(ring.n, dtype=bool), np.zeros(ring.n, dtype=bool)]
    order: list[tuple[int, int]] = []
    for src, dst in pairs:
        spans = ring.spans(src, dst)
        if spans[0][0] == 1:  # down the ring: from src to the arc's low end, wrapping below 0
            runs = [np.arange(hi - 1, lo - 1, -1) for _d, lo, hi in reversed(spans)]
        else:
            runs = [np.arange(lo, hi) for _d, lo, hi in spans]
        direction = spans[0][0]
        for run in runs:
            new = run[~seen[direction][run]]
            seen[direction][new] = True
            order.extend((direction, j) for j in new.tolist())
        if len(order) == crossed:  # every crossed link met: later routes add no new key
            break
    n = ring.n
    return {link_name(gpu_node(j), gpu_node((j + 1) % n if d == 0 else (j - 1) % n)): sums[counts[d][j]]
            for d, j in order}


def repeated_sums(value: float, most: int) -> list[float]:
    """``value`` added to 0.0 one time, two times, … ``most`` times: the sums, index = times."""
    out = [0.0]
    for _ in range(most):
        out.append(out[-1] + value)
    return out


__all__ = ["UniformRing", "arc_counts", "arc_load", "repeated_sums", "uniform_ring"]
