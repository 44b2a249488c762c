"""Cases 1 and 2: data parallelism — every GPU trains a full replica on its own batch and the
gradients are averaged with ring all-reduces.

- **Case 1 (standard data parallel).** Each GPU runs forward and backward; after its last
  backward op one all-reduce of all gradient bytes (the parameter bytes of the trace, found from
  the tensor categories) runs, then every GPU runs the optimizer ops. ``--reference-compat``
  follows the original: the all-reduce comes after the whole iteration, optimizer included.
- **Case 2 (PyTorch DDP).** Gradients are packed into buckets of ``--bucket-mb`` MiB (2**20
  bytes, as ``torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=…)``) in the order
  backward produces them. A bucket's all-reduce starts on a GPU when the backward op completing
  its last gradient ends there, buckets go over the links one after another while backward
  compute continues, and the optimizer waits for the last bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...hardware.platform import Platform
from ...schedule.tasks import TaskGraph
from ...trace import Trace
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
        size += trace.tensors[p].bytes if nbytes is None else nbytes(p)
        if size >= bucket_bytes:
            close()
    close()
    return buckets


def _split_program(trace: Trace, reduce_after_optimizer: bool) -> tuple[list[int], list[int]]:
    """Ops before the gradient all-reduce and ops after it (the optimizer step)."""
    n = len(trace.ops)
    if reduce_after_optimizer:
        return list(range(n)), []
    cut = trace.last_backward_index() + 1
    return list(range(cut)), list(range(cut, n))


def build(trace: Trace, platform: Platform, strategy: Strategy) -> TaskGraph:
    """Case 1 or 2 on every GPU of ``platform``; the collective group is its logical ring."""
    graph = TaskGraph()
    devices = list(range(platform.num_gpus))
    group: Sequence[int] = platform.ring
    ddp = strategy.preset.gradient_sync == "buckets"
    pre_ops, post_ops = _split_program(trace, strategy.reference_compat and not ddp)
    pre_tasks = {g: add_op_chain(graph, trace, g, pre_ops) for g in devices}
    task_of = {g: dict(zip(pre_ops, pre_tasks[g])) for g in devices}

    if ddp:
        buckets = make_buckets(trace, strategy.bucket_mb * MIB)
    else:
        params = tuple(trace.parameters)
        buckets = [Bucket(0, params, trace.parameter_bytes, pre_ops[-1])] if params else []

    done: dict[int, list[int]] = {g: [] for g in devices}
    for b in buckets:
        # Per GPU: the bucket waits for its last gradient there and for the previous bucket.
        after = {g: [task_of[g][b.ready_op], *done[g]] for g in devices}
        label = f"allreduce bucket{b.index}" if ddp else "allreduce gradients"
        synced = add_all_reduce(
            graph, platform, group, b.nbytes, label, after=after,
            detail=strategy.collective_detail, bucket=b.index,
        )
        done = {g: [synced[g]] for g in devices}

    post_tasks = {
        g: add_op_chain(graph, trace, g, post_ops, after=[pre_tasks[g][-1], *done[g]]) if post_ops else []
        for g in devices
    }
    program = pre_ops + post_ops
    sizes = {k: t.bytes for k, t in trace.tensors.items()}
    reports = plan_replicas(
        graph, platform, devices, lambda g: op_steps(trace, program, pre_tasks[g] + post_tasks[g]), sizes,
        external=trace.external, persistent=persistent_buffers(trace), placement=strategy.initial_placement,
    )
    record_memory(graph, reports)
    graph.meta["devices"] = devices
    graph.meta["buckets"] = [
        {"bucket": b.index, "bytes": b.nbytes, "params": len(b.params), "ready_op": trace.ops[b.ready_op].op_id}
        for b in buckets
    ]
    graph.meta["gradient_bytes"] = sum(b.nbytes for b in buckets)
    return graph
