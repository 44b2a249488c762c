"""The optimizer step timed as the training precision runs it.

A trace records one optimizer (a model card's trace: one multi-tensor Adam op over the 16-bit
weights, their gradients and the two moments). A mixed-precision run steps differently: Megatron-LM
unscales the fp32 gradients, takes their norm, runs Adam on fp32 master weights and copies them
back to the 16-bit weights, then zeroes the gradient buffer
(:func:`triosim.trace.precision.optimizer_step_bytes`: 50 bytes per parameter for fp16, where
the traced op reads and writes 14). Those kernels are memory-bound, so when the ops are timed from
their shapes (the ``roofline`` op-time source) the optimizer ops, together, move that many bytes
per parameter of the trace; each keeps its share of the traced step's reads and writes. Measured
and retargeted times are left alone: they are the trace's own step.
"""

from __future__ import annotations

from dataclasses import replace

from ..trace import Trace
from ..trace.precision import OptimizerStepBytes, elements
from .op_time_source import RooflineTimes, ShapeCosts, with_op_times


def optimizer_ops(trace: Trace) -> list[int]:
    """The ops of the trace's optimizer step."""
    return [op.index for op in trace.ops if op.stage == "optimizer"]


def step_costs(trace: Trace, shapes: ShapeCosts, step: OptimizerStepBytes) -> ShapeCosts:
    """``shapes`` with the optimizer ops' bytes summing to ``step`` × the trace's parameters."""
    ops = optimizer_ops(trace)
    params = sum(elements(trace.tensors[p]) for p in trace.parameters)
    if not ops or params == 0:
        return shapes
    costs = list(shapes.costs)
    read = sum(costs[i].bytes_read for i in ops)
    written = sum(costs[i].bytes_written for i in ops)
    for i in ops:
        c = costs[i]
        r_share = c.bytes_read / read if read > 0 else 1.0 / len(ops)
        # a step that lists no written tensor writes where it reads
        w_share = c.bytes_written / written if written > 0 else r_share
        costs[i] = replace(c, bytes_read=r_share * params * step.read, bytes_written=w_share * params * step.written)
    return replace(shapes, costs=costs, _at={})


def with_optimizer_step(trace: Trace, step: OptimizerStepBytes) -> Trace:
    """``trace`` with its roofline-timed optimizer step moving ``step``'s bytes per parameter;
    unchanged when its ops are not timed from their shapes alone."""
    model = trace.op_time
    if type(model) is not RooflineTimes:
        return trace
    shapes = step_costs(trace, model.shapes, step)
    if shapes is model.shapes:
        return trace
    timed = replace(model, shapes=shapes, _times={}, _casts={})
    return with_op_times(trace, timed, timed.times(trace.batch_size), trace.info.get("time_source", "roofline"))


__all__ = ["optimizer_ops", "step_costs", "with_optimizer_step"]
