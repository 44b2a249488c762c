"""Mixed-precision training: a trace's buffers resized by role to the dtypes a run trains in.

A trace records every tensor in the dtype it was traced in. Under a training precision
(:class:`~triosim.trace.precision.TrainingPrecision`, ``--dtype bf16|fp16|fp32``) each buffer
that holds floats of the traced dtype takes the size its role has in Megatron-LM's mixed
precision (the facts: :mod:`triosim.trace.precision`):

- weights: the training dtype;
- gradients: the gradient-reduce dtype; they are Megatron's contiguous gradient buffer, which
  exists for the whole iteration (``preallocated``), so sharding them (ZeRO-2) lowers the peak by
  (N−1)/N of them wherever the peak falls;
- optimizer state: fp32 moments (or the precision-aware optimizer's dtypes), and in a 16-bit
  run the master weights on top; the trace has no buffer for the master copy, and its two
  moment buffers are alike, so the state's bytes are spread over the optimizer-state buffers in
  proportion to their elements (Adam with fp32 moments: each moment buffer carries half a
  parameter's master copy, 4 + 2 bytes per element), which keeps them sharded with the state
  under ZeRO-1. The fp32 copy
  of a 16-bit gradient exists only while the optimizer runs: the trace records its share of the
  state's bytes (``Trace.gradient_copy``) and the memory plan holds it at the optimizer's steps;
- every other float buffer (activations, temporaries): the training dtype.

Under FP8 training (``--dtype fp8``: bf16 plus :mod:`triosim.trace.fp8`) two kinds of buffers
also hold FP8 copies, as Transformer Engine keeps them:

- an FP8 linear's weight: bf16 plus its cached FP8 copies, one per usage its GEMMs need
  (:func:`~triosim.trace.fp8.weight_copy_bytes`), or with ``--fp8-param-gather`` those copies
  alone (the FP8 parameter and, on Hopper, its transpose); its element size stays the dtype ZeRO
  gathers it in (bf16, or FP8), so the gathers move that (:func:`~triosim.trace.precision.
  gathered_parameter_bytes`);
- an FP8 linear's input, saved for the weight gradient as an FP8 copy
  (:func:`~triosim.trace.fp8.saved_input_bytes`): that copy alone when only FP8 linears read the
  input (their forward and backward ops), beside the bf16 tensor when another op reads it too
  (the attention output, read by the attention backward). Sequence parallelism's all-gather of
  such an input then moves FP8, as Transformer Engine's quantized all-gather does.

Tensors of other element sizes (int64 indices, bool masks) and index-like categories keep their
size. Op times come from the trace or the GPU model (``--gpu``); of them only the optimizer
step's follow the precision, when the GPU model times the ops from their shapes: it then moves
the bytes per parameter Megatron-LM's step moves (:mod:`triosim.compute.optimizer_step`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ...compute.fp8_linears import Fp8Linears, find_fp8_linears
from ...compute.fp8_training import with_fp8_training
from ...compute.optimizer_step import with_optimizer_step
from ...trace import Tensor, Trace
from ...trace.fp8 import gathered_bytes_per_element, saved_input_bytes, weight_copy_bytes
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
    linears = find_fp8_linears(trace) if precision.fp8 is not None else None
    sizer = _RoleSizer(trace, roles, precision, width, linears)
    tensors = {tid: sizer.resize(tid, t) for tid, t in trace.tensors.items()}
    out = replace(trace, tensors=tensors, precision=precision,
                  preallocated=frozenset(k for k in roles.gradients if tensors[k].bytes > 0),
                  gradient_copy=sizer.gradient_copy())
    # The data flow is the trace's: keep what it already derived.
    out._partner, out._consumers, out._grad_ready = trace._partner, trace._consumers, trace._grad_ready
    stepped = with_optimizer_step(out, optimizer_step_bytes(precision))
    if stepped is not out:
        stepped._partner, stepped._consumers, stepped._grad_ready = out._partner, out._consumers, out._grad_ready
    if precision.fp8 is not None and linears is not None:
        stepped = with_fp8_training(stepped, precision.fp8, linears)
    return stepped


class _RoleSizer:
    """New bytes of each tensor by its buffer's role."""

    def __init__(self, trace: Trace, roles: BufferRoles, precision: TrainingPrecision, width: int,
                 linears: Fp8Linears | None = None) -> None:
        self.trace, self.roles, self.precision, self.width = trace, roles, precision, width
        self.fp8_weights = linears.weights if linears is not None else frozenset()
        # FP8 linear inputs -> whether an op other than an FP8 linear reads them too
        self.fp8_inputs: dict[str, bool] = {}
        if linears is not None:
            fp8_ops = {*linears.forward, *linears.backward}
            for x in linears.inputs:
                self.fp8_inputs[x] = any(c not in fp8_ops for c in trace.consumers.get(x, ()))
        tensors = trace.tensors
        # Optimizer state of the traced width or already fp32 (a model card's trace keeps Adam's
        # moments in fp32 beside 16-bit weights): both take the fp32 moments plus the master copy.
        state = [k for k in roles.optimizer if self._float_state(tensors[k])]
        # The master copy per parameter, spread over the state's elements; the two moments'
        # bytes averaged over them (2·m: Adam's moments together, m the state element's share).
        self.weight_elements = sum(elements(tensors[p]) for p in roles.weights)
        self.extra_numerator = 2 * precision.master_weight_bytes * self.weight_elements
        self.state_elements = sum(elements(tensors[k]) for k in state)
        self.moments = precision.moment_bytes  # both moments: 2·m per state element pair

    def gradient_copy(self) -> tuple[int, int]:
        """The fp32 gradient copy's bytes per byte of optimizer state: per state element it is
        gc·P/S beside the element's m + mw·P/S (P weight, S state elements, m a moment's mean
        bytes)."""
        gc = self.precision.gradient_copy_bytes
        if not gc or not self.state_elements:
            return (0, 1)
        num, den = 2 * gc * self.weight_elements, self.moments * self.state_elements + self.extra_numerator
        return (num // 2, den // 2) if den % 2 == 0 else (num, den)  # halved back when whole

    def _float_state(self, t: Tensor) -> bool:
        return t.each_byte in (self.width, OPTIMIZER_STATE_BYTES) and t.category not in NOT_FLOAT_CATEGORIES

    def resize(self, tid: str, t: Tensor) -> Tensor:
        if t.category in NOT_FLOAT_CATEGORIES or t.bytes == 0:
            return t
        role = self.roles.role(self.trace.base(tid))
        if t.each_byte != self.width and not (role == "optimizer" and self._float_state(t)):
            return t
        p = self.precision
        base = self.trace.base(tid)
        if p.fp8 is not None and base in self.fp8_weights:
            n = elements(t)
            each = gathered_bytes_per_element(p.fp8, p.weight_bytes)
            held = weight_copy_bytes(n, p.fp8) + (0 if p.fp8.param_gather else n * p.weight_bytes)
            return t._replace(bytes=held, each_byte=each)
        if p.fp8 is not None and base in self.fp8_inputs and role is None:
            n = t.bytes // t.each_byte  # batch-scaled (its numel is the traced batch's)
            kept = n * p.weight_bytes if self.fp8_inputs[base] else 0  # the bf16 tensor another op reads
            return t._replace(bytes=kept + saved_input_bytes(n, p.fp8), each_byte=p.weight_bytes if kept else 1)
        if role == "weights":
            return _sized(t, p.weight_bytes)
        if role == "gradients":
            return _sized(t, p.gradient_bytes)
        if role == "optimizer":
            each = max(1, self.moments // 2)  # a moment element's bytes (their mean)
            if not self.state_elements:
                return _sized(t, each)
            # elements × (m + mw · P / S), rounded up (all terms doubled: m may be a half byte)
            num = t.bytes * (self.moments * self.state_elements + self.extra_numerator)
            den = 2 * t.each_byte * self.state_elements
            return t._replace(bytes=-(-num // den), each_byte=each)
        return _sized(t, p.weight_bytes)


def _sized(t: Tensor, each: int) -> Tensor:
    """``t`` with ``each`` bytes per element (its bytes, batch-scaled, rescaled; rounded up)."""
    if each == t.each_byte:
        return t
    return t._replace(bytes=-(-t.bytes * each // t.each_byte), each_byte=each)


__all__ = ["traced_float_width", "with_training_precision"]
