"""Case 0: one GPU replays the whole training iteration, fed from its own or remote memory.

Also the building blocks the other builders share: a GPU's in-order chain of compute tasks for
a list of ops, and the memory plan of such a program (what is resident, what is prefetched).

Case 0 is not built by the composition: it reads the trace's buffer columns only (its memory plan
is :func:`whole_trace_fitting` when the trace fits), so a one-GPU run never makes the per-tensor
objects the composition's stage planner, buffer roles and per-GPU sizes look up (a fifth of the
loading time of a 200k-op trace). The composition's ``--dp 1`` gives the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter

import numpy as np

from ..compute.op_time import op_seconds
from ..hardware.platform import Platform
from ..schedule.tasks import TaskGraph
from ..trace import Trace
from ..trace.buffer_columns import first_op, last_op
from .memory.plan import MemoryReport, Step, lifetime_occupancy, plan_memory
from .strategy import Strategy


def _short_name(name: str) -> str:
    return name.rsplit(": ", 1)[-1].replace("aten::", "")


def op_label(trace: Trace, index: int) -> str:
    op = trace.ops[index]
    return f"{_short_name(op.name)}#{op.op_id}"


def add_op_chain(
    graph: TaskGraph,
    trace: Trace,
    device: int,
    op_indices: Sequence[int],
    after: Iterable[int] = (),
    time_scale: float = 1.0,
    label_suffix: str = "",
    batch: int | None = None,
    **attrs,
) -> list[int]:
    """Compute tasks for ``op_indices`` on ``device``, each after the previous (stream order).

    Each op takes its traced time × ``time_scale``, or, with ``batch``, its time at that many
    samples under the trace's op-time model (:func:`triosim.compute.op_time.op_seconds`).
    """
    ops = trace.ops
    seconds = [ops[i].duration_s * time_scale if batch is None else op_seconds(trace, i, batch) for i in op_indices]
    # As op_label, with each distinct op name shortened once.
    short = {name: _short_name(name) for name in {ops[i].name for i in op_indices}}
    tail = f"{label_suffix} gpu{device}"
    chosen = list(map(ops.__getitem__, op_indices))
    labels = [f"{short[op.name]}#{op.op_id}{tail}" for op in chosen]
    stages = map(attrgetter("stage"), chosen)
    task_attrs = ([{"op": i, "stage": s, **attrs} for i, s in zip(op_indices, stages)] if attrs
                  else [{"op": i, "stage": s} for i, s in zip(op_indices, stages)])
    return graph.add_compute_chain(device, seconds, labels, task_attrs, after=after)


def op_steps(trace: Trace, op_indices: Sequence[int], tasks: Sequence[int], key_prefix: str = "") -> list[Step]:
    """Memory steps of ops: in-place ops without listed outputs (``_foreach_add_``) write their inputs."""
    steps = []
    for i, t in zip(op_indices, tasks):
        op = trace.ops[i]
        reads, writes = trace.reads[i], trace.writes[i]
        if key_prefix:
            reads = tuple(key_prefix + k for k in reads)
            writes = tuple(key_prefix + k for k in writes)
        if not op.outputs and op.name.endswith("_"):
            writes = reads
        steps.append(Step(task=t, reads=reads, writes=writes, label=trace.op_label(op)))
    return steps


def persistent_buffers(trace: Trace) -> set[str]:
    """External buffers that outlive the iteration: parameters and optimizer state; and the
    buffers a training precision allocates before the iteration (the gradient buffer)."""
    touched_by_optimizer = {
        k for i, op in enumerate(trace.ops) if op.stage == "optimizer" for k in (*trace.reads[i], *trace.writes[i])
    }
    params = set(trace.parameters)
    return {k for k in trace.external if k in params or k in touched_by_optimizer} | set(trace.preallocated)


def gradient_copy_bytes(trace: Trace) -> int:
    """Bytes of the fp32 copy of 16-bit gradients the optimizer step makes and holds through the
    step (:attr:`~triosim.trace.precision.TrainingPrecision.gradient_copy_bytes`): the trace's
    share of its optimizer state (0 without one)."""
    num, den = trace.gradient_copy
    if not num:
        return 0
    from .data.zero import buffer_roles  # noqa: PLC0415 (data imports this module)
    state = buffer_roles(trace).optimizer
    return -(-sum(trace.tensors[k].bytes for k in state) * num // den)


def resident_from_start(trace: Trace) -> tuple[str, ...]:
    """Buffers that exist before the first op: the trace's external ones and, under a training
    precision, the gradient buffer (Megatron allocates it once, for every iteration)."""
    if not trace.preallocated:
        return trace.external
    return (*trace.external, *sorted(trace.preallocated - set(trace.external)))


def plan_program_memory(
    graph: TaskGraph,
    trace: Trace,
    platform: Platform,
    strategy: Strategy,
    device: int,
    op_indices: Sequence[int],
    tasks: Sequence[int],
    sizes: dict[str, int] | None = None,
) -> MemoryReport:
    """Memory plan for ``device`` running ``op_indices`` (already added as ``tasks``)."""
    if sizes is None and strategy.initial_placement == "gpu" and list(op_indices) == list(range(len(trace.ops))):
        report = whole_trace_fitting(trace, platform.capacity_bytes, device, tasks)
        if report is not None:
            return report
    if sizes is None:
        sizes = {k: t.bytes for k, t in trace.tensors.items()}
    steps = op_steps(trace, op_indices, tasks)
    copy = gradient_copy_bytes(trace)
    if copy:  # the fp32 gradient copy at each optimizer step, allocated there and freed after
        sizes = {**sizes, "gradient-copy": copy}
        steps = [st._replace(writes=(*st.writes, "gradient-copy")) if trace.ops[i].stage == "optimizer" else st
                 for i, st in zip(op_indices, steps)]
    return plan_memory(
        graph,
        platform,
        device,
        steps,
        sizes,
        external=resident_from_start(trace),
        persistent=persistent_buffers(trace),
        placement=strategy.initial_placement,
    )


def whole_trace_fitting(trace: Trace, capacity: int, device: int, tasks: Sequence[int]) -> MemoryReport | None:
    """The memory plan of the whole trace on one GPU when all its buffers fit at once (else
    None): what :func:`triosim.graph.memory.plan.plan_memory` finds in that case, each buffer
    resident from its first use (external ones from the start) to its last use (persistent
    ones to the end), computed on the trace's integer-coded buffer columns instead of
    per-step lists (a 200k-op trace: a fraction of a second instead of seconds)."""
    cols = trace.buffer_columns
    n, count = len(trace.ops), len(cols.ids)
    first = np.minimum(first_op(cols.read_code, cols.read_op, count, n),
                       first_op(cols.write_code, cols.write_op, count, n))
    last = np.maximum(last_op(cols.read_code, cols.read_op, count, -1),
                      last_op(cols.write_code, cols.write_op, count, -1))
    live = (last >= 0) & (cols.nbytes > 0)
    copy = gradient_copy_bytes(trace)
    if int(cols.nbytes[live].sum()) + copy > capacity:
        return None
    external = cols.mask(resident_from_start(trace))
    optimizer = np.fromiter(map("optimizer".__eq__, map(attrgetter("stage"), trace.ops)), dtype=bool, count=n)
    touched_by_optimizer = np.zeros(count, dtype=bool)
    touched_by_optimizer[cols.read_code[optimizer[cols.read_op]]] = True
    touched_by_optimizer[cols.write_code[optimizer[cols.write_op]]] = True
    persistent = external & (cols.mask(trace.parameters) | touched_by_optimizer | cols.mask(trace.preallocated))
    # as persistent_buffers()
    first[external] = 0
    end = last + 1
    end[persistent] = n
    occ = lifetime_occupancy(first[live], end[live], cols.nbytes[live], n)
    if copy:
        occ = occ + np.where(optimizer, copy, 0)
    return MemoryReport(device=device, peak_bytes=int(occ.max()), step_tasks=tuple(tasks), step_bytes=occ)


def record_memory(graph: TaskGraph, reports: Iterable[MemoryReport]) -> None:
    """Store per-GPU peak and traffic in ``graph.meta`` for the report."""
    mem = graph.meta.setdefault("memory", {})
    for r in reports:
        mem[r.device] = {
            "peak_bytes": r.peak_bytes,
            "fetched_bytes": r.fetched_bytes,
            "written_back_bytes": r.written_back_bytes,
            "evictions": r.evictions,
            # (task ids, bytes resident while each runs), for the timeline's memory counter
            "occupancy": (r.step_tasks, r.step_bytes),
        }


def build(trace: Trace, platform: Platform, strategy: Strategy) -> TaskGraph:
    """Case 0: every op on GPU 0, in trace order."""
    graph = TaskGraph()
    ops = list(range(len(trace.ops)))
    tasks = add_op_chain(graph, trace, 0, ops)
    report = plan_program_memory(graph, trace, platform, strategy, 0, ops, tasks)
    record_memory(graph, [report])
    graph.meta["devices"] = [0]
    return graph
