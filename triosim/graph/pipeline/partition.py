"""Pipeline partitions: where to cut the forward ops into stages, and how fast a cut would run.

- **Costs** (:func:`stage_costs`). Each forward position weighs its forward time and the time of
  the backward ops that follow it, per micro-batch size (op times come from the trace's op-time
  model, so a small micro-batch is not simply a fraction of the batch), its share of the
  optimizer, and the bytes crossing the cut after it in each direction.
- **Estimate** (:func:`estimate_partition`). The block-level pipeline recurrence: each GPU runs
  its blocks (one stage's ops for one micro-batch) in the schedule's order; a block waits for
  the previous block on its GPU and for the bytes from the neighbouring stage, which go over
  the boundary link one micro-batch after another; plus each GPU's optimizer share at the end.
  It is the task DAG at block granularity, without memory traffic.
- **Partitions.** ``count`` (:func:`count_starts`): equal op counts, the original's split.
  ``time`` (:func:`time_partition`): balanced stages, and among partitions no less balanced than
  the count split the one with the fewest crossing bytes; the candidate (count split included)
  with the best estimate wins. ``optimal`` (:func:`optimal_candidates`): for a grid of bounds on
  a stage's time, a dynamic programme finds the cuts with the least boundary-transfer time that
  keep every stage and every boundary transfer under the bound and a backward op on every
  stage; these, the count and the time splits are timed by the recurrence, the best few are
  improved by local search (moving one cut at a time, within a work budget), and the builder
  re-times the best candidates on the real task DAG.

:func:`estimate_partition` and :func:`_min_cut_starts` are the reference definitions, one
partition and one bound at a time. The searches call their batched equivalents, which give the
same figures bit for bit: :mod:`triosim.graph.pipeline.estimate` (many partitions per call) and
:mod:`triosim.graph.pipeline.cuts` (every bound in one pass).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...compute.op_time import op_seconds
from ...hardware.platform import Platform, gpu_node
from ...trace import Trace
from .cuts import min_cut_starts_many
from .estimate import BatchEstimator
from .schedules import BACKWARD, FORWARD, OPTIMIZER, schedule_blocks

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


@dataclass(frozen=True)
class Version:
    """A buffer as last written by ``writer`` and the ops (elsewhere) that read that version."""

    buffer: str
    writer: int
    readers: tuple[int, ...]


def buffer_versions(trace: Trace, phase: Sequence[str]) -> list[Version]:
    """Every (buffer, last writer) read by a later forward/backward op, in trace order."""
    last_writer: dict[str, int] = {}
    readers: dict[tuple[str, int], list[int]] = {}
    for i, p in enumerate(phase):
        if p == OPTIMIZER:
            continue
        for k in trace.reads[i]:
            w = last_writer.get(k)
            if w is not None and w != i:
                readers.setdefault((k, w), []).append(i)
        for k in trace.writes[i]:
            last_writer[k] = i
    return [Version(k, w, tuple(r)) for (k, w), r in readers.items()]


def _cut_costs(trace: Trace, versions: list[Version], pos: dict[int, int], nf: int) -> tuple[list[int], list[int]]:
    """Bytes crossing the cut after each forward position, forward and backward direction.

    A version written at position p and read at positions c crosses (hop by hop) every cut
    between p and the farthest reader on each side.
    """
    fwd = [0] * (nf + 1)
    bwd = [0] * (nf + 1)
    for v in versions:
        p = pos[v.writer]
        cs = [pos[c] for c in v.readers]
        size = trace.tensors[v.buffer].bytes
        hi, lo = max(cs), min(cs)
        if hi > p:
            fwd[p] += size
            fwd[hi] -= size
        if lo < p:
            bwd[lo] += size
            bwd[p] -= size
    out_f, out_b, af, ab = [], [], 0, 0
    for k in range(nf - 1):
        af += fwd[k]
        ab += bwd[k]
        out_f.append(af)
        out_b.append(ab)
    return out_f, out_b


@dataclass(frozen=True)
class StageCosts:
    """What the partitioner weighs, per forward position.

    ``forward_s[m]`` / ``backward_s[m]``: forward and attached backward time at micro-batch size
    m, for each micro-batch size of ``sizes``; ``optimizer_s``: optimizer time (once per
    iteration); ``cut_forward`` / ``cut_backward``: bytes at the full ``batch`` crossing the cut
    after each position (scaled by m / batch per micro-batch).
    """

    batch: int
    sizes: tuple[int, ...]
    forward_s: dict[int, tuple[float, ...]]
    backward_s: dict[int, tuple[float, ...]]
    optimizer_s: tuple[float, ...]
    cut_forward: tuple[int, ...]
    cut_backward: tuple[int, ...]
    backward_ops: tuple[int, ...] = ()  # backward ops anchored at each position

    @property
    def weights(self) -> list[float]:
        """Forward + backward time per position at the first (largest) micro-batch size."""
        m = self.sizes[0]
        return [f + b for f, b in zip(self.forward_s[m], self.backward_s[m])]


@dataclass(frozen=True)
class PartitionEstimate:
    """Analytic iteration-time estimate of a partition, used only to choose one."""

    starts: tuple[int, ...]
    seconds: float
    max_stage_s: float
    crossing_bytes: int


def stage_costs(trace: Trace, phase: Sequence[str], fops: list[int], pos: dict[int, int],
                sizes: Sequence[int]) -> StageCosts:
    """Per-position costs (``pos``: op -> forward position; ``sizes``: the micro-batch sizes)."""
    nf = len(fops)
    fwd: dict[int, tuple[float, ...]] = {}
    bwd: dict[int, tuple[float, ...]] = {}
    count = [0] * nf
    for i, k in pos.items():
        if phase[i] == BACKWARD:
            count[k] += 1
    for m in dict.fromkeys(sizes):
        fwd[m] = tuple(op_seconds(trace, i, m) for i in fops)
        b = [0.0] * nf
        for i, k in pos.items():
            if phase[i] == BACKWARD:
                b[k] += op_seconds(trace, i, m)
        bwd[m] = tuple(b)
    # Optimizer time follows the parameters, which belong to the position of their first reader.
    param_bytes = [0] * nf
    first: dict[str, int] = {}
    for i in sorted(pos):
        for k in trace.reads[i]:
            first.setdefault(k, pos[i])
    for prm in trace.parameters:
        if prm in first:
            param_bytes[first[prm]] += trace.tensors[prm].bytes
    total_bytes = sum(param_bytes)
    opt_s = sum(op.duration_s for op, p in zip(trace.ops, phase) if p == OPTIMIZER)
    opt = [opt_s * b / total_bytes if total_bytes else opt_s / nf for b in param_bytes]
    cut_f, cut_b = _cut_costs(trace, buffer_versions(trace, phase), pos, nf)
    return StageCosts(trace.batch_size, tuple(sizes), fwd, bwd, tuple(opt), tuple(cut_f), tuple(cut_b), tuple(count))


def count_starts(nf: int, n: int) -> list[int]:
    """The original's split: stage i gets positions ``i·nf//n`` up to ``(i+1)·nf//n``."""
    return [i * nf // n for i in range(n)]


def _greedy_parts(weights: Sequence[float], bound: float) -> int:
    parts, acc = 1, 0.0
    for w in weights:
        if acc + w > bound and acc > 0:
            parts += 1
            acc = 0.0
        acc += w
    return parts


def _min_max_bound(weights: Sequence[float], n: int) -> float:
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


@dataclass(frozen=True)
class Layout:
    """Where stages run: stage c on pipeline rank ``c % ranks``, i.e. GPU ``gpus[c % ranks]``;
    ``virtual`` stages per GPU (1 except for the interleaved schedule)."""

    gpus: tuple[int, ...]
    virtual: int = 1

    @property
    def ranks(self) -> int:
        return len(self.gpus)

    @property
    def num_stages(self) -> int:
        return len(self.gpus) * self.virtual

    def gpu_of(self, stage: int) -> int:
        return self.gpus[stage % len(self.gpus)]


def estimate_partition(starts: Sequence[int], costs: StageCosts, platform: Platform, schedule: str,
                       layout: Layout) -> PartitionEstimate:
    """Iteration time of a partition by the block-level pipeline recurrence (module docstring)."""
    n, sizes = len(starts), costs.sizes
    num_micro = len(sizes)
    bounds = [*starts, len(costs.optimizer_s)]
    fwd = {m: [sum(f[bounds[s] : bounds[s + 1]]) for s in range(n)] for m, f in costs.forward_s.items()}
    bwd = {m: [sum(b[bounds[s] : bounds[s + 1]]) for s in range(n)] for m, b in costs.backward_s.items()}
    opt = [0.0] * layout.ranks
    for s in range(n):
        opt[s % layout.ranks] += sum(costs.optimizer_s[bounds[s] : bounds[s + 1]])
    link_f, link_b, crossing = [], [], 0
    for j in range(1, n):
        k = starts[j] - 1
        a, b = gpu_node(layout.gpu_of(j - 1)), gpu_node(layout.gpu_of(j))
        link_f.append((platform.route(a, b), costs.cut_forward[k]))
        link_b.append((platform.route(b, a), costs.cut_backward[k]))
        crossing += costs.cut_forward[k] + costs.cut_backward[k]
    orders = [schedule_blocks(schedule, layout.ranks, num_micro, p, layout.virtual) for p in range(layout.ranks)]
    link_free: dict[tuple[str, ...], float] = {}  # when each route is next free
    arrived: dict[tuple[str, int, int], float] = {}  # data for (phase, stage, mb) is there
    done_forward: set[tuple[int, int]] = set()
    pos = [0] * layout.ranks
    clock = [0.0] * layout.ranks

    def send(route: tuple[str, ...], nbytes: float, ready: float) -> float:
        if not route:
            return ready
        start = max(link_free.get(route, 0.0), ready)
        link_free[route] = start + platform.route_time(route, nbytes)
        return link_free[route]

    progress = True
    while progress:
        progress = False
        for p in range(layout.ranks):
            while pos[p] < len(orders[p]):
                ph, r, v = orders[p][pos[p]]
                s = v * layout.ranks + p
                if ph == FORWARD:
                    need = None if s == 0 else (FORWARD, s, r)
                else:
                    need = None if s == n - 1 else (BACKWARD, s, r)
                if need is not None and need not in arrived:
                    break
                if ph == BACKWARD and s == n - 1 and (s, r) not in done_forward:
                    break
                start = max(clock[p], arrived.get(need, 0.0) if need else 0.0)
                m = sizes[r]
                clock[p] = start + (fwd[m][s] if ph == FORWARD else bwd[m][s])
                pos[p] += 1
                progress = True
                frac = m / costs.batch
                # Send this block's crossing bytes on to the neighbour.
                if ph == FORWARD:
                    done_forward.add((s, r))
                    if s < n - 1:
                        route, nbytes = link_f[s]
                        arrived[(FORWARD, s + 1, r)] = send(route, nbytes * frac, clock[p])
                elif s > 0:
                    route, nbytes = link_b[s - 1]
                    arrived[(BACKWARD, s - 1, r)] = send(route, nbytes * frac, clock[p])
    if any(pos[p] < len(orders[p]) for p in range(layout.ranks)):
        seconds = math.inf  # a block order that cannot run; never chosen
    else:
        seconds = max(clock[p] + opt[p] for p in range(layout.ranks))
    m0 = sizes[0]
    return PartitionEstimate(tuple(starts), seconds, max(f + b for f, b in zip(fwd[m0], bwd[m0])), crossing)


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
    bounds = [tight]
    if loose > tight > 0:
        ratio = loose / tight
        bounds += [tight * ratio ** (k / BOUND_CANDIDATES) for k in range(1, BOUND_CANDIDATES + 1)]
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
    bounds = [tight]
    if loose > tight > 0:
        ratio = loose / tight
        bounds += [tight * ratio ** (k / OPTIMAL_BOUNDS) for k in range(1, OPTIMAL_BOUNDS + 1)]
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
