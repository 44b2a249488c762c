"""What each op's time is spent on, by kind of kernel: GEMMs, FP8 casts, attention, the rest.

- ``gemm``: the GEMMs of layers with weights (linear and convolution ops reading a parameter,
  forward and backward), in bf16 or, under FP8 training, in fp8;
- ``fp8_casts``: the quantize, transpose and amax kernels FP8 training adds to its linears
  (:mod:`triosim.compute.fp8_time`; 0 without FP8 training);
- ``attention``: the attention core (a fused attention op, or the batched products of an unfused
  one, which read no parameter);
- ``other``: everything else (norms, softmax, activations, embedding, loss, optimizer).

Seconds are the op's at the micro-batch its tasks run, as its op-time model gives them (the
weight casts FP8 training spreads over the micro-batches make their share depend on it); the time breakdown (:mod:`triosim.report.breakdown`) splits each
compute task's scheduled time by these shares.
"""

from __future__ import annotations

from ..trace import Trace
from .op_kinds import classify
from .op_time import op_seconds

PART_NAMES = ("gemm", "fp8_casts", "attention", "other")


def _cast_seconds(model, batch: int) -> list[float] | None:
    """Per op, the FP8 cast seconds of ``model`` (None when it has none), through a rewrite of the
    trace (recomputation's re-runs: op i is op origin[i] of the model's trace)."""
    origin = getattr(model, "origin", None)
    base = model.base if origin is not None else model
    get = getattr(base, "cast_seconds", None)
    if get is None:
        return None
    casts = get(batch)
    return [casts[o] for o in origin] if origin is not None else list(casts)


def op_kind(trace: Trace, i: int, params: frozenset[str]) -> str:
    """``gemm``, ``attention`` or ``other`` (see the module docstring)."""
    kind, op_class = classify(trace.ops[i].name, trace.ops[i].stage)
    if op_class == "attention":
        return "attention"
    if op_class in ("matmul", "conv"):
        return "gemm" if any(k in params for k in trace.reads[i]) else "attention"
    return "other"


def op_parts(trace: Trace, batch: int | None = None) -> tuple[tuple[float, float, float, float], ...]:
    """Per op, its seconds at ``batch`` samples (the micro-batch its tasks run; default the
    trace's batch) split into :data:`PART_NAMES`."""
    batch = trace.batch_size if batch is None else batch
    params = frozenset(trace.parameters)
    casts = _cast_seconds(trace.op_time, batch) if trace.op_time is not None else None
    out = []
    for i in range(len(trace.ops)):
        total = op_seconds(trace, i, batch)
        cast = min(total, casts[i]) if casts is not None else 0.0
        kind = op_kind(trace, i, params)
        rest = total - cast
        out.append((rest if kind == "gemm" else 0.0, cast, rest if kind == "attention" else 0.0,
                    rest if kind == "other" else 0.0))
    return tuple(out)


__all__ = ["PART_NAMES", "op_kind", "op_parts"]
