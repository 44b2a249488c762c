"""Pipeline partitions: where to cut the forward ops into stages.

The partitioner weighs each forward position by :mod:`triosim.graph.pipeline.stage_costs` and
times a partition by the block-level recurrence (:mod:`triosim.graph.pipeline.recurrence`).

- ``count`` (:func:`count_starts`): equal op counts, the original's split.
- ``time`` (:func:`time_partition`): balanced stages, and among partitions no less balanced than
  the count split the one with the fewest crossing bytes; the candidate (count split included)
  with the best estimate wins.
- ``optimal`` (:func:`optimal_candidates`): for a grid of bounds on a stage's time, a dynamic
  programme finds the cuts with the least boundary-transfer time that keep every stage and
  every boundary transfer under the bound and a backward op on every stage; these, the count
  and the time splits are timed by the recurrence, the best few are improved by local search
  (moving one cut at a time, within a work budget), and the builder re-times the best
  candidates on the real task DAG.

:func:`~triosim.graph.pipeline.recurrence.estimate_partition` and :func:`_min_cut_starts` are
the reference definitions, one partition and one bound at a time. The searches call their
batched equivalents, which give the same figures bit for bit:
:mod:`triosim.graph.pipeline.estimate` (many partitions per call) and
:mod:`triosim.graph.pipeline.cuts` (every bound in one pass).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...hardware.platform import Platform
from .cuts import min_cut_starts_many
from .estimate import BatchEstimator
from .recurrence import PartitionEstimate
from .schedules import Layout
from .stage_costs import StageCosts

# Balance bounds tried between the tightest one and the count split's (geometric grid).
BOUND_CANDIDATES = 12
# The optimal search: bounds on a stage's time tried (geometric grid from the tightest one up);
# local search from the best few, for at most so many rounds.
OPTIMAL_BOUNDS = 48
LOCAL_SEARCH_STARTS = 3
LOCAL_SEARCH_ROUNDS = 200
# Local search stops once its estimates have walked this many blocks (stages × micro-batches
# per estimate): a few seconds at most, also for long pipelines with many micro-batches.
LOCAL_SEARCH_BLOCKS = 1_000_000


def count_starts(nf: int, n: int) -> list[int]:
    """The original's split: stage i gets positions ``i·nf//n`` up to ``(i+1)·nf//n``."""
    return [i * nf // n for i in range(n)]


def _min_cut_starts(prefix: Sequence[float], cut: Callable[[int, int], float], n: int,
                    bound: float, need: Sequence[bool] | None = None) -> list[int] | None:
    """Stage starts minimising Σ cut costs with every stage's weight ≤ ``bound``.

    ``cut(j, k)``: the cost of starting stage j (≥ 1) at position k + 1 (infinite: not allowed).
    ``need``: when given, every stage holds at least one position where it is true.
    Dynamic programme over (stages used, positions covered) with a sliding-window minimum:
    the feasible starts of a stage ending at position i form a window that only moves right.
    """
    nf = len(prefix) - 1
    limit = bound * (1 + 1e-9) + 1e-15
    inf = math.inf
    # latest[i]: the last start a that keeps a needed position in [a, i) (-1: none).
    latest = [-1] * (nf + 1)
    for i in range(1, nf + 1):
        latest[i] = i - 1 if need is None or need[i - 1] else latest[i - 1]
    prev = [inf] * (nf + 1)
    prev[0] = 0.0
    choices: list[list[int]] = []
    for j in range(n):
        cur = [inf] * (nf + 1)
        arg = [-1] * (nf + 1)
        window: deque[tuple[float, int]] = deque()
        pushed = 0
        for i in range(1, nf + 1):
            while pushed <= latest[i]:
                a = pushed
                pushed += 1
                if prev[a] == inf:
                    continue
                g = prev[a] + (cut(j, a - 1) if a > 0 else 0.0)
                if g < inf:
                    while window and window[-1][0] >= g:
                        window.pop()
                    window.append((g, a))
            while window and prefix[i] - prefix[window[0][1]] > limit:
                window.popleft()
            if window:
                cur[i], arg[i] = window[0]
        choices.append(arg)
        prev = cur
    if prev[nf] == inf:
        return None
    starts, i = [], nf
    for arg in reversed(choices):
        i = arg[i]
        starts.append(i)
    return starts[::-1]


def _prefix(weights: Sequence[float]) -> list[float]:
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    return prefix


def _estimator(costs: StageCosts, platform: Platform, schedule: str, layout: Layout,
               estimator: BatchEstimator | None) -> BatchEstimator:
    return estimator if estimator is not None else BatchEstimator(costs, platform, schedule, layout)


def estimate_many(partitions: Sequence[Sequence[int]], estimator: BatchEstimator) -> list[PartitionEstimate]:
    """:func:`estimate_partition` of each partition, batched (the same figures, bit for bit)."""
    return [PartitionEstimate(tuple(p), r.seconds, r.max_stage_s, r.crossing_bytes)
            for p, r in zip(partitions, estimator.estimate(partitions))]


def _bound_grid(tight: float, loose: float, steps: int) -> list[float]:
    """Bounds on a stage's weight from ``tight`` up to ``loose`` (geometric, ``steps`` after the
    first); only ``tight`` when there is no room between them."""
    bounds = [tight]
    if loose > tight > 0:
        ratio = loose / tight
        bounds += [tight * ratio ** (k / steps) for k in range(1, steps + 1)]
    return bounds


def time_partition(costs: StageCosts, platform: Platform, schedule: str, layout: Layout,
                   estimator: BatchEstimator | None = None) -> list[int]:
    """Balanced, communication-aware stage starts.

    For balance bounds on a stage's forward + backward time, from the tightest achievable one up
    to the count split's busiest stage, take the partition with the fewest crossing bytes that
    meets the bound; keep the one with the best estimate. The count split is a candidate too,
    so the result is never worse than it by the estimate, and never less balanced.
    """
    est = _estimator(costs, platform, schedule, layout, estimator)
    n = layout.num_stages
    weights = costs.weights
    nf = len(weights)
    prefix = _prefix(weights)
    (best,) = estimate_many([count_starts(nf, n)], est)
    tight = est.tightest_bound(weights)
    loose = best.max_stage_s
    bounds = _bound_grid(tight, loose, BOUND_CANDIDATES)
    cut = np.array([float(f + b) for f, b in zip(costs.cut_forward, costs.cut_backward)] + [math.inf])
    found = _cut_search(prefix, lambda j: np.broadcast_to(cut[:nf], (len(bounds), nf)), n, bounds, None)
    for e in estimate_many([s for s in found if s is not None], est):
        # Strictly better only: ties keep the count split or the tighter bound.
        if e.seconds < best.seconds * (1 - 1e-12):
            best = e
    return list(best.starts)


def _cut_search(prefix: Sequence[float], layer_costs: Callable[[int], np.ndarray], n: int, bounds: Sequence[float],
                need: Sequence[bool] | None) -> list[list[int] | None]:
    """:func:`_min_cut_starts` for every bound (``layer_costs`` as in
    :func:`~triosim.graph.pipeline.cuts.min_cut_starts_many`): all bounds at once in numpy, or
    bound by bound where a negative weight makes the prefix sums unsorted (the vectorised
    programme needs them sorted)."""
    if all(b >= a for a, b in zip(prefix, prefix[1:])):
        return min_cut_starts_many(prefix, layer_costs, n, bounds, need)
    layers = [np.zeros((len(bounds), len(prefix) - 1))] + [layer_costs(j) for j in range(1, n)]
    return [_min_cut_starts(prefix, lambda j, k, b=b: float(layers[j][b, k]), n, bound, need)
            for b, bound in enumerate(bounds)]


def _valid(starts: Sequence[int], nf: int, need_count: Sequence[int] | None) -> bool:
    """Strictly increasing starts from 0, and each stage holds a needed position (if any).
    ``need_count[k]``: needed positions before position k."""
    if not starts or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] >= nf:
        return False
    if need_count is None:
        return True
    ends = [*starts[1:], nf]
    return all(need_count[b] > need_count[a] for a, b in zip(starts, ends))


@dataclass
class _Climb:
    """One local search's state: its best partition so far and its estimate, the estimates it
    has spent, whether the budget left moves untried, and whether it has stopped."""

    best: tuple[int, ...]
    best_s: float
    spent: int = 0
    short: bool = False
    done: bool = False

    def moves(self, nf: int, need_count: Sequence[int] | None, max_evaluations: int) -> list[tuple[int, ...]]:
        """This round's moves within the budget: one cut by ±1, 2, 4 or 8 positions."""
        out = []
        best = self.best
        for j in range(1, len(best)):
            for d in (-8, -4, -2, -1, 1, 2, 4, 8):
                cand = (*best[:j], best[j] + d, *best[j + 1 :])
                if not _valid(cand, nf, need_count):
                    continue
                if self.spent >= max_evaluations:
                    self.short = True
                    continue
                self.spent += 1
                out.append(cand)
        return out


def _local_searches(starts: Sequence[tuple[int, ...]], evaluate: Callable[[list[tuple[int, ...]]], list[float]],
                    nf: int, need_count: Sequence[int] | None,
                    max_evaluations: int) -> list[tuple[tuple[int, ...], bool]]:
    """Hill climbing on the estimate from each of ``starts``: move one cut by ±1, 2, 4 or 8
    positions while that helps (at most ``max_evaluations`` estimates each). In a round the
    best strictly better move wins (the first among equals). The searches are independent; they
    advance in lockstep only so that each round's moves of all of them are estimated in one
    batch. Per search: where it ended, and whether the budget left moves untried."""
    climbs = [_Climb(s, sec) for s, sec in zip(starts, evaluate(list(starts)))]
    for _ in range(LOCAL_SEARCH_ROUNDS):
        active = [c for c in climbs if not c.done]
        if not active:
            break
        moves = [c.moves(nf, need_count, max_evaluations) for c in active]
        seconds = iter(evaluate([m for ms in moves for m in ms]))
        for c, ms in zip(active, moves):
            step_best, step_s = c.best, c.best_s
            for cand in ms:
                sec = next(seconds)
                if sec < step_s * (1 - 1e-12):
                    step_best, step_s = cand, sec
            if step_best == c.best:
                c.done = True
            else:
                c.best, c.best_s = step_best, step_s
    return [(c.best, c.short) for c in climbs]


@dataclass(frozen=True)
class OptimalSearch:
    """What :func:`optimal_search` found: every partition it estimated, best first; how many
    estimates each local search was allowed; and how many local searches that budget cut short
    (moves left untried: a better partition may exist)."""

    estimates: list[PartitionEstimate]
    budget: int
    starts: int
    cut_short: int

    def note(self) -> str | None:
        """A line for the summary when the budget cut a local search short."""
        if not self.cut_short:
            return None
        return (f"the optimal partition's local search stopped at its budget ({self.budget:,} estimate(s) from each "
                f"of {self.starts} starting partition(s), {LOCAL_SEARCH_BLOCKS:,} pipeline blocks in all) in "
                f"{self.cut_short} of them: a better partition may exist")


def optimal_candidates(costs: StageCosts, platform: Platform, schedule: str, layout: Layout,
                       time_starts: Sequence[int] | None = None,
                       estimator: BatchEstimator | None = None) -> list[PartitionEstimate]:
    """Searched partitions, best estimate first (:func:`optimal_search`'s estimates)."""
    return optimal_search(costs, platform, schedule, layout, time_starts, estimator).estimates


def optimal_search(costs: StageCosts, platform: Platform, schedule: str, layout: Layout,
                   time_starts: Sequence[int] | None = None,
                   estimator: BatchEstimator | None = None) -> OptimalSearch:
    """Searched partitions, best estimate first (the count and time splits among them).

    For a grid of bounds on a stage's time, the dynamic programme gives the cuts with the least
    boundary-transfer time that keep every stage and every transfer under the bound (and a
    backward op on every stage when the trace has backward ops); each is timed by the
    recurrence, and the best few are improved by local search on the recurrence.
    ``time_starts``: the time split when the caller has it already.
    """
    est = _estimator(costs, platform, schedule, layout, estimator)
    n = layout.num_stages
    weights = costs.weights
    nf = len(weights)
    prefix = _prefix(weights)
    fwd_t, bwd_t = _transfer_times(costs, est)
    need = [c > 0 for c in costs.backward_ops] if any(costs.backward_ops) else None
    need_count = None
    if need is not None:
        need_count = [0]
        for x in need:
            need_count.append(need_count[-1] + x)
    tight = est.tightest_bound(weights)
    loose = float(sum(weights))
    bounds = _bound_grid(tight, loose, OPTIMAL_BOUNDS)
    found: dict[tuple[int, ...], PartitionEstimate] = {}

    def evaluate(partitions: list[tuple[int, ...]]) -> list[float]:
        fresh = list(dict.fromkeys(p for p in partitions if p not in found))
        for e in estimate_many(fresh, est):
            found[e.starts] = e
        return [found[p].seconds for p in partitions]

    if time_starts is None:
        time_starts = time_partition(costs, platform, schedule, layout, est)
    seeds = [tuple(count_starts(nf, n)), tuple(time_starts)]
    # A boundary transfer slower than the bound would be the bottleneck itself: excluded.
    slack = np.array([b * (1 + 1e-9) for b in bounds])[:, None]

    def layer_costs(j: int) -> np.ndarray:
        f, b = fwd_t[j], bwd_t[j]
        return np.where(np.maximum(f, b)[None, :] > slack, math.inf, (f + b)[None, :])

    searched = _cut_search(prefix, layer_costs, n, bounds, need)
    seeds += [tuple(s) for s in searched if s is not None]
    evaluate(seeds)
    ranked = sorted(found.values(), key=lambda e: (e.seconds, e.starts))
    starts_from = [e.starts for e in ranked if _valid(e.starts, nf, need_count)][:LOCAL_SEARCH_STARTS]
    per_start = max(1, LOCAL_SEARCH_BLOCKS // (n * len(costs.sizes) * max(1, len(starts_from))))
    short = sum(cut for _, cut in _local_searches(starts_from, evaluate, nf, need_count, per_start))
    return OptimalSearch(sorted(found.values(), key=lambda e: (e.seconds, e.starts)), per_start, len(starts_from),
                         short)


def _transfer_times(costs: StageCosts, estimator: BatchEstimator) -> tuple[np.ndarray, np.ndarray]:
    """Per stage j ≥ 1 (row j; row 0 is zeros) and cut position k (column k; the last column,
    a cut after the last position, is never used): the forward and backward time of one
    (first-size) micro-batch's crossing bytes when stage j starts at position k + 1."""
    frac = costs.sizes[0] / costs.batch
    n = estimator.num_stages
    out = []
    for d, nbytes in enumerate(estimator.cut_bytes):
        t = np.zeros((n, len(nbytes) + 1))
        for j in range(1, n):
            if estimator.has_route[d][j]:
                t[j, :-1] = estimator.latency[d, j] + (nbytes * frac) / estimator.bandwidth[d, j]
        out.append(t)
    return out[0], out[1]
