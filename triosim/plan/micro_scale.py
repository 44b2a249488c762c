"""Each op's time scale at a candidate's micro-batch, as the DAG has it on a model card.

``triosim run`` builds a model card's trace with its op shapes at the micro-batch, and the
tensor-parallel plan times a split op from those shapes at its size on one rank
(:mod:`triosim.graph.tensor.split_time`; the context split likewise). A rank's share of a GEMM sits
elsewhere on the device's efficiency curve at another micro-batch: a grouped expert GEMM (a few
hundred rows an expert, memory-bound) under tp 2 with sequence parallelism is 0.89 of the whole
op at micro-batch 1 and 0.60 at 2. The plan profiles one trace per per-replica batch, its shapes
at one sequence, so here the DAG's split-time scaling (and the context split's) is redone from
the shapes at the micro-batch, the expert split's factors put back on, and the result carried to
the re-runs and offload copies of a rewritten trace as the simulation carries its plan.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..compute.roofline import roofline_seconds
from ..graph.context.plan import context_split
from ..graph.tensor.split_time import block_edges, share_cost, split_time_scale

PLAIN, PRE_EXPERT = "plain plan", "pre-expert plan"  # the root profile's plans kept in its memo


def _root(profile):
    while profile.parent is not None:
        profile = profile.parent
    return profile


def _at_micro_batch(trace, mb: int):
    """``trace`` with its op-time shapes at ``mb`` samples (what ``run``'s trace carries)."""
    model = trace.op_time
    shapes = replace(model.shapes, batch=mb, costs=model.shapes.at(mb), _at={})
    return replace(trace, op_time=replace(model, shapes=shapes, _times={}, _casts={}))


def _split(root, batch: int, tp: int, sp: bool, mb: int) -> np.ndarray:
    """The tensor-parallel (and context) split's time scale from the shapes at ``mb``; shared by
    the expert variants of one context degree (the split comes before the experts') and by every
    per-replica batch: the costs at ``mb`` and the tensors brought to ``mb`` do not depend on it."""
    base = root._contexts.get("base", root)  # the plain profile (profile.BASE)
    key = ("micro split", tp, sp, mb, root.cp)
    hit = base.memo.get(key)
    if hit is None:
        plain = root.memo[(PLAIN, batch, tp, sp)]
        trace = _at_micro_batch(root.scaled(batch), mb)
        share = getattr(plain, "share", None)
        scale = _split_time_scale(trace, share, plain.shard_divisor, block_edges(getattr(plain, "blocks", ()) or ())) \
            if share else plain.time_scale
        if root.cp > 1:
            scale = context_split(trace, replace(plain, time_scale=scale), root.cp, "p2p").time_scale
        hit = base.memo[key] = np.asarray(scale, dtype=float)
    return hit


def _split_time_scale(trace, time_scale, divisor, whole) -> tuple[float, ...]:
    """:func:`~triosim.graph.tensor.split_time.split_time_scale` on a roofline-timed trace, the
    same floats, each distinct op cost's roofline worked out once (a model's layers repeat)."""
    model = trace.op_time
    target = getattr(model, "target", model)
    shapes, device = getattr(target, "shapes", None), getattr(target, "device", None)
    if shapes is None or device is None:
        return split_time_scale(trace, time_scale, divisor, whole)
    precision, costs, batch = target.precision, shapes.costs, shapes.batch
    seen: dict = {}

    def roofline(cost) -> float:
        hit = seen.get(cost)
        if hit is None:
            hit = seen[cost] = roofline_seconds(cost, device, precision)
        return hit

    out = []
    for i, share in enumerate(time_scale):
        if share == 1.0 or trace.ops[i].stage == "optimizer":
            out.append(share)
            continue
        full = roofline(costs[i])
        part = roofline(share_cost(trace, i, costs[i], share, divisor, whole, batch))
        out.append(part / full if full > 0 else share)
    return tuple(out)


def scale_at(profile, batch: int, tp: int, sp: bool, mb: int) -> np.ndarray:
    """Per op of ``profile``'s trace, its time scale at micro-batch ``mb`` (module docstring):
    the plan's own where the trace's shapes are already at ``mb``, or are not a model card's."""
    sp = sp and tp > 1
    plan = profile.tensor_plan(batch, tp, sp)
    root = _root(profile)
    model = root.scaled(batch).op_time
    shapes = getattr(model, "shapes", None)
    plain = root.memo.get((PLAIN, batch, tp, sp))
    split = plain is not None and (getattr(plain, "share", None) or root.cp > 1)
    if shapes is None or shapes.batch == mb or not split or not root.raw.info.get("model_card"):
        return np.asarray(plan.time_scale, dtype=float)
    key = ("micro scale", batch, tp, sp, mb)
    hit = profile.memo.get(key)
    if hit is not None:
        return hit
    scale = _split(root, batch, tp, sp, mb)
    final = np.asarray(root.tensor_plan(batch, tp, sp).time_scale, dtype=float)
    pre = np.asarray(root.memo[(PRE_EXPERT, batch, tp, sp)].time_scale, dtype=float)
    if not np.array_equal(final, pre):  # the expert split's busiest-rank factors and optimizer share
        scale = np.where(pre != 0, scale * np.divide(final, pre, out=np.ones_like(final), where=pre != 0), final)
    if profile is not root:
        scale = _carry(profile, batch, scale)
    profile.memo[key] = scale
    return scale


def _carry(profile, batch: int, scale: np.ndarray) -> np.ndarray:
    """The root's scale on a rewritten trace: each op at its original's, an offload copy at 0."""
    offloads = getattr(profile, "_offloads", None)
    if offloads is not None and batch in offloads:
        off = offloads[batch]
        return np.array([0.0 if n in off.copies else scale[o] for n, o in enumerate(off.origin)])
    return scale[list(profile._rewrites[batch].origin)]


__all__ = ["PLAIN", "PRE_EXPERT", "scale_at"]
