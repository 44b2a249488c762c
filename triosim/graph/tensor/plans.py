"""The tensor-parallel plan a hybrid run follows: per-op time scales, the TP collectives and the
buffers each TP rank holds a shard of.

``megatron`` style comes from :mod:`triosim.graph.tensor.megatron` (transformer block detection);
``per-op`` is case 3's scheme (:mod:`triosim.graph.tensor.per_op`) in the same shape, and is
what the megatron style falls back to when it finds no transformer blocks (or is unavailable).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import ConfigError
from ...trace import Trace
from .per_op import TpCollective, sharded_buffers, tp_collectives


@dataclass(frozen=True)
class PerOpPlan:
    """Case 3's per-op tensor parallelism as a plan (fields as the megatron plan's)."""

    style: str
    degree: int
    time_scale: tuple[float, ...]
    collectives: tuple[TpCollective, ...]
    shard_divisor: dict[str, int] = field(default_factory=dict)
    blocks: tuple = ()
    fallback_reason: str | None = None


def per_op_plan(trace: Trace, degree: int, fallback_reason: str | None = None) -> PerOpPlan:
    """tpflag ops at 1/T time with an all-gather (forward) / all-reduce (backward) after each."""
    # As tensor_parallel.op_time: a tpflag op (not the optimizer) works on a 1/T shard.
    scale = tuple(1.0 / degree if op.tpflag and op.stage != "optimizer" else 1.0 for op in trace.ops)
    shards = {k: degree for k in sharded_buffers(trace)} if degree > 1 else {}
    return PerOpPlan("per-op", degree, scale, tuple(tp_collectives(trace, degree)), shards, (), fallback_reason)


def tensor_plan(trace: Trace, degree: int, style: str, sequence_parallel: bool = False):
    """The plan for ``degree`` TP ranks in ``style`` (``megatron`` or ``per-op``)."""
    if style == "per-op" and sequence_parallel and degree > 1:
        raise ConfigError("--sequence-parallel needs --tp-style megatron")
    if style == "per-op" or degree < 2:
        return per_op_plan(trace, degree)
    try:
        from .megatron import plan_tensor_parallel
    except ImportError:
        return per_op_plan(trace, degree, "the megatron tensor-parallel plan is not available in this build")
    return plan_tensor_parallel(trace, degree, style=style, sequence_parallel=sequence_parallel)
