"""Pipeline stages: which GPU runs each op of the trace under pipeline parallelism (case 4).

- **Phases.** Forward ops before the first non-forward op form the forward phase (F), the
  optimizer ops the optimizer phase (O), every other op the backward phase (B).
- **Stages.** The forward ops are cut into N contiguous, non-empty stages; stage s runs on GPU s.
  ``partition="count"`` gives equal op counts (the original's split). ``partition="time"``
  (default) balances each stage's forward + backward time and, among partitions no less
  balanced than the count split, places the cuts where the fewest bytes cross; the candidate
  (count split included) with the shortest block-level pipeline estimate wins (see
  :func:`time_partition`), so it is never slower than the count split by that estimate.
- **Backward ops** run on the stage of their forward partner (``trace.forward_partner``); one
  without a partner goes with the backward op before it (or after it, for the first). Backward
  stages are kept non-increasing in trace order, so gradients flow only toward earlier stages.
- **Optimizer.** Each stage runs every optimizer op over its own parameters, for the op's time
  times the stage's share of the parameter bytes. A parameter belongs to the stage of its first
  reader; gradients to the stage that writes them; optimizer state to the stage of a parameter
  of the same size (the k-th state tensor of a size goes with the k-th parameter of that size,
  cyclically), else to the stage with the largest share.
- ``reference_compat``: the original's split by op count (:func:`compat_chunks`).

The task graph built from a plan is in :mod:`triosim.graph.pipeline_parallel`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..platform import Platform, gpu_node
from ..strategy import Strategy
from ..trace import Trace

FORWARD, BACKWARD, OPTIMIZER = "F", "B", "O"
# Balance bounds tried between the tightest one and the count split's (geometric grid).
BOUND_CANDIDATES = 12


# ----------------------------------------------------------------------------- the stage plan


def op_phases(trace: Trace) -> tuple[str, ...]:
    """F for the forward prefix of the trace, O for optimizer ops, B for everything else."""
    phases = []
    in_forward = True
    for op in trace.ops:
        if op.stage == "optimizer":
            phases.append(OPTIMIZER)
            in_forward = False
        elif op.stage == "forward" and in_forward:
            phases.append(FORWARD)
        else:
            phases.append(BACKWARD)
            in_forward = False
    return tuple(phases)


@dataclass(frozen=True)
class PipelinePlan:
    """Which stage runs what. ``stage[i]`` is -1 for optimizer ops (see ``optimizer_stages``)."""

    num_stages: int
    partition: str
    phase: tuple[str, ...]
    stage: tuple[int, ...]
    starts: tuple[int, ...]  # first forward position of each stage
    optimizer_share: tuple[float, ...]  # per stage, fraction of every optimizer op's time
    optimizer_whole: dict[int, int] = field(default_factory=dict)  # compat: op -> its one stage
    buffer_stage: dict[str, int] = field(default_factory=dict)  # optimizer buffers -> owner
    touched: dict[int, tuple[str, ...]] = field(default_factory=dict)  # optimizer op -> its buffers

    def ops_on(self, stage: int, phase: str) -> list[int]:
        """Ops of ``phase`` that ``stage`` runs, in trace order."""
        if phase == OPTIMIZER:
            return [i for i, p in enumerate(self.phase) if p == OPTIMIZER and stage in self.optimizer_stages(i)]
        return [i for i, (p, s) in enumerate(zip(self.phase, self.stage)) if p == phase and s == stage]

    def optimizer_stages(self, op: int) -> dict[int, float]:
        """Stages running optimizer op ``op`` and the fraction of its time each takes."""
        if op in self.optimizer_whole:
            return {self.optimizer_whole[op]: 1.0}
        owned = {self.buffer_stage.get(k) for k in self.touched.get(op, ())}
        return {s: f for s, f in enumerate(self.optimizer_share) if f > 0 or s in owned}


def optimizer_buffers(trace: Trace, i: int) -> tuple[str, ...]:
    """Buffers optimizer op ``i`` reads or writes, in first-touch order."""
    return tuple(dict.fromkeys((*trace.reads[i], *trace.writes[i])))


def _anchor_positions(trace: Trace, phase: Sequence[str], fpos: dict[int, int]) -> dict[int, int]:
    """Forward position each backward op follows: its partner's, else its neighbour's."""
    anchors: dict[int, int] = {}
    pending: list[int] = []  # unpartnered backward ops before the first partnered one
    prev: int | None = None
    last_pos = len(fpos) - 1
    for i, p in enumerate(phase):
        if p != BACKWARD:
            continue
        partner = trace.forward_partner[i] if i < len(trace.forward_partner) else None
        if partner is not None and partner in fpos:
            prev = fpos[partner]
            for j in pending:
                anchors[j] = prev
            pending = []
            anchors[i] = prev
        elif prev is not None:
            anchors[i] = prev
        else:
            pending.append(i)
    for j in pending:
        anchors[j] = last_pos
    return anchors


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
    """Per forward position: forward time, attached backward time, optimizer time (full batch),
    and the bytes crossing the cut after each position in each direction."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    optimizer_s: tuple[float, ...]
    cut_forward: tuple[int, ...]
    cut_backward: tuple[int, ...]

    @property
    def weights(self) -> list[float]:
        return [f + b for f, b in zip(self.forward_s, self.backward_s)]


@dataclass(frozen=True)
class PartitionEstimate:
    """Analytic iteration-time estimate of a partition, used only to choose one."""

    starts: tuple[int, ...]
    seconds: float
    max_stage_s: float
    crossing_bytes: int


def _stage_costs(trace: Trace, phase: Sequence[str], fops: list[int], pos: dict[int, int]) -> StageCosts:
    """What the partitioner weighs, per forward position (``pos``: op -> forward position)."""
    nf = len(fops)
    fwd = [trace.ops[i].duration_s for i in fops]
    bwd = [0.0] * nf
    for i, k in pos.items():
        if phase[i] == BACKWARD:
            bwd[k] += trace.ops[i].duration_s
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
    return StageCosts(tuple(fwd), tuple(bwd), tuple(opt), tuple(cut_f), tuple(cut_b))


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


def _min_cut_starts(prefix: Sequence[float], cut: Sequence[float], n: int, bound: float) -> list[int] | None:
    """Stage starts minimising Σ cut costs with every stage's weight ≤ ``bound``.

    Dynamic programme over (stages used, positions covered) with a sliding-window minimum:
    the feasible starts of a stage ending at position i form a window that only moves right.
    """
    nf = len(prefix) - 1
    limit = bound * (1 + 1e-9) + 1e-15
    inf = math.inf
    prev = [inf] * (nf + 1)
    prev[0] = 0.0
    choices: list[list[int]] = []
    for _ in range(n):
        cur = [inf] * (nf + 1)
        arg = [-1] * (nf + 1)
        window: deque[tuple[float, int]] = deque()
        for i in range(1, nf + 1):
            a = i - 1
            if prev[a] < inf:
                g = prev[a] + (cut[a - 1] if a > 0 else 0.0)
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


def estimate_partition(starts: Sequence[int], costs: StageCosts, platform: Platform,
                       fractions: Sequence[float], schedule: str) -> PartitionEstimate:
    """Iteration time of a partition by the block-level pipeline recurrence.

    Each stage runs its forward and backward blocks (one per micro-batch) in the schedule's
    order; a block waits for the previous block on its stage and for the bytes crossing from
    the neighbouring stage, which go over the boundary link one micro-batch after another. The
    end of the last block plus the stage's optimizer share, maximised over stages, is the
    estimate: the task DAG at block granularity, without memory traffic.
    """
    n, num_micro = len(starts), len(fractions)
    bounds = [*starts, len(costs.forward_s)]
    fwd = [sum(costs.forward_s[bounds[s] : bounds[s + 1]]) for s in range(n)]
    bwd = [sum(costs.backward_s[bounds[s] : bounds[s + 1]]) for s in range(n)]
    opt = [sum(costs.optimizer_s[bounds[s] : bounds[s + 1]]) for s in range(n)]
    link_f, link_b, crossing = [], [], 0
    for j in range(1, n):
        k = starts[j] - 1
        link_f.append((platform.route(gpu_node(j - 1), gpu_node(j)), costs.cut_forward[k]))
        link_b.append((platform.route(gpu_node(j), gpu_node(j - 1)), costs.cut_backward[k]))
        crossing += costs.cut_forward[k] + costs.cut_backward[k]
    orders = [block_order(schedule, n, num_micro, s) for s in range(n)]
    end: dict[tuple[str, int, int], float] = {}  # (phase, stage, micro-batch) -> end time
    f_free = [0.0] * max(n - 1, 0)  # when each boundary link is next free, per direction
    b_free = [0.0] * max(n - 1, 0)
    arrived: dict[tuple[str, int, int], float] = {}  # data for (phase, stage, mb) is there
    pos = [0] * n
    clock = [0.0] * n
    progress = True
    while progress:
        progress = False
        for s in range(n):
            while pos[s] < len(orders[s]):
                ph, r = orders[s][pos[s]]
                if ph == FORWARD:
                    need = None if s == 0 else (FORWARD, s, r)
                else:
                    need = None if s == n - 1 else (BACKWARD, s, r)
                if need is not None and need not in arrived:
                    break
                start = max(clock[s], arrived.get(need, 0.0) if need else 0.0)
                if ph == BACKWARD and s == n - 1:
                    if (FORWARD, s, r) not in end:
                        break
                    start = max(start, end[(FORWARD, s, r)])
                clock[s] = start + (fwd[s] if ph == FORWARD else bwd[s]) * fractions[r]
                end[(ph, s, r)] = clock[s]
                pos[s] += 1
                progress = True
                # Send this block's crossing bytes on to the neighbour.
                if ph == FORWARD and s < n - 1:
                    route, nbytes = link_f[s]
                    f_free[s] = max(f_free[s], clock[s]) + platform.route_time(route, nbytes * fractions[r])
                    arrived[(FORWARD, s + 1, r)] = f_free[s]
                elif ph == BACKWARD and s > 0:
                    route, nbytes = link_b[s - 1]
                    b_free[s - 1] = max(b_free[s - 1], clock[s]) + platform.route_time(route, nbytes * fractions[r])
                    arrived[(BACKWARD, s - 1, r)] = b_free[s - 1]
    if any(pos[s] < len(orders[s]) for s in range(n)):
        seconds = math.inf  # a block order that cannot run; never chosen
    else:
        seconds = max(clock[s] + opt[s] for s in range(n))
    return PartitionEstimate(tuple(starts), seconds, max(f + b for f, b in zip(fwd, bwd)), crossing)


def time_partition(costs: StageCosts, platform: Platform, n: int, fractions: Sequence[float], schedule: str) -> list[int]:
    """Balanced, communication-aware stage starts.

    For balance bounds on a stage's forward + backward time, from the tightest achievable one up
    to the count split's busiest stage, take the partition with the fewest crossing bytes that
    meets the bound; keep the one with the best estimate. The count split is a candidate too,
    so the result is never worse than it by the estimate, and never less balanced.
    """
    weights = costs.weights
    nf = len(weights)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    cut = [float(f + b) for f, b in zip(costs.cut_forward, costs.cut_backward)]
    best = estimate_partition(count_starts(nf, n), costs, platform, fractions, schedule)
    tight = _min_max_bound(weights, n)
    loose = best.max_stage_s
    bounds = [tight]
    if loose > tight > 0:
        ratio = loose / tight
        bounds += [tight * ratio ** (k / BOUND_CANDIDATES) for k in range(1, BOUND_CANDIDATES + 1)]
    for bound in bounds:
        starts = _min_cut_starts(prefix, cut, n, bound)
        if starts is None:
            continue
        est = estimate_partition(starts, costs, platform, fractions, schedule)
        # Strictly better only: ties keep the count split or the tighter bound.
        if est.seconds < best.seconds * (1 - 1e-12):
            best = est
    return list(best.starts)


def _assign_optimizer(trace: Trace, phase: Sequence[str], stage: list[int], n: int) -> tuple[tuple[float, ...], dict[str, int]]:
    """Per-stage share of optimizer time (by parameter bytes) and the owner of every buffer the
    optimizer touches."""
    first_reader: dict[str, int] = {}
    last_writer: dict[str, int] = {}
    for i, p in enumerate(phase):
        if p == OPTIMIZER:
            continue
        for k in trace.reads[i]:
            first_reader.setdefault(k, i)
        for k in trace.writes[i]:
            last_writer[k] = i
    param_bytes = [0] * n
    owner: dict[str, int] = {}
    by_size: dict[int, list[int]] = {}
    for prm in trace.parameters:
        reader = first_reader.get(prm)
        if reader is None:
            continue
        s = stage[reader]
        owner[prm] = s
        param_bytes[s] += trace.tensors[prm].bytes
        by_size.setdefault(trace.tensors[prm].bytes, []).append(s)
    total = sum(param_bytes)
    share = tuple(b / total for b in param_bytes) if total > 0 else tuple(1.0 / n for _ in range(n))
    fallback = max(range(n), key=lambda s: (share[s], -s))
    used: dict[int, int] = {}
    for i, p in enumerate(phase):
        if p != OPTIMIZER:
            continue
        for k in optimizer_buffers(trace, i):
            if k in owner:
                continue
            if k in last_writer:
                owner[k] = stage[last_writer[k]]
                continue
            size = trace.tensors[k].bytes
            stages = by_size.get(size)
            if stages:
                owner[k] = stages[used.get(size, 0) % len(stages)]
                used[size] = used.get(size, 0) + 1
            else:
                owner[k] = fallback
    return share, owner


def _clamp_backward(phase: Sequence[str], stage: list[int], n: int) -> None:
    """Keep backward stages non-increasing in trace order (gradients flow to earlier stages)."""
    cur = n - 1
    for i, p in enumerate(phase):
        if p == BACKWARD:
            cur = min(cur, stage[i])
            stage[i] = cur


def plan_stages(trace: Trace, platform: Platform, strategy: Strategy, fractions: Sequence[float]) -> PipelinePlan:
    """Assign every op to a stage (see the module docstring)."""
    n = platform.num_gpus
    phase = op_phases(trace)
    fops = [i for i, p in enumerate(phase) if p == FORWARD]
    if n > len(fops):
        raise ConfigError(
            f"pipeline parallelism needs at least one forward op per stage: -GPUnumber {n} is more "
            f"than the trace's {len(fops)} forward ops"
        )
    if strategy.reference_compat:
        return _compat_plan(trace, phase, n)
    fpos = {op: k for k, op in enumerate(fops)}
    anchors = _anchor_positions(trace, phase, fpos)
    pos = {**fpos, **anchors}
    if strategy.partition == "count":
        starts = count_starts(len(fops), n)
    else:
        costs = _stage_costs(trace, phase, fops, pos)
        starts = time_partition(costs, platform, n, fractions, strategy.schedule)
    stage_of_pos = []
    for s in range(n):
        end = starts[s + 1] if s + 1 < n else len(fops)
        stage_of_pos.extend([s] * (end - starts[s]))
    stage = [-1] * len(trace.ops)
    for i, k in pos.items():
        stage[i] = stage_of_pos[k]
    _clamp_backward(phase, stage, n)
    share, owner = _assign_optimizer(trace, phase, stage, n)
    buffers = {i: optimizer_buffers(trace, i) for i, p in enumerate(phase) if p == OPTIMIZER}
    return PipelinePlan(n, strategy.partition, phase, tuple(stage), tuple(starts), share, {}, owner, buffers)


def _compat_plan(trace: Trace, phase: Sequence[str], n: int) -> PipelinePlan:
    """The original's split: forward-labelled ops by count over GPU 0..N−1, the rest (backward
    and optimizer, trace order) by count over GPU N−1..0, optimizer ops whole."""
    fw = [op.index for op in trace.ops if op.stage == "forward"]
    rest = [op.index for op in trace.ops if op.stage != "forward"]
    stage = [-1] * len(trace.ops)
    whole: dict[int, int] = {}
    for s, (a, b) in enumerate(_chunk_bounds(len(fw), n)):
        for i in fw[a:b]:
            stage[i] = s
    for c, (a, b) in enumerate(_chunk_bounds(len(rest), n)):
        for i in rest[a:b]:
            if phase[i] == OPTIMIZER:
                whole[i] = n - 1 - c
            else:
                stage[i] = n - 1 - c
    _clamp_backward(phase, stage, n)
    owner = {k: s for i, s in whole.items() for k in optimizer_buffers(trace, i)}
    starts = tuple(a for a, _ in _chunk_bounds(len(fw), n))
    return PipelinePlan(n, "count", tuple(phase), tuple(stage), starts, tuple(0.0 for _ in range(n)), whole, owner,
                        {i: optimizer_buffers(trace, i) for i in whole})


def _chunk_bounds(length: int, n: int) -> list[tuple[int, int]]:
    return [(i * length // n, (i + 1) * length // n) for i in range(n)]


def compat_chunks(trace: Trace, n: int) -> list[tuple[int, list[int]]]:
    """(GPU, ops) of the original's chunks in the order one micro-batch visits them."""
    fw = [op.index for op in trace.ops if op.stage == "forward"]
    rest = [op.index for op in trace.ops if op.stage != "forward"]
    chain = [(s, fw[a:b]) for s, (a, b) in enumerate(_chunk_bounds(len(fw), n))]
    chain += [(n - 1 - c, rest[a:b]) for c, (a, b) in enumerate(_chunk_bounds(len(rest), n))]
    return [(g, ops) for g, ops in chain if ops]


# ----------------------------------------------------------------------------- schedules


def block_order(schedule: str, num_stages: int, num_micro: int, stage: int) -> list[tuple[str, int]]:
    """The (phase, micro-batch) blocks stage ``stage`` runs, in order (optimizer not included)."""
    fwd = [(FORWARD, r) for r in range(num_micro)]
    bwd = [(BACKWARD, r) for r in range(num_micro)]
    if schedule == "gpipe":
        return fwd + bwd
    if schedule != "1f1b":
        raise ConfigError(f"--schedule must be gpipe or 1f1b, got {schedule!r}")
    warm = min(num_stages - 1 - stage, num_micro)
    order = fwd[:warm]
    for k in range(num_micro - warm):
        order += [fwd[warm + k], bwd[k]]
    return order + bwd[num_micro - warm :]


# ----------------------------------------------------------------------------- the builder
