"""The pipeline's stage planner: micro-batch sizes, and the choice of the stage partition, whose
``optimal`` candidates are each built here as a plain pipeline's task graph and scheduled, the
fastest one kept (the composition, :mod:`triosim.graph.composition`, then builds the run).

The candidate timer's pipeline (:func:`build_plan`), as the composition builds a pipeline:

- **Stages.** Which GPU runs each op (phases, partitions, backward pairing, the optimizer's
  split) is decided in :mod:`triosim.graph.pipeline.stages` and
  :mod:`triosim.graph.pipeline.partition`.
- **Micro-batches.** R = ceil(batch / micro-batch), the last one smaller when it does not divide.
  Forward and backward op times follow the trace's op-time model at the micro-batch size
  (:func:`triosim.compute.op_time.op_seconds`); the bytes of batch-dependent tensors scale with
  the micro-batch's share of the batch; parameters, gradients and optimizer state do not.
- **Communication.** Every version of a buffer (a buffer as last written by one op) that an op on
  another stage reads is sent once per micro-batch, hop by hop through the stages in between
  (``transfer`` tasks s → s±1 over the platform's route). Activations therefore go forward,
  gradients come back, and a skip connection over k stages costs k hops.
- **Schedules** (:mod:`triosim.graph.pipeline.schedules`): ``gpipe``, ``1f1b`` and
  ``interleaved`` (V virtual stages per GPU). A GPU's compute is one in-order stream, so it
  works on one micro-batch at a time; its optimizer share comes last.
- **Memory.** Each GPU's program is planned in its run order with buffers keyed per micro-batch
  (``mb3:<buffer>``), so the activations a stage holds for in-flight micro-batches add up;
  1F1B keeps at most N−s micro-batches in flight on stage s, GPipe all R. A received buffer is
  allocated when first used; buffers passing through a stage on their way are not counted.

``reference_compat``: the original's split by op count; its replay is
:mod:`triosim.graph.pipeline.reference`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import ConfigError, OutOfMemoryError
from ...hardware.platform import Platform
from ...schedule.list_scheduler import schedule
from ...schedule.tasks import TaskGraph
from ...trace import Trace
from ..memory.plan import MemoryReport, Step, plan_memory
from ..single import add_op_chain, persistent_buffers, record_memory
from ..strategy import Strategy
from .schedules import block_order, interleaved_order
from .sends import send_hop_by_hop
from .stages import (
    BACKWARD,
    FORWARD,
    OPTIMIZER,
    RETIME_MAX_TASKS,
    PipelinePlan,
    buffer_versions,
    candidate_plans,
    compat_chunks,
    optimizer_buffers,
)

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


@dataclass
class _Programs:
    """Compute tasks of every stage and the memory steps of each GPU, in run order."""

    task: dict[tuple[int, int], int] = field(default_factory=dict)  # (op, micro-batch) -> task
    opt_task: dict[tuple[int, int], int] = field(default_factory=dict)  # (op, rank) -> task
    steps: dict[int, list[tuple[int, int, int | None]]] = field(default_factory=dict)  # rank -> (task, op, mb)


def _key(trace: Trace, buffer: str, r: int) -> str:
    return buffer if buffer in trace.batch_invariant else f"mb{r}:{buffer}"


def _scaled(trace: Trace, buffer: str, fraction: float) -> int:
    size = trace.tensors[buffer].bytes
    return size if buffer in trace.batch_invariant else int(round(size * fraction))


def _blocks(schedule: str, ranks: int, num_micro: int, rank: int, virtual: int) -> list[tuple[str, int, int]]:
    """(phase, micro-batch, virtual stage) blocks of one GPU, in run order."""
    if schedule == "interleaved":
        return interleaved_order(ranks, num_micro, rank, virtual)
    return [(ph, r, 0) for ph, r in block_order(schedule, ranks, num_micro, rank)]


def _add_programs(graph: TaskGraph, trace: Trace, plan: PipelinePlan, strategy: Strategy,
                  sizes: Sequence[int]) -> _Programs:
    progs = _Programs()
    ops = {(s, ph): plan.ops_on(s, ph) for s in range(plan.num_stages) for ph in (FORWARD, BACKWARD)}
    for p, gpu in enumerate(plan.gpus):
        last: list[int] = []
        seq: list[tuple[int, int, int | None]] = []
        for ph, r, v in _blocks(strategy.schedule, plan.ranks, len(sizes), p, plan.virtual):
            s = v * plan.ranks + p
            if not ops[(s, ph)]:
                continue
            tasks = add_op_chain(graph, trace, gpu, ops[(s, ph)], after=last, batch=sizes[r],
                                 label_suffix=f" mb{r}", microbatch=r, stage_index=s)
            for i, t in zip(ops[(s, ph)], tasks):
                progs.task[(i, r)] = t
                seq.append((t, i, r))
            last = [tasks[-1]]
        for i, ph in enumerate(plan.phase):
            if ph != OPTIMIZER or p not in plan.optimizer_ranks(i):
                continue
            frac = plan.optimizer_ranks(i)[p]
            suffix = "" if frac >= 1.0 else f" {frac:.0%} share"
            (t,) = add_op_chain(graph, trace, gpu, [i], after=last, time_scale=frac, label_suffix=suffix,
                                stage_index=p, share=frac)
            progs.opt_task[(i, p)] = t
            seq.append((t, i, None))
            last = [t]
        progs.steps[p] = seq
    return progs


def _add_crossings(graph: TaskGraph, trace: Trace, platform: Platform, plan: PipelinePlan, progs: _Programs,
                   fractions: Sequence[float]) -> set[tuple[int, str]]:
    """Default model: send every cross-stage buffer version hop by hop; returns (rank, key)
    pairs delivered that way."""
    delivered: set[tuple[int, str]] = set()
    for v in buffer_versions(trace, plan.phase):
        src = plan.stage[v.writer]
        readers = [(c, plan.stage[c]) for c in v.readers if plan.stage[c] != src]
        if not readers:
            continue
        stages = [st for _, st in readers]
        for r, frac in enumerate(fractions):
            nbytes = _scaled(trace, v.buffer, frac)
            key = _key(trace, v.buffer, r)
            arrive = send_hop_by_hop(graph, platform, v.buffer, r, nbytes, src, stages, progs.task[(v.writer, r)],
                                     plan.gpu_of)
            for c, st in readers:
                graph.add_edge(arrive[st], progs.task[(c, r)])
                delivered.add((plan.rank_of(st), key))
    return delivered


def _plan_stage_memory(graph: TaskGraph, trace: Trace, platform: Platform, strategy: Strategy, plan: PipelinePlan,
                       rank: int, seq: list[tuple[int, int, int | None]], fractions: Sequence[float],
                       delivered: set[tuple[int, str]], persistent: set[str]) -> MemoryReport:
    sizes: dict[str, int] = {}
    steps: list[Step] = []
    first_touch_read: dict[str, bool] = {}
    for task, i, r in seq:
        op = trace.ops[i]
        if r is None:  # optimizer share: only this stage's buffers
            mine = tuple(k for k in optimizer_buffers(trace, i)
                         if k in plan.buffer_stage and plan.rank_of(plan.buffer_stage[k]) == rank)
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
                          label=f"{trace.op_label(op)} on GPU {plan.gpus[rank]}"))
    # Read before written here and not received from another stage: it was here all along
    # (parameters, the input batch) or, under reference_compat, comes from remote memory.
    external = [k for k, is_read in first_touch_read.items() if is_read and (rank, k) not in delivered]
    return plan_memory(graph, platform, plan.gpus[rank], steps, sizes, external=external,
                       persistent=[k for k in first_touch_read if k in persistent],
                       placement=strategy.initial_placement)


def build_plan(trace: Trace, platform: Platform, strategy: Strategy, plan: PipelinePlan,
               sizes: Sequence[int]) -> TaskGraph:
    """The task graph of one pipeline plan (stage s on GPU ``plan.gpu_of(s)``), to be scheduled
    for its time: the candidate timer of :func:`retime`."""
    fractions = [m / trace.batch_size for m in sizes]
    graph = TaskGraph()
    progs = _add_programs(graph, trace, plan, strategy, sizes)
    delivered = _add_crossings(graph, trace, platform, plan, progs, fractions)
    persistent = persistent_buffers(trace)
    reports = [
        _plan_stage_memory(graph, trace, platform, strategy, plan, p, progs.steps[p], fractions, delivered, persistent)
        for p in range(plan.ranks)
    ]
    record_memory(graph, reports)
    graph.meta["devices"] = list(plan.gpus)
    return graph


def retime(trace: Trace, platform: Platform, strategy: Strategy, plans: Sequence[PipelinePlan],
           sizes: Sequence[int]) -> tuple[PipelinePlan, list[dict] | None]:
    """Build and schedule each candidate plan; the fastest one (ties: the first, i.e. the better
    estimate) and what each candidate scheduled to (the JSON ``candidates``). With one
    candidate, that plan and None."""
    if len(plans) == 1:
        return plans[0], None
    best: tuple[float, PipelinePlan] | None = None
    tried: list[dict] = []
    failure: OutOfMemoryError | None = None
    for plan in plans:
        try:
            graph = build_plan(trace, platform, strategy, plan, sizes)
        except OutOfMemoryError as exc:  # this cut does not fit; another one may
            failure = failure or exc
            continue
        seconds = schedule(graph).makespan
        tried.append({"starts": list(plan.starts), "estimate_ms": round((plan.estimate_s or 0.0) * 1e3, 6),
                      "scheduled_ms": round(seconds * 1e3, 6)})
        if best is None or seconds < best[0] * (1 - 1e-12):
            best = (seconds, plan)
    if best is None:
        assert failure is not None
        raise failure
    return best[1], tried


def choose_stages(trace: Trace, platform: Platform, strategy: Strategy, fractions: Sequence[float],
                  num_stages: int | None = None, stage_gpus: Sequence[int] | None = None,
                  ) -> tuple[PipelinePlan, list[dict] | None]:
    """Assign every op to a stage (see the module docstring): the plan, and for
    ``partition="optimal"`` the candidates that were built as this pipeline's task graph and
    scheduled (the fastest one is the plan; None when there was one candidate, or the pipeline
    was too big to re-time).

    ``fractions``: each micro-batch's share of the batch. Defaults: ``platform.num_gpus``
    stages, stage s on GPU s; otherwise ``num_stages`` stages, stage s on ``stage_gpus[s]``.
    With ``--schedule interleaved`` each GPU runs ``strategy.virtual_stages`` stages.
    """
    # Re-timing builds and schedules each candidate's whole pipeline; past this size that costs
    # more than the search, so the best estimate is taken as it is (and only its plan is made).
    too_big = len(trace.ops) * len(fractions) > RETIME_MAX_TASKS
    plans = candidate_plans(trace, platform, strategy, fractions, num_stages, stage_gpus, first_only=too_big)
    if len(plans) == 1 or too_big:
        return plans[0], None
    sizes = [max(1, round(f * trace.batch_size)) for f in fractions]
    return retime(trace, platform, strategy, plans, sizes)


def plan_stages(trace: Trace, platform: Platform, strategy: Strategy, fractions: Sequence[float],
                num_stages: int | None = None, stage_gpus: Sequence[int] | None = None) -> PipelinePlan:
    """The plan of :func:`choose_stages`."""
    return choose_stages(trace, platform, strategy, fractions, num_stages, stage_gpus)[0]


__all__ = ["PipelinePlan", "block_order", "buffer_versions", "build_plan", "choose_stages", "compat_chunks",
           "micro_batch_sizes", "plan_stages"]
