"""A trace's roofline op times switched to FP8 training (:mod:`triosim.compute.fp8_time`).

Applied with the training precision (:func:`triosim.graph.data.precision.with_training_precision`)
to a trace timed by the roofline in bf16 (``--dtype fp8`` makes :func:`~triosim.compute.
op_time_source.time_on_device` time every op in bf16 and refuses a measured or retargeted
trace): its FP8 linears then take their fp8 GEMM and cast-kernel times, at every batch, and the
run's GPU line names the math dtypes by their FLOPs.
"""

from __future__ import annotations

from dataclasses import replace

from ..trace import Trace
from ..trace.fp8 import Fp8Training
from .fp8_linears import Fp8Linears, find_fp8_linears
from .fp8_time import Fp8Plan
from .op_time_source import RooflineTimes, with_op_times


def with_fp8_training(trace: Trace, fp8: Fp8Training, linears: Fp8Linears | None = None) -> Trace:
    """``trace`` with its roofline op times those of FP8 training (unchanged when its ops are not
    timed by the roofline: measured times are refused before)."""
    model = trace.op_time
    if type(model) is not RooflineTimes:
        return trace
    linears = find_fp8_linears(trace) if linears is None else linears
    timed = replace(model, fp8=Fp8Plan(fp8, linears), _times={}, _casts={})
    if model.gpu is not None and linears.forward:
        timed.gpu = replace(model.gpu, dtype=_label(timed))
    out = with_op_times(trace, timed, timed.times(trace.batch_size), trace.info.get("time_source", "roofline"))
    out._partner, out._consumers, out._grad_ready = trace._partner, trace._consumers, trace._grad_ready
    return out


def _label(model: RooflineTimes) -> str:
    """``fp8/bf16``: the math dtypes of the matrix-unit ops, the one doing most FLOPs first."""
    assert model.fp8 is not None
    fp8_ops = {*model.fp8.linears.forward, *model.fp8.linears.backward}
    flops = {"fp8": 0.0, model.precision.dtype or "bf16": 0.0}
    for i, c in enumerate(model.shapes.costs):
        if c.on_matrix_units and c.flops > 0:
            key = "fp8" if i in fp8_ops else model.precision.dtype or "bf16"
            flops[key] += c.flops
    return "/".join(d for d in sorted(flops, key=lambda d: -flops[d]) if flops[d] > 0)


__all__ = ["with_fp8_training"]
