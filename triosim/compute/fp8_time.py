"""Op times of FP8 training: the linear layers' GEMMs at the fp8 peak plus their cast kernels.

An FP8 linear's op (:mod:`triosim.compute.fp8_linears`) takes its GEMM time and the time of the
memory-bound kernels that make its FP8 operands (:mod:`triosim.trace.fp8` has their bytes):

- the GEMM: the op's FLOPs at the device's fp8 matrix peak on its fp8 efficiency curve
  (``compute_by_dtype.fp8`` where the device file has one, else its default curve), reading its
  operands in FP8 (1 byte) and writing bf16 (2 bytes);
- forward: the quantize of its input x (M×K; and the amax pass before it under current scaling)
  — once per input: linears that read one input are one linear in Megatron-Core (fused QKV, fc1)
  —, plus ``weight_cast_share`` of its weight's cast (N×K, once per iteration: spread over the
  micro-batches; every micro-batch under ZeRO-3);
- backward (data and weight gradients): the quantize of the output gradient dy (M×N, with its amax
  pass under current scaling).

Each cast kernel is its own roofline (memory-bound: its bytes at the device's HBM rate and
memory efficiency, plus the launch floor). M follows the batch: it is the op's FLOPs over 2·N·K
(forward) or 4·N·K (backward) at each batch. Every other op keeps its roofline in bf16: the
attention core, norms, softmax, activations, embedding, loss and LM head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..hardware.device_db import Device
from ..trace.fp8 import CastBytes, Fp8Training, amax_bytes, quantize_bytes, weight_cast_kernels
from .fp8_linears import Fp8Linear, Fp8Linears
from .op_cost import OpCost
from .roofline import ELEMENT_BYTES, Precision, roofline_seconds

RAW = Precision()  # a cost's own dtype: the fp8 GEMM's, the bf16 casts'
CAST_FLOPS_PER_ELEMENT = 2.0  # scale and convert (the amax pass: 1); the casts are bytes-bound anyway


@dataclass(frozen=True)
class LinearCasts:
    """The cast kernels of one FP8 linear op at one batch, in the order they run."""

    kernels: tuple[CastBytes, ...]
    weight: tuple[CastBytes, ...] = ()  # the weight's cast, of which the op pays ``weight_cast_share``

    @property
    def bytes(self) -> int:
        return sum(k.total for k in self.kernels)


def linear_casts(lin: Fp8Linear, forward: bool, rows: int, fp8: Fp8Training, quantizes_input: bool = True
                 ) -> LinearCasts:
    """The cast kernels an FP8 linear's forward (``forward``) or backward op runs for ``rows``
    (M) rows: its input's (unless another linear quantized that input: ``quantizes_input``) or
    its output gradient's amax (current scaling) and quantize, and in the forward op its
    weight's cast."""
    elements = rows * (lin.k if forward else lin.n) if quantizes_input or not forward else 0
    kernels = tuple(k for k in (amax_bytes(elements, fp8), quantize_bytes(elements, fp8)) if k.total)
    return LinearCasts(kernels, weight_cast_kernels(lin.n * lin.k * lin.groups, fp8) if forward else ())


def _kernel_seconds(k: CastBytes, device: Device) -> float:
    elements = k.read / 2  # the bf16 values it reads (an FP8 transpose: half its bytes; close enough)
    cost = OpCost(CAST_FLOPS_PER_ELEMENT * elements, float(k.read), float(k.written), "fp8_cast", "elementwise", "bf16")
    return roofline_seconds(cost, device, RAW)


def fp8_gemm_cost(cost: OpCost) -> OpCost:
    """``cost`` as an FP8 GEMM: the same FLOPs, its operands read in FP8, its result in bf16."""
    each = ELEMENT_BYTES.get(cost.dtype, 2)
    return replace(cost, dtype="fp8", bytes_read=cost.bytes_read / each, bytes_written=cost.bytes_written * 2 / each)


@dataclass(frozen=True)
class Fp8Plan:
    """What the op-time model needs for FP8 training: the recipe and the trace's FP8 linears."""

    fp8: Fp8Training
    linears: Fp8Linears

    def seconds(self, costs: Sequence[OpCost], device: Device, precision: Precision) -> tuple[list[float], list[float]]:
        """Every op's time and the part of it in FP8 cast kernels."""
        times, casts = [], []
        fwd, bwd, quantizers = self.linears.forward, self.linears.backward, self.linears.quantizers
        for i, c in enumerate(costs):
            lin = fwd.get(i) or bwd.get(i)
            if lin is None or c.flops <= 0:
                times.append(roofline_seconds(c, device, precision))
                casts.append(0.0)
                continue
            forward = i in fwd
            rows = max(1, round(c.flops / ((2.0 if forward else 4.0) * lin.n * lin.k)))
            plan = linear_casts(lin, forward, rows, self.fp8, i in quantizers)
            cast = sum(_kernel_seconds(k, device) for k in plan.kernels)
            cast += self.fp8.weight_cast_share * sum(_kernel_seconds(k, device) for k in plan.weight)
            times.append(roofline_seconds(fp8_gemm_cost(c), device, RAW) + cast)
            casts.append(cast)
        return times, casts


__all__ = ["Fp8Plan", "LinearCasts", "fp8_gemm_cost", "linear_casts"]
