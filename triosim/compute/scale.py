"""Batch scaling: a trace recorded at one batch size, as it would be at another.

Tensor sizes follow the batch where they are activations or inputs (parameters, gradients and
optimizer state keep theirs); op times follow the trace's op-time model
(:mod:`triosim.compute.op_time`, attached here when the trace has none).
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import ConfigError
from ..trace import Trace
from ..trace.buffer_columns import tensor_bytes
from .op_time import attach_op_time_model


def scale_trace(trace: Trace, batch_size_sim: int, reference_compat: bool = False) -> Trace:
    """Scale a trace recorded at ``trace.batch_size`` to a per-GPU batch of ``batch_size_sim``.

    Op times follow the trace's op-time model (``trace.op_time``, see
    :mod:`triosim.compute.op_time`; linear when it has none, and always linear under
    ``reference_compat``). Default model: activation and input bytes scale, parameters,
    gradients and optimizer state do not (a tensor scales when its leading dimension is the
    batch, or its shape is unknown). ``reference_compat``: every tensor scales, with the
    original's truncation ``int(size / (batch / batch_sim))``.
    """
    if batch_size_sim <= 0:
        raise ConfigError(f"-batch-size-sim must be a positive integer, got {batch_size_sim}")
    if batch_size_sim == trace.batch_size:
        return trace
    ratio_sim = batch_size_sim / trace.batch_size
    bs_ratio = trace.batch_size / batch_size_sim
    tensors = {}
    for tid, t in trace.tensors.items():
        if reference_compat:
            new_bytes = int(float(t.bytes) / bs_ratio)
        elif tid in trace.batch_invariant or trace.base(tid) in trace.batch_invariant:
            new_bytes = t.bytes
        elif t.shape is None or (t.shape and t.shape[0] == trace.batch_size):
            new_bytes = int(round(t.bytes * ratio_sim))
        else:
            new_bytes = t.bytes
        tensors[tid] = t if new_bytes == t.bytes else _with(t, bytes=new_bytes)
    if trace.op_time is None and not reference_compat:
        # The command line's default op-time model, so that the Python API agrees with it.
        trace = attach_op_time_model(trace)
    model = None if reference_compat else trace.op_time
    ops = [
        _with(op, duration_s=op.duration_s / bs_ratio, span_s=op.span_s / bs_ratio)
        if model is None
        else _with(op, duration_s=model.seconds(op.index, batch_size_sim),
                   span_s=op.span_s * model.seconds(op.index, batch_size_sim) / op.duration_s
                   if op.duration_s > 0 else op.span_s / bs_ratio)
        for op in trace.ops
    ]
    scaled = replace(trace, ops=ops, tensors=tensors, batch_size=batch_size_sim)
    cached = trace._columns
    if cached is not None and cached[0] is trace.tensors and cached[1] is trace.reads and cached[2] is trace.writes:
        # Same buffers and lists, new sizes: only the size column changes.
        scaled._columns = (tensors, trace.reads, trace.writes, replace(cached[3], nbytes=tensor_bytes(tensors)))
    return scaled


def _with(obj, **changes):
    """A copy of ``obj`` (a Tensor or an Op) with ``changes``."""
    return obj._replace(**changes)


__all__ = ["scale_trace"]
