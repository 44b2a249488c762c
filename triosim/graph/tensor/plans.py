"""The tensor-parallel plan a hybrid run follows: per-op time scales, the TP collectives and the
buffers each TP rank holds a shard of.

``megatron`` style comes from :mod:`triosim.graph.tensor.megatron` (transformer block detection);
``per-op`` is case 3's scheme (:mod:`triosim.graph.tensor.per_op`) in the same shape, and is
what the megatron style falls back to when it finds no transformer blocks. :func:`tp_waits` is
the data flow the plan's collectives impose (which op waits for which collective).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...errors import ConfigError
from ...trace import Trace
from . import per_op
from .megatron import plan_tensor_parallel
from .per_op import TpCollective
from .split_time import block_edges, split_time_scale


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
    share: tuple[float, ...] = ()  # as TensorParallelPlan.share: () here, where time_scale is the share


def per_op_plan(trace: Trace, degree: int, fallback_reason: str | None = None) -> PerOpPlan:
    """tpflag ops at 1/T time with an all-gather (forward) / all-reduce (backward) after each."""
    # As tensor_parallel.op_time: a tpflag op (not the optimizer) works on a 1/T shard.
    scale = tuple(1.0 / degree if op.tpflag and op.stage != "optimizer" else 1.0 for op in trace.ops)
    shards = {k: degree for k in per_op.sharded_buffers(trace)} if degree > 1 else {}
    return PerOpPlan("per-op", degree, scale, tuple(per_op.tp_collectives(trace, degree)), shards, (), fallback_reason)


def tensor_plan(trace: Trace, degree: int, style: str, sequence_parallel: bool = False):
    """The plan for ``degree`` TP ranks in ``style`` (``megatron`` or ``per-op``)."""
    if style == "per-op" and sequence_parallel and degree > 1:
        raise ConfigError("--sequence-parallel needs --tp-style megatron")
    if style == "per-op" or degree < 2:
        return per_op_plan(trace, degree)
    plan = plan_tensor_parallel(trace, degree, style=style, sequence_parallel=sequence_parallel)
    if plan.style != "megatron":
        return plan
    # a shape-timed trace: each split op at its size on one rank (graph/tensor/split_time.py)
    return replace(plan, share=plan.time_scale, time_scale=split_time_scale(trace, plan.time_scale, plan.shard_divisor,
                                                                            block_edges(plan.blocks)))


def tp_waits(trace: Trace, collectives) -> tuple[list[tuple[int, ...]], dict[tuple[int, str], int]]:
    """Per op, the TP collectives whose buffers it reads; and (writer op, buffer) -> the collective
    after which that version of the buffer is complete (as case 3: a buffer stays covered by the
    latest collective that carried it)."""
    at: dict[int, list] = {}
    for c in collectives:
        at.setdefault(c.op, []).append(c)
    covered: dict[str, int] = {}
    last_writer: dict[str, int] = {}
    waits: list[tuple[int, ...]] = []
    cover: dict[tuple[int, str], int] = {}
    for i in range(len(trace.ops)):
        waits.append(tuple(dict.fromkeys(covered[k] for k in trace.reads[i] if k in covered)))
        for k in trace.writes[i]:
            last_writer[k] = i
        for c in at.get(i, ()):
            for k in c.buffers:
                covered[k] = i
                if k in last_writer and not c.redo:
                    cover[(last_writer[k], k)] = i
    return waits, cover
