"""Case 3: tensor parallelism — every GPU runs every op; ops marked ``tpflag`` are split over the
N GPUs of the ring, the rest are replicated.

What it models:

- **Compute.** A tpflag op takes t/N on each GPU (it works on a 1/N shard of its weights); any
  other op takes t on every GPU. Each GPU runs the trace in order.
- **Communication.** After a forward tpflag op its output shards are all-gathered, so every GPU
  holds the full activation. After a backward tpflag op the partial sums of its input gradient
  are all-reduced; its weight and bias gradients stay sharded (no all-reduce of them). The
  input gradient is every output that is not a parameter gradient (a batch-invariant buffer,
  i.e. one the optimizer reads). Ring collectives over ``platform.ring`` from
  :mod:`triosim.graph.collectives.algorithms`; an op that reads a gathered/reduced buffer waits for the
  collective on its GPU, other ops keep going (in-order stream, data dependencies).
- **Optimizer.** Replicated like any other non-tpflag op (full time on every GPU): the trace
  does not say which part of a ``_foreach`` update belongs to sharded weights.
- **Memory.** Parameters read by tpflag ops, the weight gradients of backward tpflag ops and
  the optimizer state matched to those parameters (same size; the k-th state tensor of a size
  goes with the k-th sharded parameter of that size) take 1/N of their bytes on each GPU;
  everything else is replicated at full size. Collective buffers are not counted.
- **N = 1** is case 0 exactly: full op times, no collectives, the same memory plan.

:func:`build_from_plan` builds this DAG from any tensor-parallel plan: case 3 is the per-op
plan of :func:`triosim.graph.tensor.megatron.plan_tensor_parallel` (the graph builder makes it and
calls this); a megatron plan splits attention/MLP blocks and can use reduce-scatter + all-gather.

``reference_compat`` (the original's model): after every tpflag op, forward or
backward, its outputs divided by N (Σ ⌊bytes/N⌋ over the op's output list) are all-reduced
with the ring routine, and the GPU's next op waits for it. With the compat platform's ring
links (ptp·2(N−1)/N) each such all-reduce takes (Σ ⌊bytes/N⌋)/ptp.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ...hardware.platform import Platform
from ...schedule.tasks import TaskGraph
from ...trace import Trace
from ...trace.precision import size_key
from ..collectives.algorithms import add_all_gather, add_all_reduce, add_reduce_scatter
from ..memory.plan import plan_replicas
from ..single import op_label, op_steps, persistent_buffers, record_memory
from ..strategy import Strategy


@dataclass(frozen=True)
class TpCollective:
    """The collective that follows tpflag op ``op``: which buffers it carries and how many bytes."""

    op: int
    kind: str  # "all_gather" | "all_reduce" | "reduce_scatter"
    buffers: tuple[str, ...]
    nbytes: int  # per call
    calls: int = 1  # back-to-back calls of nbytes each (vocab-parallel cross-entropy: 2)
    # True for a gather of a buffer that an earlier collective completed (sequence parallelism's
    # backward re-gather): its readers wait for it, but the buffer's version stays that one's.
    redo: bool = False


def op_time(trace: Trace, i: int, n: int) -> float:
    """Time of op ``i`` on one of ``n`` GPUs: a tpflag op works on a 1/n shard."""
    op = trace.ops[i]
    return op.duration_s / n if op.tpflag and op.stage != "optimizer" else op.duration_s


def input_gradients(trace: Trace, i: int) -> tuple[str, ...]:
    """Outputs of backward op ``i`` that are activation gradients, not parameter gradients."""
    params = set(trace.parameters)
    return tuple(k for k in trace.writes[i] if k not in trace.batch_invariant and k not in params)


def tp_collectives(trace: Trace, n: int, reference_compat: bool = False) -> list[TpCollective]:
    """The collective after each tpflag op (none for N = 1), in trace order."""
    if n < 2:
        return []
    out = []
    for op in trace.ops:
        if not op.tpflag or op.stage == "optimizer":
            continue
        i = op.index
        if reference_compat:
            # The original divides every output tensor by N (truncating) and all-reduces them.
            nbytes = sum(trace.tensors[x].bytes // n for x in op.outputs)
            out.append(TpCollective(i, "all_reduce", trace.writes[i], nbytes))
        elif op.stage == "forward":
            bufs = trace.writes[i]
            out.append(TpCollective(i, "all_gather", bufs, sum(trace.tensors[k].bytes for k in bufs)))
        else:
            bufs = input_gradients(trace, i)
            out.append(TpCollective(i, "all_reduce", bufs, sum(trace.tensors[k].bytes for k in bufs)))
    return out


def sharded_buffers(trace: Trace) -> set[str]:
    """Buffers each GPU holds 1/N of: tpflag ops' parameters, their weight gradients, and the
    optimizer state of those parameters (matched by size)."""
    params = set(trace.parameters)
    sharded: set[str] = set()
    for op in trace.ops:
        if not op.tpflag:
            continue
        i = op.index
        if op.stage == "forward":
            sharded.update(k for k in trace.reads[i] if k in params)
        elif op.stage == "backward":
            sharded.update(k for k in trace.writes[i] if k in trace.batch_invariant and k not in params)
    return sharded | optimizer_state_of(trace, sharded & params)


def optimizer_state_of(trace: Trace, sharded_params: set[str]) -> set[str]:
    """The optimizer state of ``sharded_params``, matched by size: the k-th state tensor of a
    size the optimizer touches goes with the k-th parameter of that size. Sizes are element
    counts, not bytes: mixed-precision training keeps fp32 moments of 16-bit parameters."""
    params = set(trace.parameters)
    sharded: set[str] = set()
    by_size: dict[int, list[bool]] = {}
    for p in trace.parameters:
        by_size.setdefault(size_key(trace, p), []).append(p in sharded_params)
    written = {k for ks in trace.writes for k in ks}
    external = set(trace.external)  # a set: traces repeated to many layers have thousands
    used: dict[int, int] = {}
    seen: set[str] = set()
    for i, op in enumerate(trace.ops):
        if op.stage != "optimizer":
            continue
        for k in (*trace.reads[i], *trace.writes[i]):
            if k in params or k in seen or (k in written and k not in external):
                continue
            seen.add(k)
            size = size_key(trace, k)  # elements once resized by role: a bf16 weight's fp32 moments
            flags = by_size.get(size)
            if flags:
                if flags[used.get(size, 0) % len(flags)]:
                    sharded.add(k)
                used[size] = used.get(size, 0) + 1
    return sharded


class TensorPlan(Protocol):
    """What :func:`build_from_plan` reads of a tensor-parallel plan (the per-op plan of case 3 or
    a :class:`~triosim.graph.tensor.megatron.TensorParallelPlan`)."""

    style: str
    degree: int
    time_scale: tuple[float, ...]
    collectives: tuple[TpCollective, ...]
    shard_divisor: Mapping[str, int]
    blocks: tuple
    fallback_reason: str | None

    def op_time(self, i: int, duration_s: float) -> float: ...

    def summary(self) -> str: ...


_LABEL = {"all_gather": "allgather", "all_reduce": "allreduce", "reduce_scatter": "reducescatter"}


def build_from_plan(trace: Trace, platform: Platform, strategy: Strategy, plan: TensorPlan) -> TaskGraph:
    """Tensor parallelism over every GPU of ``platform`` as ``plan`` says (its degree is the GPU
    count): each GPU runs every op at ``plan.op_time``, the plan's collectives run on the
    logical ring, an op that reads a buffer a collective completes waits for it on its GPU,
    and each GPU holds ⌈bytes / divisor⌉ of the plan's sharded buffers."""
    graph = TaskGraph()
    n = platform.num_gpus
    if plan.degree != n:
        raise ValueError(f"a plan for {plan.degree} ranks on {n} GPUs")
    devices = list(range(n))
    group: Sequence[int] = platform.ring
    colls: dict[int, list[TpCollective]] = {}
    for c in plan.collectives:
        colls.setdefault(c.op, []).append(c)
    prev: dict[int, list[int]] = {g: [] for g in devices}
    tasks: dict[int, list[int]] = {g: [] for g in devices}
    ready: dict[str, dict[int, int]] = {}  # buffer -> {gpu: sync after which it is complete}
    add = {"all_gather": add_all_gather, "all_reduce": add_all_reduce, "reduce_scatter": add_reduce_scatter}
    for op in trace.ops:
        i = op.index
        duration = plan.op_time(i, op.duration_s)
        sharded = plan.time_scale[i] != 1.0 and op.stage != "optimizer" and n > 1
        # An op starts once the collectives of the buffers it reads are done on its GPU.
        waits = [ready[k] for k in trace.reads[i] if k in ready]
        for g in devices:
            after = [*prev[g], *(w[g] for w in waits)]
            t = graph.add_compute(
                g, duration, f"{op_label(trace, i)} gpu{g}", after=list(dict.fromkeys(after)),
                op=i, stage=op.stage, **({"shard": n} if sharded else {}),
            )
            tasks[g].append(t)
            prev[g] = [t]
        synced = None
        for c in colls.get(i, ()):
            # a second collective on one op (a megatron plan's reduce-scatter, then the next
            # block's all-gather of its result) starts when the first is done
            label = f"{_LABEL[c.kind]} {op_label(trace, i)}"
            after = {g: [tasks[g][-1] if synced is None else synced[g]] for g in devices}
            for call in range(c.calls):  # back-to-back calls, each after the previous
                synced = add[c.kind](graph, platform, group, c.nbytes, label + (f" call{call}" if call else ""),
                                     after=after, detail=strategy.collective_detail, op=i)
                after = {g: [synced[g]] for g in devices}
            if strategy.reference_compat:
                prev = {g: [synced[g]] for g in devices}  # the original's compute waits for it
            else:
                for k in c.buffers:
                    ready[k] = synced
    ops = list(range(len(trace.ops)))
    sizes = {k: t.bytes for k, t in trace.tensors.items()}
    for k, div in plan.shard_divisor.items():
        sizes[k] = -(-sizes[k] // div)
    persistent = persistent_buffers(trace)
    reports = plan_replicas(graph, platform, devices, lambda g: op_steps(trace, ops, tasks[g]), sizes,
                            external=trace.external, persistent=persistent, placement=strategy.initial_placement)
    record_memory(graph, reports)
    graph.meta["devices"] = devices
    graph.meta["tensor_parallel"] = tensor_parallel_block(trace, plan)
    return graph


def tensor_parallel_block(trace: Trace, plan: TensorPlan) -> dict:
    """The JSON ``tensor_parallel`` block of a run over one TP group: the plan's collectives and
    bytes per kind, the ops it splits (and, for a megatron plan or a fallback, the plan)."""
    by_kind = {kind: sum(c.nbytes * c.calls for c in plan.collectives if c.kind == kind) for kind in _LABEL}
    meta = {
        "collectives": sum(c.calls for c in plan.collectives),
        "all_gather_bytes": by_kind["all_gather"],
        "all_reduce_bytes": by_kind["all_reduce"],
        "sharded_ops": sum(1 for op in trace.ops if op.stage != "optimizer" and (
            op.tpflag if plan.style == "per-op" else plan.time_scale[op.index] != 1.0)),
    }
    if plan.style == "megatron" or plan.fallback_reason:
        meta.update(style=plan.style, summary=plan.summary(), blocks=len(plan.blocks),
                    reduce_scatter_bytes=by_kind["reduce_scatter"])
    return meta


__all__ = ["TensorPlan", "TpCollective", "build_from_plan", "input_gradients", "op_time", "optimizer_state_of", "sharded_buffers",
           "tensor_parallel_block", "tp_collectives"]
