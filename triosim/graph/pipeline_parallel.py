"""Case 4: pipeline parallelism — the model cut into N stages, one per GPU, and the batch cut
into micro-batches that flow through them (DESIGN §5, §5.1).

What it models:

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
  stages are kept non-increasing in trace order, so gradients flow only toward earlier stages as
  in a real pipeline (a no-op on real traces; it keeps 1F1B deadlock-free on odd pairings).
- **Optimizer.** Each stage runs every optimizer op over its own parameters, for the op's time
  times the stage's share of the parameter bytes. A parameter belongs to the stage of its first
  reader; gradients to the stage that writes them; optimizer state to the stage of a parameter
  of the same size (the k-th state tensor of a size goes with the k-th parameter of that size,
  cyclically), else to the stage with the largest share.
- **Micro-batches.** R = ceil(batch / micro-batch), the last one smaller when it does not divide.
  Forward and backward op times and the bytes of batch-dependent tensors scale with the
  micro-batch's share of the batch; parameters, gradients and optimizer state do not.
- **Communication.** Every version of a buffer (a buffer as last written by one op) that an op on
  another stage reads is sent once per micro-batch, hop by hop through the stages in between
  (``transfer`` tasks s → s±1 over the platform's route). Activations therefore go forward,
  gradients come back, and a skip connection over k stages costs k hops.
- **Schedules.** ``gpipe``: every stage runs the forwards of all micro-batches, then their
  backwards (both in micro-batch order). ``1f1b``: stage s runs min(N−1−s, R) warm-up forwards,
  then alternates one forward and one backward, then drains the backwards. A stage's compute is
  one in-order stream, so it works on one micro-batch at a time; the optimizer comes last.
- **Memory.** Each GPU's program is planned in its run order with buffers keyed per micro-batch
  (``mb3:<buffer>``), so the activations a stage holds for in-flight micro-batches add up;
  1F1B keeps at most N−s micro-batches in flight on stage s, GPipe all R. A received buffer is
  allocated when first used; buffers passing through a stage on their way are not counted.

``reference_compat`` (§5.1, the original's model): forward ops split by count over GPU 0..N−1,
backward+optimizer ops (trace order) by count over GPU N−1..0 with ``i·n/N`` boundaries and
whole optimizer ops; only the outputs of the last op of each chunk go to the next chunk's GPU,
over the ring link at the plain ptp bandwidth (the original's pipeline platform does not
pre-multiply it by 2(N−1)/N); any other tensor a GPU reads from another stage is treated as
external on that GPU (the original fetches it from remote memory). With one micro-batch the
iteration is Σ op times + Σ boundary bytes / ptp.
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
from .memory import MemoryReport, Step, plan_memory
from .single import add_op_chain, op_label, persistent_buffers, record_memory
from .tasks import TaskGraph

FORWARD, BACKWARD, OPTIMIZER = "F", "B", "O"
# Balance bounds tried between the tightest one and the count split's (geometric grid).
BOUND_CANDIDATES = 12


# ----------------------------------------------------------------------------- micro-batches


def micro_batch_sizes(batch: int, micro: int | None) -> tuple[int, ...]:
    """R = ceil(batch / micro) micro-batch sizes summing to ``batch``; only the last is smaller."""
    if micro is None:
        return (batch,)
    if micro <= 0:
        raise ConfigError(f"-micro-batch-size must be a positive integer, got {micro}")
    if micro > batch:
        raise ConfigError(f"-micro-batch-size {micro} is larger than the simulated batch {batch}")
    full, rest = divmod(batch, micro)
    return (micro,) * full + ((rest,) if rest else ())


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


@dataclass
class _Programs:
    """Compute tasks of every stage and the memory steps of each GPU, in run order."""

    task: dict[tuple[int, int], int] = field(default_factory=dict)  # (op, micro-batch) -> task
    opt_task: dict[tuple[int, int], int] = field(default_factory=dict)  # (op, stage) -> task
    steps: dict[int, list[tuple[int, int, int | None]]] = field(default_factory=dict)  # stage -> (task, op, mb)


def _key(trace: Trace, buffer: str, r: int) -> str:
    return buffer if buffer in trace.batch_invariant else f"mb{r}:{buffer}"


def _scaled(trace: Trace, buffer: str, fraction: float) -> int:
    size = trace.tensors[buffer].bytes
    return size if buffer in trace.batch_invariant else int(round(size * fraction))


def _add_programs(graph: TaskGraph, trace: Trace, plan: PipelinePlan, strategy: Strategy,
                  fractions: Sequence[float]) -> _Programs:
    n, r_count = plan.num_stages, len(fractions)
    progs = _Programs()
    for s in range(n):
        ops = {FORWARD: plan.ops_on(s, FORWARD), BACKWARD: plan.ops_on(s, BACKWARD)}
        last: list[int] = []
        seq: list[tuple[int, int, int | None]] = []
        for ph, r in block_order(strategy.schedule, n, r_count, s):
            if not ops[ph]:
                continue
            tasks = add_op_chain(graph, trace, s, ops[ph], after=last, time_scale=fractions[r],
                                 label_suffix=f" mb{r}", microbatch=r, stage_index=s)
            for i, t in zip(ops[ph], tasks):
                progs.task[(i, r)] = t
                seq.append((t, i, r))
            last = [tasks[-1]]
        for i in plan.ops_on(s, OPTIMIZER):
            frac = plan.optimizer_stages(i)[s]
            suffix = "" if frac >= 1.0 else f" {frac:.0%} share"
            (t,) = add_op_chain(graph, trace, s, [i], after=last, time_scale=frac, label_suffix=suffix,
                                stage_index=s, share=frac)
            progs.opt_task[(i, s)] = t
            seq.append((t, i, None))
            last = [t]
        progs.steps[s] = seq
    return progs


def _task_of(plan: PipelinePlan, progs: _Programs, op: int, r: int) -> int:
    if plan.phase[op] == OPTIMIZER:
        (s,) = plan.optimizer_stages(op)
        return progs.opt_task[(op, s)]
    return progs.task[(op, r)]


def _send(graph: TaskGraph, platform: Platform, src: int, dst: int, nbytes: int, label: str, after: list[int],
          bandwidth: float | None, **attrs) -> int:
    """A stage-to-stage transfer; ``bandwidth`` overrides the route's (reference_compat)."""
    if bandwidth is None:
        return graph.add_transfer(platform, src, dst, nbytes, label, after=after, **attrs)
    route = platform.route(gpu_node(src), gpu_node(dst))
    return graph.add_task("transfer", label, nbytes / bandwidth, route, (src, dst), nbytes, after=after,
                          src=gpu_node(src), dst=gpu_node(dst), **attrs)


def _add_crossings(graph: TaskGraph, trace: Trace, platform: Platform, plan: PipelinePlan, progs: _Programs,
                   fractions: Sequence[float]) -> set[tuple[int, str]]:
    """Default model: send every cross-stage buffer version hop by hop; returns (stage, key)
    pairs delivered that way."""
    delivered: set[tuple[int, str]] = set()
    for v in buffer_versions(trace, plan.phase):
        src = plan.stage[v.writer]
        readers = [(c, plan.stage[c]) for c in v.readers if plan.stage[c] != src]
        if not readers:
            continue
        for r, frac in enumerate(fractions):
            nbytes = _scaled(trace, v.buffer, frac)
            key = _key(trace, v.buffer, r)
            arrive: dict[int, int] = {}
            for step, direction in ((1, "forward"), (-1, "backward")):
                dests = [st for _, st in readers if (st - src) * step > 0]
                if not dests:
                    continue
                far = max(dests) if step > 0 else min(dests)
                prev = progs.task[(v.writer, r)]
                for a in range(src, far, step):
                    b = a + step
                    prev = _send(graph, platform, a, b, nbytes, f"send {v.buffer} mb{r} gpu{a}->gpu{b}", [prev], None,
                                 microbatch=r, stage_index=a, buffer=v.buffer, direction=direction, dst_stage=b)
                    arrive[b] = prev
            for c, st in readers:
                graph.add_edge(arrive[st], progs.task[(c, r)])
                delivered.add((st, key))
    return delivered


def _compat_ptp(platform: Platform) -> float:
    """The plain -ptp-bandwidth: the original's pipeline platform does not pre-multiply its
    ring links by 2(N−1)/N as its collective platform does."""
    return platform.ptp_bandwidth_nominal or platform.ptp_bandwidth


def _add_compat_boundaries(graph: TaskGraph, trace: Trace, platform: Platform, plan: PipelinePlan,
                           progs: _Programs, fractions: Sequence[float]) -> set[tuple[int, str]]:
    """reference_compat: the outputs of each chunk's last op go to the next chunk's GPU."""
    delivered: set[tuple[int, str]] = set()
    bandwidth = _compat_ptp(platform)
    chain = compat_chunks(trace, plan.num_stages)
    for (ga, ops_a), (gb, ops_b) in zip(chain, chain[1:]):
        if ga == gb:
            continue  # the last forward chunk and the first backward chunk share a GPU
        last, first = ops_a[-1], ops_b[0]
        outs = trace.ops[last].outputs
        once = plan.phase[last] == OPTIMIZER
        for r, frac in enumerate(fractions[:1] if once else fractions):
            nbytes = sum(_scaled(trace, trace.base(x), frac) for x in outs)
            src_t = _task_of(plan, progs, last, r)
            dst_t = _task_of(plan, progs, first, r)
            direction = "forward" if trace.ops[last].stage == "forward" else "backward"
            t = _send(graph, platform, ga, gb, nbytes, f"boundary {op_label(trace, last)} mb{r} gpu{ga}->gpu{gb}",
                      [src_t], bandwidth, microbatch=r, stage_index=ga, direction=direction, dst_stage=gb,
                      buffer=",".join(outs))
            graph.add_edge(t, dst_t)
            for x in outs:
                delivered.add((gb, _key(trace, trace.base(x), r)))
    return delivered


def _plan_stage_memory(graph: TaskGraph, trace: Trace, platform: Platform, strategy: Strategy, plan: PipelinePlan,
                       stage: int, seq: list[tuple[int, int, int | None]], fractions: Sequence[float],
                       delivered: set[tuple[int, str]], persistent: set[str]) -> MemoryReport:
    sizes: dict[str, int] = {}
    steps: list[Step] = []
    first_touch_read: dict[str, bool] = {}
    for task, i, r in seq:
        op = trace.ops[i]
        if r is None:  # optimizer share: only this stage's buffers
            mine = tuple(k for k in optimizer_buffers(trace, i) if plan.buffer_stage.get(k) == stage)
            in_place = not op.outputs and op.name.endswith("_")  # as single.op_steps
            writes = mine if in_place else tuple(k for k in mine if k in trace.writes[i])
            reads = tuple(k for k in mine if k in trace.reads[i])
            for k in mine:
                sizes[k] = trace.tensors[k].bytes
        else:
            reads = tuple(_key(trace, k, r) for k in trace.reads[i])
            writes = tuple(_key(trace, k, r) for k in trace.writes[i])
            for k in (*trace.reads[i], *trace.writes[i]):
                sizes[_key(trace, k, r)] = _scaled(trace, k, fractions[r])
        for k in reads:
            first_touch_read.setdefault(k, True)
        for k in writes:
            first_touch_read.setdefault(k, False)
        steps.append(Step(task=task, reads=reads, writes=writes,
                          label=f"op {op.op_id} ({op.name}, trace.csv:{op.line}) on stage {stage}"))
    # Read before written here and not received from another stage: it was here all along
    # (parameters, the input batch) or, under reference_compat, comes from remote memory.
    external = [k for k, is_read in first_touch_read.items() if is_read and (stage, k) not in delivered]
    return plan_memory(graph, platform, stage, steps, sizes, external=external,
                       persistent=[k for k in first_touch_read if k in persistent],
                       placement=strategy.initial_placement)


def build(trace: Trace, platform: Platform, strategy: Strategy) -> TaskGraph:
    """Case 4 on GPUs 0..N−1 of ``platform`` (stage s on GPU s)."""
    sizes = micro_batch_sizes(trace.batch_size, strategy.micro_batch_size)
    fractions = [m / trace.batch_size for m in sizes]
    plan = plan_stages(trace, platform, strategy, fractions)
    graph = TaskGraph()
    progs = _add_programs(graph, trace, plan, strategy, fractions)
    if strategy.reference_compat:
        delivered = _add_compat_boundaries(graph, trace, platform, plan, progs, fractions)
    else:
        delivered = _add_crossings(graph, trace, platform, plan, progs, fractions)
    persistent = persistent_buffers(trace)
    reports = [
        _plan_stage_memory(graph, trace, platform, strategy, plan, s, progs.steps[s], fractions, delivered, persistent)
        for s in range(plan.num_stages)
    ]
    record_memory(graph, reports)
    graph.meta["devices"] = list(range(plan.num_stages))
    graph.meta["cluster_names"] = {s: f"stage {s} (GPU {s})" for s in range(plan.num_stages)}
    graph.meta["pipeline"] = _summary(trace, graph, plan, strategy, sizes)
    return graph


def _summary(trace: Trace, graph: TaskGraph, plan: PipelinePlan, strategy: Strategy, sizes: Sequence[int]) -> dict:
    """JSON-ready facts for the report: stages, micro-batches, bytes over each stage boundary."""
    n = plan.num_stages
    fwd = [0] * max(n - 1, 0)
    bwd = [0] * max(n - 1, 0)
    for t, kind in enumerate(graph.kind):
        attrs = graph.attrs[t] or {}
        if kind == "transfer" and "dst_stage" in attrs:
            a, b = attrs["stage_index"], attrs["dst_stage"]
            if b == a + 1:
                fwd[a] += graph.nbytes[t]
            elif b == a - 1:
                bwd[b] += graph.nbytes[t]
    stages = []
    for s in range(n):
        f_ops = plan.ops_on(s, FORWARD)
        b_ops = plan.ops_on(s, BACKWARD)
        stages.append({
            "stage": s,
            "gpu": s,
            "forward_ops": len(f_ops),
            "backward_ops": len(b_ops),
            "first_op": trace.ops[f_ops[0]].op_id if f_ops else None,
            "last_op": trace.ops[f_ops[-1]].op_id if f_ops else None,
            "compute_ms": round(sum(trace.ops[i].duration_s for i in f_ops + b_ops) * 1e3, 9),
            "optimizer_share": round(plan.optimizer_share[s], 9),
        })
    return {
        "schedule": strategy.schedule,
        "partition": "count (reference_compat)" if strategy.reference_compat else plan.partition,
        "micro_batches": list(sizes),
        "stages": stages,
        "boundaries": [{"from": j, "to": j + 1, "forward_bytes": fwd[j], "backward_bytes": bwd[j]} for j in range(n - 1)],
    }


__all__ = [
    "PipelinePlan",
    "Version",
    "block_order",
    "buffer_versions",
    "build",
    "compat_chunks",
    "count_starts",
    "micro_batch_sizes",
    "op_phases",
    "plan_stages",
    "time_partition",
]
