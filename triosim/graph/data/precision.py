"""Mixed-precision training: a trace's buffers resized by role to the dtypes a run trains in.

A trace records every tensor in the dtype it was traced in. Under a training precision
(:class:`~triosim.trace.precision.TrainingPrecision`, ``--dtype bf16|fp16|fp32``) each buffer
that holds floats of the traced dtype takes the size its role has in Megatron-LM's mixed
precision (the facts: :mod:`triosim.trace.precision`):

- weights: the training dtype;
- gradients: the gradient-reduce dtype; they are Megatron's contiguous gradient buffer, which
  exists for the whole iteration (``preallocated``), so sharding them (ZeRO-2) lowers the peak by
  (N−1)/N of them wherever the peak falls;
- optimizer state: fp32 moments, and in a 16-bit run the fp32 master weights (and the fp32 copy
  of a 16-bit gradient) on top; the trace has no buffer for the master copy, so its bytes are
  spread over the optimizer-state buffers in proportion to their elements (Adam: each moment
  buffer carries half a parameter's master copy, 4 + 2 bytes per element), which keeps them
  sharded with the state under ZeRO-1;
- every other float buffer (activations, temporaries): the training dtype.

Tensors of other element sizes (int64 indices, bool masks) and index-like categories keep their
size. Op times come from the trace or the GPU model (``--gpu``); of them only the optimizer
step's follow the precision, when the GPU model times the ops from their shapes: it then moves
the bytes per parameter Megatron-LM's step moves (:mod:`triosim.compute.optimizer_step`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ...compute.optimizer_step import with_optimizer_step
from ...trace import Tensor, Trace
from ...trace.precision import (
    NOT_FLOAT_CATEGORIES,
    OPTIMIZER_STATE_BYTES,
    TrainingPrecision,
    elements,
    optimizer_step_bytes,
)
from .zero import BufferRoles, buffer_roles


def traced_float_width(trace: Trace) -> int:
    """Bytes per element of the trace's floats: its parameters' (most of them), else 4."""
    widths = Counter(trace.tensors[p].each_byte for p in trace.parameters)
    return max(widths, key=lambda w: (widths[w], w)) if widths else 4


def with_training_precision(trace: Trace, precision: TrainingPrecision | None) -> Trace:
    """``trace`` with its buffers sized for ``precision`` (unchanged for None: as traced)."""
    if precision is None or trace.precision == precision:
        return trace
    if trace.precision is not None:
        raise ValueError(f"the trace is already sized for {trace.precision}; resize the traced trace")
    roles = buffer_roles(trace)
    width = traced_float_width(trace)
    sizer = _RoleSizer(trace, roles, precision, width)
    tensors = {tid: sizer.resize(tid, t) for tid, t in trace.tensors.items()}
    out = replace(trace, tensors=tensors, precision=precision,
                  preallocated=frozenset(k for k in roles.gradients if tensors[k].bytes > 0))
    # The data flow is the trace's: keep what it already derived.
    out._partner, out._consumers, out._grad_ready = trace._partner, trace._consumers, trace._grad_ready
    stepped = with_optimizer_step(out, optimizer_step_bytes(precision))
    if stepped is not out:
        stepped._partner, stepped._consumers, stepped._grad_ready = out._partner, out._consumers, out._grad_ready
    return stepped


class _RoleSizer:
    """New bytes of each tensor by its buffer's role."""

    def __init__(self, trace: Trace, roles: BufferRoles, precision: TrainingPrecision, width: int) -> None:
        self.trace, self.roles, self.precision, self.width = trace, roles, precision, width
        tensors = trace.tensors
        # Optimizer state of the traced width or already fp32 (a model card's trace keeps Adam's
        # moments in fp32 beside 16-bit weights): both take the fp32 moments plus the master copy.
        state = [k for k in roles.optimizer if self._float_state(tensors[k])]
        # The master copy (and fp32 gradient copy) per parameter, spread over the state's elements.
        self.extra_numerator = precision.master_bytes * sum(elements(tensors[p]) for p in roles.weights)
        self.state_elements = sum(elements(tensors[k]) for k in state)

    def _float_state(self, t: Tensor) -> bool:
        return t.each_byte in (self.width, OPTIMIZER_STATE_BYTES) and t.category not in NOT_FLOAT_CATEGORIES

    def resize(self, tid: str, t: Tensor) -> Tensor:
        if t.category in NOT_FLOAT_CATEGORIES or t.bytes == 0:
            return t
        role = self.roles.role(self.trace.base(tid))
        if t.each_byte != self.width and not (role == "optimizer" and self._float_state(t)):
            return t
        p = self.precision
        if role == "weights":
            return _sized(t, p.weight_bytes)
        if role == "gradients":
            return _sized(t, p.gradient_bytes)
        if role == "optimizer":
            if not self.state_elements:
                return _sized(t, OPTIMIZER_STATE_BYTES)
            # elements × (4 + extra · P / S), rounded up
            num = t.bytes * (OPTIMIZER_STATE_BYTES * self.state_elements + self.extra_numerator)
            den = t.each_byte * self.state_elements
            return t._replace(bytes=-(-num // den), each_byte=OPTIMIZER_STATE_BYTES)
        return _sized(t, p.weight_bytes)


def _sized(t: Tensor, each: int) -> Tensor:
    """``t`` with ``each`` bytes per element (its bytes, batch-scaled, rescaled; rounded up)."""
    if each == t.each_byte:
        return t
    return t._replace(bytes=-(-t.bytes * each // t.each_byte), each_byte=each)


__all__ = ["traced_float_width", "with_training_precision"]
