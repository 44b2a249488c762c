"""Data parallelism's gradient buckets — every GPU trains a full replica on its own batch and the
gradients are averaged with all-reduces — and case 1's replay of the original.

- **Case 1 (standard data parallel).** Each GPU runs forward and backward; after its last
  backward op one all-reduce of all gradient bytes (the parameter bytes of the trace, found from
  the tensor categories) runs, then every GPU runs the optimizer ops (:func:`whole_gradient`).
  ``--reference-compat`` follows the original: the all-reduce comes after the whole iteration,
  optimizer included (:func:`build_reference`).
- **Case 2 (PyTorch DDP).** Gradients are packed into buckets of ``--bucket-mb`` MiB (2**20
  bytes, as ``torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=…)``) in the order
  backward produces them (:func:`make_buckets`). A bucket's all-reduce starts on a GPU when the
  backward op completing its last gradient ends there, buckets go over the links one after
  another while backward compute continues, and the optimizer waits for the last bucket.

Both run as presets of the composition (:mod:`triosim.graph.composition`, its gradient sync in
:mod:`triosim.graph.data.gradient_sync`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...hardware.platform import Platform
from ...schedule.tasks import TaskGraph
from ...trace import Trace
from ...trace.precision import reduced_gradient_bytes
from ..collectives.algorithms import add_all_reduce
from ..memory.plan import plan_replicas
from ..single import add_op_chain, op_steps, persistent_buffers, record_memory
from ..strategy import Strategy

MIB = 2**20  # --bucket-mb unit, PyTorch's: bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)


@dataclass(frozen=True)
class Bucket:
    """Gradients all-reduced together; ``ready_op`` is the backward op completing the last one."""

    index: int
    params: tuple[str, ...]
    nbytes: int
    ready_op: int


def gradient_order(trace: Trace) -> list[str]:
    """Parameters in the order their gradients become complete (ties: reverse parameter order)."""
    pos = {p: i for i, p in enumerate(trace.parameters)}
    last = trace.last_backward_index()
    return sorted(trace.parameters, key=lambda p: (trace.grad_ready_op.get(p, last), -pos[p]))


def make_buckets(trace: Trace, bucket_bytes: float, params: Sequence[str] | None = None,
                 nbytes: Callable[[str], int] | None = None) -> list[Bucket]:
    """DDP bucketing: add gradients in production order (``params``; default every parameter, in
    :func:`gradient_order`), close a bucket once it holds ``bucket_bytes`` or more (a bucket may
    overshoot by its last gradient, as in PyTorch). ``nbytes``: a gradient's bytes on one GPU
    (default its whole size; its TP shard in the composition). A bucket is ready after the
    backward op completing its last gradient."""
    last = trace.last_backward_index()
    buckets: list[Bucket] = []
    cur: list[str] = []
    size = 0

    def close() -> None:
        nonlocal cur, size
        if cur:
            ready = max(trace.grad_ready_op.get(p, last) for p in cur)
            buckets.append(Bucket(len(buckets), tuple(cur), size, ready))
        cur, size = [], 0

    for p in gradient_order(trace) if params is None else params:
        cur.append(p)
        size += reduced_gradient_bytes(trace, p) if nbytes is None else nbytes(p)
        if size >= bucket_bytes:
            close()
    close()
    return buckets


def whole_gradient(trace: Trace) -> list[Bucket]:
    """Case 1's one bucket: every gradient (the trace's parameter bytes), ready after the last
    backward op; none when the trace has no parameters."""
    params = tuple(trace.parameters)
    return [Bucket(0, params, gradient_bytes(trace), trace.last_backward_index())] if params else []


def gradient_bytes(trace: Trace) -> int:
    """Every gradient's bytes as data parallelism reduces them: the trace's parameter bytes, or
    under a training precision its parameters' elements in the gradient-reduce dtype."""
    if trace.precision is None:
        return trace.parameter_bytes
    return sum(reduced_gradient_bytes(trace, p) for p in trace.parameters)


def build_reference(trace: Trace, platform: Platform, strategy: Strategy) -> TaskGraph:
    """Case 1 under ``--reference-compat``, as the original: every GPU of ``platform`` runs the
    whole iteration, optimizer included, then one all-reduce of every gradient on the logical
    ring. (Without ``--reference-compat`` case 1 is a preset of the composition.)"""
    graph = TaskGraph()
    devices = list(range(platform.num_gpus))
    program = list(range(len(trace.ops)))
    tasks = {g: add_op_chain(graph, trace, g, program) for g in devices}
    params = tuple(trace.parameters)
    buckets = [Bucket(0, params, gradient_bytes(trace), program[-1])] if params else []
    for b in buckets:
        add_all_reduce(graph, platform, platform.ring, b.nbytes, "allreduce gradients",
                       after={g: [tasks[g][-1]] for g in devices}, detail=strategy.collective_detail, bucket=b.index)
    sizes = {k: t.bytes for k, t in trace.tensors.items()}
    reports = plan_replicas(
        graph, platform, devices, lambda g: op_steps(trace, program, tasks[g]), sizes,
        external=trace.external, persistent=persistent_buffers(trace), placement=strategy.initial_placement,
    )
    record_memory(graph, reports)
    graph.meta["devices"] = devices
    graph.meta["buckets"] = buckets_block(trace, buckets)
    graph.meta["gradient_bytes"] = sum(b.nbytes for b in buckets)
    return graph


def buckets_block(trace: Trace, buckets: Sequence[Bucket]) -> list[dict]:
    """The JSON ``buckets`` block: each bucket's bytes, parameters and the op completing it."""
    return [{"bucket": b.index, "bytes": b.nbytes, "params": len(b.params), "ready_op": trace.ops[b.ready_op].op_id}
            for b in buckets]
