"""An op split over tensor-parallel ranks, timed at its size on one rank.

A plan says which ops each of T ranks runs on a 1/T share (:class:`TensorParallelPlan.time_scale`).
Dividing the whole op's time by T assumes the share runs at the whole op's efficiency and moves
1/T of its bytes; neither holds on a GPU. A GEMM of 1/T the FLOPs sits lower on the device's
efficiency curve, and a column-parallel linear still reads the whole (replicated or gathered)
input, a row-parallel one still writes the whole partial sum. When the ops are timed from their
shapes on a device (the ``roofline`` and ``retarget`` op-time sources), the share is costed
as what one rank runs:

- FLOPs × the plan's share;
- a matrix-unit op (linear, matmul, attention): each tensor it reads or writes at its size on
  one rank: sharded buffers (the plan's ``shard_divisor``: weights, the block's inner
  activations) divided; the block's edges (its input, whole or all-gathered, the row linear's
  partial sum, and their gradients) whole, though ranks may keep only shards of them;
- any other split op (elementwise inside a block, the sequence-parallel norms and dropouts):
  its bytes × the share, as its tensors are all shards;

and its time becomes ``time(op) × roofline(share) / roofline(op)``, so the op-time source's
own calibration (a retarget's measured time) carries over. Measured traces keep 1/T: their
times are the trace's, not a model of the device.
"""

from __future__ import annotations

from ...compute.op_cost import OpCost
from ...compute.roofline import roofline_seconds
from ...trace import Trace


def _shape_model(trace: Trace):
    """(device, precision, costs at the traced batch, that batch) of a shape-timed trace, else None."""
    model = trace.op_time
    target = getattr(model, "target", model)  # a retarget times the share on its target
    shapes = getattr(target, "shapes", None)
    device = getattr(target, "device", None)
    if shapes is None or device is None:
        return None
    return device, target.precision, shapes.costs, shapes.batch


def share_cost(trace: Trace, index: int, cost: OpCost, share: float, divisor: dict[str, int],
               whole: frozenset[str] = frozenset(), batch: int | None = None) -> OpCost:
    """The work one rank does of op ``index`` when it runs ``share`` of it (see the module doc);
    ``whole``: buffers a matrix-unit op reads or writes whole although ranks keep shards of them;
    ``batch``: the batch ``cost`` was taken at, when the trace's tensors are at another."""
    if not cost.on_matrix_units:
        return cost.with_work(cost.flops * share, cost.bytes_read * share, cost.bytes_written * share)

    ratio = 1.0 if batch is None else batch / trace.batch_size
    invariant = trace.batch_invariant

    def size(k: str) -> float:  # the buffer's bytes at the cost's batch
        return trace.bytes_of(k) * (1.0 if k in invariant else ratio)

    def kept(keys: tuple[str, ...]) -> float:
        total = sum(size(k) for k in keys)
        if total <= 0:
            return share
        return sum(size(k) / (1 if k in whole else divisor.get(k, 1)) for k in keys) / total

    return cost.with_work(cost.flops * share, cost.bytes_read * kept(trace.reads[index]),
                          cost.bytes_written * kept(trace.writes[index]))


def block_edges(blocks) -> frozenset[str]:
    """What a block's linears read or write whole: its input (gathered under sequence
    parallelism), its output (the row linear's partial sum) and the gradients of both."""
    return frozenset(k for b in blocks for k in (*b.entries, *b.output, *b.output_grad, *b.input_grad))


def split_time_scale(trace: Trace, time_scale: tuple[float, ...], divisor: dict[str, int],
                     whole: frozenset[str] = frozenset()) -> tuple[float, ...]:
    """Per op, time on one rank / time of the whole op, for a shape-timed trace (the plan's
    ``time_scale`` unchanged for a measured one)."""
    found = _shape_model(trace)
    if found is None:
        return time_scale
    device, precision, costs, batch = found
    out = []
    for i, share in enumerate(time_scale):
        if share == 1.0 or trace.ops[i].stage == "optimizer":
            out.append(share)
            continue
        full = roofline_seconds(costs[i], device, precision)
        part = roofline_seconds(share_cost(trace, i, costs[i], share, divisor, whole, batch), device, precision)
        out.append(part / full if full > 0 else share)
    return tuple(out)


__all__ = ["block_edges", "share_cost", "split_time_scale"]
