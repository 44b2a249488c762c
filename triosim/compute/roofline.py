"""Roofline op time on a device, and retargeting a measured trace to another device.

An op of F FLOPs that moves B bytes takes, on device D,

    t = max(F / (peak · eff_compute(F)), B / (HBM · eff_mem(B)), R / rate(blocks)) + launch_floor

(with ``processing_mode: no_overlap`` in the device file, the first two terms are added instead:
the op does not hide its memory traffic behind its math),

with ``peak`` the dense matrix-unit rate for the matmul, conv and attention classes and the
vector rate for every other op, in the op's math dtype (:func:`math_dtype`), and the efficiency
curves the device file's (:mod:`triosim.hardware.device_db`; vector-unit ops use its ``vector``
curve where it has one; a fused attention op uses the file's measured attention curve for its
head size, direction and mask, at its keys per query, where the file has one). The third term
is for kernels
whose parallelism the op's shape limits (cuDNN's training batch norm: one thread block per
channel): R bytes read at ``min(blocks, SMs) × the device's single-block read rate``; it applies
only when both the op (:attr:`OpCost.blocks`) and the device file give it. Since every
efficiency is at most 1 and the floor is positive, t ≥ F/peak and t ≥ B/HBM for every op.

Math dtype: the trace's element size (4 bytes: fp32, 2: bf16, 1: fp8) unless :class:`Precision`
names one (``bf16`` for mixed precision: the matrix-unit ops then run and move their tensors
in bf16, the others as traced, as under autocast; a traced 2-byte type is read as the named
16-bit type, which a trace's element size cannot tell from the other). An fp32 convolution runs
in TF32 where the device has it, an fp32 matmul does not: PyTorch's defaults
(``torch.backends.cudnn.allow_tf32`` is True, ``torch.backends.cuda.matmul.allow_tf32`` is False
since 1.12).

Retarget: a trace measured on device S keeps what the measurement knows (kernel choice, fusion)
and moves only what the hardware changes: op i on T takes ``measured_i · t_T(i) / t_S(i)``. On
S itself that is the measured time, returned unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..hardware.device_db import DTYPES, Device
from ..trace import Trace
from .op_cost import OpCost, trace_op_costs

HALF = ("bf16", "fp16")  # the 2-byte float types, which a trace's element size cannot tell apart
ELEMENT_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class Precision:
    """How the ops run: ``dtype`` None keeps the trace's; the TF32 switches are PyTorch's."""

    dtype: str | None = None
    tf32_conv: bool = True
    tf32_matmul: bool = False

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


DEFAULT_PRECISION = Precision()


def math_dtype(cost: OpCost, device: Device, precision: Precision = DEFAULT_PRECISION) -> str:
    """The dtype whose peak times ``cost`` on ``device``."""
    if not cost.on_matrix_units:
        if precision.dtype in HALF and cost.dtype in HALF:
            return precision.dtype  # a traced 2-byte type may be either: the run's says which
        return cost.dtype
    dtype = precision.dtype or cost.dtype
    if precision.dtype is None and dtype == "bf16" and "bf16" not in device.matrix_flops:
        dtype = "fp16"  # a traced 2-byte type may be either; a device without bf16 runs it as fp16
    if dtype == "fp32" and "tf32" in device.matrix_flops:
        tf32 = precision.tf32_conv if cost.op_class == "conv" else precision.tf32_matmul
        if tf32:
            return "tf32"
    return dtype


def peak_flops(cost: OpCost, device: Device, precision: Precision = DEFAULT_PRECISION) -> float:
    """The peak (FLOP/s) the roofline divides ``cost``'s FLOPs by."""
    dtype = math_dtype(cost, device, precision)
    return device.matrix_peak(dtype) if cost.on_matrix_units else device.vector_peak(dtype)


def moved_bytes(cost: OpCost, precision: Precision = DEFAULT_PRECISION) -> float:
    """Bytes the op moves: as traced, or rescaled to ``precision.dtype`` for a matrix-unit op."""
    if precision.dtype is None or not cost.on_matrix_units:
        return cost.bytes
    return cost.bytes * ELEMENT_BYTES[precision.dtype] / ELEMENT_BYTES[cost.dtype]


def roofline_seconds(cost: OpCost, device: Device, precision: Precision = DEFAULT_PRECISION) -> float:
    """The roofline time of one op on ``device`` (see the module docstring)."""
    flops = cost.flops
    nbytes = moved_bytes(cost, precision)
    dtype = math_dtype(cost, device, precision)
    peak = device.matrix_peak(dtype) if cost.on_matrix_units else device.vector_peak(dtype)
    curve = device.compute_curve(dtype) if cost.on_matrix_units else device.vector_curve(dtype)
    at = flops
    if cost.attention is not None and flops > 0:
        head_dim, causal, keys = cost.attention
        measured = device.attention_efficiency
        fused = measured.curve(cost.kind == "attention_backward", causal, head_dim) if (
            measured is not None and dtype in HALF) else None
        if fused is not None:
            curve, at = fused, keys  # a fused kernel's efficiency follows its sequence, not its FLOPs
        elif causal:
            # unmeasured: the kernel is charged as if it computed every tile of the full mask
            # at the GEMM curve (an upper bound: on the measured Hopper kernels causal attention
            # runs 1.6-1.9x faster than that)
            flops *= 2.0
            at = flops
    compute = flops / (peak * curve.at(at)) if flops > 0 else 0.0
    memory = nbytes / (device.hbm_bytes_per_s * device.memory_efficiency.at(nbytes)) if nbytes > 0 else 0.0
    rate = device.block_limited_rate(cost.blocks)
    parallel = cost.bytes_read * nbytes / cost.bytes / rate if rate and cost.bytes > 0 else 0.0
    return max(device.combine(compute, memory), parallel) + device.launch_floor_s


def trace_roofline(trace: Trace, device: Device, precision: Precision = DEFAULT_PRECISION,
                   costs: Sequence[OpCost] | None = None) -> list[float]:
    """Every op's roofline time on ``device`` (``costs``: the trace's op costs, if at hand)."""
    costs = trace_op_costs(trace) if costs is None else costs
    return [roofline_seconds(c, device, precision) for c in costs]


def retarget_seconds(measured: float, cost: OpCost, source: Device, target: Device,
                     precision: Precision = DEFAULT_PRECISION) -> float:
    """An op measured at ``measured`` seconds on ``source``, on ``target``; on the source device
    itself the measured time, unchanged."""
    if target == source:
        return measured
    return measured * (roofline_seconds(cost, target, precision) / roofline_seconds(cost, source, precision))


def retarget_trace(trace: Trace, source: Device, target: Device, precision: Precision = DEFAULT_PRECISION,
                   costs: Sequence[OpCost] | None = None) -> list[float]:
    """Every op's measured time moved from ``source`` to ``target``."""
    if target == source:
        return [op.duration_s for op in trace.ops]
    costs = trace_op_costs(trace) if costs is None else costs
    return [retarget_seconds(op.duration_s, c, source, target, precision) for op, c in zip(trace.ops, costs)]


__all__ = ["DEFAULT_PRECISION", "Precision", "math_dtype", "moved_bytes", "peak_flops", "retarget_seconds",
           "retarget_trace", "roofline_seconds", "trace_roofline"]
