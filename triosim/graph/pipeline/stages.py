"""Pipeline stages: which GPU runs each op of the trace under pipeline parallelism (case 4).

- **Phases.** Forward ops before the first non-forward op form the forward phase (F), the
  optimizer ops the optimizer phase (O), every other op the backward phase (B).
- **Stages.** The forward ops are cut into S contiguous, non-empty stages. A pipeline of P GPUs
  has S = P stages (S = P·V with V virtual stages under the interleaved schedule); stage s runs
  on the pipeline's GPU ``s % P``. Where to cut is :mod:`triosim.graph.pipeline.partition`'s
  job (``count``, ``time`` or ``optimal``; see there).
- **Backward ops** run on the stage of their forward partner (``trace.forward_partner``); one
  without a partner goes with the backward op before it (or after it, for the first). Backward
  stages are kept non-increasing in trace order, so gradients flow only toward earlier stages.
- **Optimizer.** Each stage runs every optimizer op over its own parameters, for the op's time
  times the stage's share of the parameter bytes. A parameter belongs to the stage of its first
  reader; gradients to the stage that writes them; optimizer state to the stage of a parameter
  of the same size (the k-th state tensor of a size goes with the k-th parameter of that size,
  cyclically), else to the stage with the largest share.
- ``reference_compat``: the original's split by op count (:func:`compat_chunks`).

The schedules are in :mod:`triosim.graph.pipeline.schedules`, the task graph built from a plan
in :mod:`triosim.graph.pipeline.builder`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ...errors import ConfigError, TraceError
from ...hardware.platform import Platform
from ...trace import Trace
from ...trace.layers import forward_layers
from ...trace.precision import size_key
from ..strategy import Strategy
from .estimate import BatchEstimator
from .layer_layout import LayerSplit, choose_split, megatron_layers_per_stage
from .partition import count_starts, optimal_search, time_partition
from .recurrence import PartitionEstimate
from .schedules import BACKWARD, FORWARD, OPTIMIZER, Layout, block_order, check_interleaved
from .stage_costs import buffer_versions, stage_costs

# A stage with less than this share of the compute gets a warning in the summary.
SMALL_STAGE_SHARE = 0.05
# partition="optimal": searched partitions re-timed on the task DAG, and how close (relative
# estimate) the count and time splits must be to the best one to be re-timed as well.
RETIME_SEARCHED = 2
RETIME_MARGIN = 1.15
# ... and only while one candidate pipeline has at most this many (op, micro-batch) tasks.
RETIME_MAX_TASKS = 50_000

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
    """Which stage runs what. ``stage[i]`` is -1 for optimizer ops (see ``optimizer_stages``).

    ``gpus``: the pipeline's GPUs (rank p is GPU ``gpus[p]``); stage s runs on rank
    ``s % len(gpus)``, so ``num_stages = len(gpus) · virtual``.
    """

    num_stages: int
    partition: str
    phase: tuple[str, ...]
    stage: tuple[int, ...]
    starts: tuple[int, ...]  # first forward position of each stage
    optimizer_share: tuple[float, ...]  # per stage, fraction of every optimizer op's time
    optimizer_whole: dict[int, int] = field(default_factory=dict)  # compat: op -> its one stage
    buffer_stage: dict[str, int] = field(default_factory=dict)  # optimizer buffers -> owner
    touched: dict[int, tuple[str, ...]] = field(default_factory=dict)  # optimizer op -> its buffers
    gpus: tuple[int, ...] = ()
    virtual: int = 1
    estimate_s: float | None = None  # the partition's block-level estimate (None: not computed)
    warnings: tuple[str, ...] = ()
    # Cut at layers: each stage's transformer layers as placed (Megatron-Core's rule), and how the
    # rule was chosen (the flags, or what --partition auto picked); () / None for other partitions.
    layer_counts: tuple[int, ...] = ()
    layer_split: str | None = None
    # A model card's decoder layers before its repeated ones (on the first stage; Megatron's
    # rules count them) and its multi-token-prediction layers (on the last), for the layout shown.
    leading_layers: int = 0
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        if not self.gpus:
            object.__setattr__(self, "gpus", tuple(range(self.num_stages // self.virtual)))

    @property
    def ranks(self) -> int:
        """GPUs in the pipeline."""
        return len(self.gpus)

    def rank_of(self, stage: int) -> int:
        return stage % len(self.gpus)

    def gpu_of(self, stage: int) -> int:
        return self.gpus[stage % len(self.gpus)]

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

    def optimizer_ranks(self, op: int) -> dict[int, float]:
        """Pipeline ranks running optimizer op ``op`` (once per GPU) and their fraction of it."""
        out: dict[int, float] = {}
        for s, f in self.optimizer_stages(op).items():
            out[self.rank_of(s)] = out.get(self.rank_of(s), 0.0) + f
        return out


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
        by_size.setdefault(size_key(trace, prm), []).append(s)
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
            size = size_key(trace, k)  # elements once resized by role (weights and state differ in bytes)
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


def _pipeline(platform: Platform, num_stages: int | None, stage_gpus: Sequence[int] | None) -> tuple[int, ...]:
    if stage_gpus is not None:
        gpus = tuple(stage_gpus)
        if num_stages is not None and len(gpus) != num_stages:
            raise ConfigError(f"the pipeline has {num_stages} stages but {len(gpus)} GPUs were given for them")
        return gpus
    return tuple(range(platform.num_gpus if num_stages is None else num_stages))


def _positions(trace: Trace, phase: Sequence[str], fops: list[int]) -> dict[int, int]:
    """Forward position of every forward and backward op (a backward op: its anchor's)."""
    fpos = {op: k for k, op in enumerate(fops)}
    return {**fpos, **_anchor_positions(trace, phase, fpos)}


def _plan_from_starts(trace: Trace, phase: tuple[str, ...], fops: list[int], pos: dict[int, int],
                      starts: Sequence[int], partition: str, gpus: tuple[int, ...], virtual: int,
                      estimate_s: float | None = None) -> PipelinePlan:
    n = len(starts)
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
    plan = PipelinePlan(n, partition, phase, tuple(stage), tuple(starts), share, {}, owner, buffers, gpus, virtual,
                        estimate_s)
    return with_warnings(trace, plan)


def with_same_cuts(trace: Trace, plan: PipelinePlan) -> PipelinePlan:
    """``plan``'s cuts on ``trace``, a trace whose forward phase is ``plan``'s (ops inserted or
    changed after it only, as activation recomputation does): its backward and optimizer ops
    placed by the rules above."""
    phase = op_phases(trace)
    fops = [i for i, p in enumerate(phase) if p == FORWARD]
    if fops != [i for i, p in enumerate(plan.phase) if p == FORWARD]:
        raise ValueError("the forward phase differs from the plan's")
    pos = _positions(trace, phase, fops)
    new = _plan_from_starts(trace, phase, fops, pos, plan.starts, plan.partition, plan.gpus, plan.virtual,
                            plan.estimate_s)
    return replace(new, warnings=tuple(dict.fromkeys((*plan.warnings, *new.warnings))),
                   layer_counts=plan.layer_counts, layer_split=plan.layer_split, leading_layers=plan.leading_layers,
                   mtp_layers=plan.mtp_layers)


def with_cuts_moved(trace: Trace, plan: PipelinePlan, new_index: Sequence[int]) -> PipelinePlan:
    """``plan``'s cuts on ``trace``, a rewrite of the plan's trace with ops inserted (activation
    offload's copies); ``new_index``: each op of the plan's trace -> its index in ``trace``. Each
    stage starts at the same original op as before."""
    phase = op_phases(trace)
    fops = [i for i, p in enumerate(phase) if p == FORWARD]
    old = [i for i, p in enumerate(plan.phase) if p == FORWARD]
    at = {op: n for n, op in enumerate(fops)}
    starts = tuple(at[new_index[old[s]]] for s in plan.starts)
    pos = _positions(trace, phase, fops)
    new = _plan_from_starts(trace, phase, fops, pos, starts, plan.partition, plan.gpus, plan.virtual, plan.estimate_s)
    return replace(new, warnings=tuple(dict.fromkeys((*plan.warnings, *new.warnings))))


def stage_compute(trace: Trace, plan: PipelinePlan) -> list[float]:
    """Forward + backward time of each stage (at the trace's batch)."""
    out = [0.0] * plan.num_stages
    for i, (p, s) in enumerate(zip(plan.phase, plan.stage)):
        if p != OPTIMIZER and s >= 0:
            out[s] += trace.ops[i].duration_s
    return out


def lacks_backward(plan: PipelinePlan) -> list[int]:
    """Stages without a backward op while other stages have some."""
    has = {s for p, s in zip(plan.phase, plan.stage) if p == BACKWARD}
    return [s for s in range(plan.num_stages) if has and s not in has]


def with_warnings(trace: Trace, plan: PipelinePlan) -> PipelinePlan:
    """The plan with its summary warnings: stages under 5% of the compute, stages without a
    backward op."""
    compute = stage_compute(trace, plan)
    total = sum(compute)
    notes = []
    reason = {
        "optimal": "no cut gave it more without a slower iteration (larger boundary transfers or a busier stage "
                   "elsewhere)",
        "time": "the time split cuts where few bytes cross; --partition optimal weighs the whole iteration",
        "layers": "Megatron-LM's layers per stage; --partition optimal balances the stages' times",
    }.get(plan.partition, "equal op counts ignore op times; --partition optimal weighs the whole iteration")
    for s, t in enumerate(compute):
        if total > 0 and t < SMALL_STAGE_SHARE * total:
            notes.append(f"stage {s} holds {t / total:.1%} of the compute (under {SMALL_STAGE_SHARE:.0%}): {reason}")
    for s in lacks_backward(plan):
        notes.append(f"stage {s} has no backward op")
    return replace(plan, warnings=tuple(notes))


def candidate_plans(trace: Trace, platform: Platform, strategy: Strategy, fractions: Sequence[float],
                    num_stages: int | None = None, stage_gpus: Sequence[int] | None = None,
                    first_only: bool = False) -> list[PipelinePlan]:
    """The plans worth timing, best estimate first. One plan, except for ``partition="optimal"``:
    the best searched partitions plus the count and time splits (see
    :func:`triosim.graph.pipeline.partition.optimal_candidates`), for the builder to re-time on
    the real task DAG. ``first_only``: only the first of these (for a caller that will not
    re-time them). Other arguments as :func:`triosim.graph.pipeline.builder.plan_stages`."""
    gpus = _pipeline(platform, num_stages, stage_gpus)
    virtual = getattr(strategy, "virtual_stages", 1) if strategy.schedule == "interleaved" else 1
    n = len(gpus) * virtual
    sizes = tuple(max(1, round(f * trace.batch_size)) for f in fractions)
    if strategy.schedule == "interleaved":
        check_interleaved(len(gpus), len(sizes), virtual)
    phase = op_phases(trace)
    fops = [i for i, p in enumerate(phase) if p == FORWARD]
    if n > len(fops):
        what = f"{len(gpus)} GPUs × {virtual} virtual stages" if virtual > 1 else f"-GPUnumber {n}"
        raise ConfigError(
            f"pipeline parallelism needs at least one forward op per stage: {what} is more than the "
            f"trace's {len(fops)} forward ops"
        )
    if strategy.reference_compat:
        return [_compat_plan(trace, phase, n)]
    pos = _positions(trace, phase, fops)
    layers = trace_layers(trace) if strategy.partition in ("auto", "layers") else ()
    partition = resolve_partition(trace, strategy.partition, n, layers)
    leading, mtp = card_layer_extras(trace)
    split, how = choose_split(strategy, len(gpus), virtual, len(layers), partition, bool(trace.info.get("model_card")),
                              leading)
    if split is not None:  # Megatron's equal split, or the one its flags (or --partition auto) give
        if not split.given and not leading:
            starts = layer_starts(trace, fops, n, layers)
            counts = (len(layers) // n,) * n
        else:
            counts = megatron_layers_per_stage(len(layers), len(gpus), virtual, split, leading, mtp)
            starts = layer_starts(trace, fops, n, layers, counts)
        plan = _plan_from_starts(trace, phase, fops, pos, starts, "layers", gpus, virtual)
        return [replace(plan, layer_counts=counts, layer_split=how, leading_layers=leading, mtp_layers=mtp)]
    if partition == "count":
        return [_plan_from_starts(trace, phase, fops, pos, count_starts(len(fops), n), "count", gpus, virtual)]
    costs = stage_costs(trace, phase, fops, pos, sizes)
    layout = Layout(gpus, virtual)
    if partition == "time":
        starts = time_partition(costs, platform, strategy.schedule, layout)
        return [_plan_from_starts(trace, phase, fops, pos, starts, "time", gpus, virtual)]
    # One estimator (the block program, the stage sums seen) for the time split and the search.
    estimator = BatchEstimator(costs, platform, strategy.schedule, layout)
    time_starts = time_partition(costs, platform, strategy.schedule, layout, estimator)
    search = optimal_search(costs, platform, strategy.schedule, layout, time_starts, estimator)
    estimates: list[PartitionEstimate] = search.estimates
    note = search.note()
    # The count and time splits are re-timed too when their estimate is close to the best one,
    # so that the result is never slower than either where the estimate is a little off.
    baselines = {tuple(count_starts(len(fops), n)), tuple(time_starts)}
    # Plans are made only for the estimates that will be re-timed: the search can visit
    # hundreds of partitions, and making a plan (optimizer split, buffer owners) costs a pass
    # over the trace.
    chosen: list[PipelinePlan] = []
    lacking: list[PipelinePlan] = []
    for e in estimates:
        full = len(chosen) >= RETIME_SEARCHED
        if full and (e.starts not in baselines or e.seconds > (chosen[0].estimate_s or 0.0) * RETIME_MARGIN):
            continue
        p = _plan_from_starts(trace, phase, fops, pos, e.starts, "optimal", gpus, virtual, e.seconds)
        if note:
            p = replace(p, warnings=(*p.warnings, note))
        # Never a stage without a backward op when others have them (unless no cut avoids it).
        if lacks_backward(p):
            if len(lacking) < RETIME_SEARCHED:
                lacking.append(p)
            continue
        chosen.append(p)
        if first_only:
            break
    return chosen or lacking[:1 if first_only else None]


def resolve_partition(trace: Trace, partition: str, n: int,
                      layers: tuple[tuple[int, ...], ...] | None = None) -> str:
    """``auto``: Megatron-LM's ``layers`` for a model card's trace (a Megatron-style transformer)
    whose layers split equally over the ``n`` stages, else ``optimal``; other values as given.
    ``layers``: the trace's :func:`~triosim.trace.layers.forward_layers`, if at hand."""
    if partition != "auto":
        return partition
    if not trace.info.get("model_card"):
        return "optimal"
    count = len(trace_layers(trace) if layers is None else layers)
    return "layers" if count and (count + card_layer_extras(trace)[0]) % n == 0 else "optimal"


def layer_starts(trace: Trace, fops: Sequence[int], n: int,
                 layers: tuple[tuple[int, ...], ...] | None = None,
                 counts: Sequence[int] | None = None) -> list[int]:
    """Megatron-LM's split: stage s runs ``counts[s]`` consecutive transformer layers (default:
    L/n each, Megatron's equal split, which needs L to be a multiple of the ``n`` stages); what
    comes before the first layer (the embedding) runs on the first stage, what comes after the
    last (the final norm, the head, the loss) on the last. Returns each stage's first forward
    position (an index into ``fops``)."""
    layers = trace_layers(trace) if layers is None else layers
    count = len(layers)
    if count == 0:
        raise ConfigError("--partition layers: the trace has no repeated layers to place")
    if counts is None:
        if count % n:
            raise ConfigError(f"--partition layers: {count} layers do not split equally over {n} pipeline stages "
                              "(Megatron-LM needs them to); use --partition optimal")
        counts = [count // n] * n
    first = {op: k for k, op in enumerate(fops)}
    after_last = max(first[op] for op in layers[-1]) + 1  # where the final norm, head and loss begin
    starts, offset = [0], 0
    for s in range(1, n):
        offset += counts[s - 1]
        starts.append(first[layers[offset][0]] if offset < count else after_last)
    ends = [*starts[1:], len(fops)]
    for s, (a, b) in enumerate(zip(starts, ends)):
        if b <= a:  # a stage with only the embedding or the loss, where the trace has none
            raise ConfigError(f"pipeline stage {s} of the layer split holds no op of the trace (nothing before the "
                              "first or after the last transformer layer): use --partition optimal")
    return starts


def megatron_starts(trace: Trace, fops: Sequence[int], stages: int, layers: tuple[tuple[int, ...], ...],
                    split: LayerSplit, ranks: int = 1) -> list[int]:
    """:func:`layer_starts` of ``stages`` stages over ``ranks`` pipeline ranks cut by ``split``
    (Megatron-Core's rules, a model card's leading dense layers and MTP layers counted)."""
    counts = megatron_layers_per_stage(len(layers), ranks, stages // ranks, split, *card_layer_extras(trace))
    return layer_starts(trace, fops, stages, layers, counts)


def stage_layer_counts(trace: Trace, plan: PipelinePlan) -> tuple[int, ...]:
    """Transformer layers each (virtual) stage of ``plan`` runs, in stage order (stage c is
    virtual stage c // P of pipeline rank c % P), for any partition: a layer counts on the stage
    of its first forward op. A plan cut at layers gives its own (Megatron-Core's) counts."""
    if plan.layer_counts:
        return plan.layer_counts
    out = [0] * plan.num_stages
    for layer in trace_layers(trace):
        s = plan.stage[layer[0]]
        if s >= 0:
            out[s] += 1
    return tuple(out)


def card_layer_extras(trace: Trace) -> tuple[int, int]:
    """A model card trace's decoder layers before its repeated ones (DeepSeek-V3's first dense
    layers) and its multi-token-prediction layers, as its meta.json records them; (0, 0) for
    other traces."""
    info = trace.info or {}
    return int(info.get("leading_layers", 0)), int(info.get("mtp_layers", 0))


def trace_layers(trace: Trace) -> tuple[tuple[int, ...], ...]:
    """The forward ops of each of the trace's repeated layers (none when nothing repeats)."""
    try:
        return forward_layers(trace)
    except TraceError:
        return ()


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


__all__ = [
    "BACKWARD", "FORWARD", "OPTIMIZER", "PipelinePlan", "block_order", "buffer_versions", "candidate_plans",
    "card_layer_extras", "compat_chunks", "megatron_starts", "op_phases", "optimizer_buffers", "stage_layer_counts", "with_same_cuts",
]
