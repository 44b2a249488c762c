"""Case 4: pipeline parallelism — the model cut into N stages, one per GPU, and the batch cut
into micro-batches that flow through them.

What it models:

- **Stages.** Which GPU runs each op (phases, balanced partitions, backward pairing, the
  optimizer's split) is decided in :mod:`triosim.graph.pipeline_stages`.
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

``reference_compat`` (the original's model): forward ops split by count over GPU 0..N−1,
backward+optimizer ops (trace order) by count over GPU N−1..0 with ``i·n/N`` boundaries and
whole optimizer ops; only the outputs of the last op of each chunk go to the next chunk's GPU,
over the ring link at the plain ptp bandwidth (the original's pipeline platform does not
pre-multiply it by 2(N−1)/N); any other tensor a GPU reads from another stage is treated as
external on that GPU (the original fetches it from remote memory). With one micro-batch the
iteration is Σ op times + Σ boundary bytes / ptp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..platform import Platform, gpu_node
from ..strategy import Strategy
from ..trace import Trace
from .memory import MemoryReport, Step, plan_memory
from .pipeline_stages import (
    BACKWARD,
    FORWARD,
    OPTIMIZER,
    PipelinePlan,
    block_order,
    buffer_versions,
    compat_chunks,
    optimizer_buffers,
    plan_stages,
)
from .single import add_op_chain, op_label, persistent_buffers, record_memory
from .tasks import TaskGraph

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


__all__ = ["PipelinePlan", "block_order", "buffer_versions", "build", "compat_chunks", "micro_batch_sizes",
           "plan_stages"]
