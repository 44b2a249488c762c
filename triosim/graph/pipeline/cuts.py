"""Bounds and cuts for the partitioner: the tightest bound on a stage's weight, and the
least-cost cuts under many bounds at once (the partitioner's dynamic programme in numpy).

:func:`min_max_bound` is the smallest bound on a stage's weight that the stages can meet (the
greedy fill, bisected): the bound grids of the time and optimal searches start from it.

:func:`min_cut_starts_many` gives, for each bound on a stage's weight, the stage starts that
minimise the summed cut costs with every stage's weight under the bound (and, optionally, a
needed position in every stage): the same answer, to the last bit and the same tie-breaking, as
the reference one-bound programme :func:`triosim.graph.pipeline.partition._min_cut_starts`.

That programme runs, per stage j and end position i, a sliding-window minimum over the
feasible starts a of the stage: ``g[a] = best cost of j stages ending at a, plus the cost of
cutting at a``, with the window [lo(i), hi(i)] (lo: the first start that keeps the stage's
weight under the bound; hi: the last one that keeps a needed position in the stage). Its deque
keeps the most recent of equal values, so it answers the *rightmost* position of the window's
minimum. Here every window of every bound is answered at once from a sparse table of minima
(the minimum of ``g`` over each [a, a + 2^k)), and the rightmost position of the minimum is
looked up only along the chosen path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


def _greedy_parts(weights: Sequence[float], bound: float) -> int:
    """How many contiguous stages of weight ≤ ``bound`` the greedy fill needs."""
    parts, acc = 1, 0.0
    for w in weights:
        if acc + w > bound and acc > 0:
            parts += 1
            acc = 0.0
        acc += w
    return parts


def min_max_bound(weights: Sequence[float], n: int) -> float:
    """Smallest bound on a stage's weight that n contiguous stages can meet (bisection)."""
    lo, hi = max(weights, default=0.0), float(sum(weights))
    if lo <= 0.0:
        return 0.0
    for _ in range(64):
        mid = (lo + hi) / 2
        if _greedy_parts(weights, mid) <= n:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def first_feasible_start(prefix: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """lo[b, i]: the first start a ≤ i with ``prefix[i] - prefix[a] <= limits[b]``, the
    reference's own floating-point test (the difference only shrinks as a grows)."""
    ends = prefix[None, :]
    lo = np.searchsorted(prefix, (ends - limits[:, None]).ravel(), side="left").reshape(len(limits), -1)
    lo = np.minimum(lo, np.arange(len(prefix))[None, :])
    # The search is on prefix[i] - limit, a rounded value: step to the exact first start.
    while True:
        prev = np.maximum(lo - 1, 0)
        back = (lo > 0) & (ends - np.take(prefix, prev) <= limits[:, None])
        ahead = ends - np.take(prefix, lo) > limits[:, None]
        if not back.any() and not ahead.any():
            return lo
        lo = np.where(back, lo - 1, np.where(ahead, lo + 1, lo))


def min_cut_starts_many(prefix: Sequence[float], layer_costs: Callable[[int], np.ndarray], n: int,
                        bounds: Sequence[float], need: Sequence[bool] | None = None) -> list[list[int] | None]:
    """Per bound, the n stage starts of least total cut cost (None: no partition meets it).

    ``prefix``: prefix sums of the position weights (len nf + 1). ``layer_costs(j)``: an array
    (bounds × nf) whose [b, k] is the cost of starting stage j ≥ 1 at position k + 1 under bound
    b (``inf``: not allowed). ``need``: every stage holds a position where it is true.
    """
    nf = len(prefix) - 1
    nb = len(bounds)
    if nb == 0:
        return []
    p = np.asarray(prefix, dtype=np.float64)
    limits = np.array([b * (1 + 1e-9) + 1e-15 for b in bounds])
    latest = [-1] * (nf + 1)
    for i in range(1, nf + 1):
        latest[i] = i - 1 if need is None or need[i - 1] else latest[i - 1]
    hi = np.array(latest[1:], dtype=np.intp)  # windows of end positions 1..nf
    lo = first_feasible_start(p, limits)[:, 1:]
    empty = lo > hi[None, :]
    lo_q = np.where(empty, 0, lo)
    hi_q = np.broadcast_to(np.where(hi < 0, 0, hi), lo_q.shape)
    hi_q = np.where(empty, 0, hi_q)
    span = hi_q - lo_q + 1
    level = np.zeros(span.shape, dtype=np.intp)
    while True:  # floor(log2(span)), exactly, without floating point
        grow = (2 << level) <= span
        if not grow.any():
            break
        level += grow
    right = hi_q - (1 << level) + 1
    width = nf + 1
    depth = int(level.max()) + 1
    # Flat positions in the sparse table of each window's two halves (the same for every stage).
    base = level * (nb * width) + np.arange(nb)[:, None] * width
    left_at, right_at = (base + lo_q).ravel(), (base + right).ravel()
    table = np.full((depth, nb, width), math.inf)
    flat = table.reshape(-1)
    prev = np.full((nb, width), math.inf)
    prev[:, 0] = 0.0
    gains: list[np.ndarray] = []  # per stage: g over the starts, per bound
    minima: list[np.ndarray] = []  # per stage: each window's minimum, per bound and end position
    for j in range(n):
        g = prev.copy()
        if j > 0:  # the first stage starts at 0, at no cost
            g[:, 1:] += layer_costs(j)
        gains.append(g)
        table[0] = g
        for k in range(1, depth):
            w = 1 << (k - 1)
            np.minimum(table[k - 1, :, : width - w], table[k - 1, :, w:], out=table[k, :, : width - w])
        best = np.minimum(flat.take(left_at), flat.take(right_at)).reshape(nb, nf)
        best[empty] = math.inf
        minima.append(best)
        cur = np.full((nb, width), math.inf)
        cur[:, 1:] = best
        prev = cur
    # Back from the last position, all bounds at once: each stage starts at the rightmost start
    # in its window that has the window's minimum (the deque's answer).
    rows = np.flatnonzero(prev[:, nf] < math.inf)
    starts = np.zeros((nb, n), dtype=np.intp)
    i = np.full(len(rows), nf)
    column = np.arange(width)[None, :]
    for j in range(n - 1, -1, -1):
        a_lo, a_hi = lo[rows, i - 1], hi[i - 1]
        hit = (gains[j][rows] == minima[j][rows, i - 1][:, None]) & (column >= a_lo[:, None]) & \
            (column <= a_hi[:, None])
        i = rightmost(hit)
        starts[rows, j] = i
    found = set(rows.tolist())
    return [[int(a) for a in starts[b]] if b in found else None for b in range(nb)]


def rightmost(hit: np.ndarray) -> np.ndarray:
    """Per row, the last column where ``hit`` is true: the reference deque keeps the most recent
    of equal values, so among equally cheap starts the latest one wins."""
    return hit.shape[1] - 1 - np.argmax(hit[:, ::-1], axis=1)
