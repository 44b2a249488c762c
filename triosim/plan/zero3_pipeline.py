"""A pipeline's blocks under ZeRO-3 in the plan's estimate: each stage's forward and backward
block walked op by op with its parameter-unit gathers (:mod:`triosim.plan.zero3_time`), the TP
collectives and the context ring's exchanges slowed where the gathers share their links, then the
pipeline's sends beside them and the schedule's recurrence over the blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..graph.pipeline.schedules import BACKWARD, FORWARD
from .context_time import data_group, ring_beside_gathers
from .micro_scale import scale_at
from .pipeline_sends import boundary_bytes, gathers_beside_sends, overlapped_sends, with_sends
from .zero3_time import (
    ParamReads,
    beside_speeds,
    block_times,
    gathering_share,
    param_reads,
    read_shape,
    sm_speed,
    stage_units,
)

if TYPE_CHECKING:  # the estimate imports this module
    from .candidates import Candidate
    from .estimate import PlanSettings
    from .pipeline_time import PipelineTimer
    from .profile import ModelProfile, PositionTimes


@dataclass(frozen=True)
class WalkInputs:
    """What walking a candidate's blocks with parameter-unit gathers needs (:func:`walk_inputs`)."""

    shape: ParamReads  # every (op, parameter) read, per pass
    reads: ParamReads  # the same with the parameters' gathered bytes at the key
    compute: np.ndarray  # each op's compute seconds
    tp_after: np.ndarray  # the TP collectives' seconds after each op
    speed: float  # of the compute beside a gather (SM sharing)
    group: tuple[int, ...]  # the data ranks the parameters are gathered over
    beside: tuple[float, float]  # the speeds of a TP collective and a gather while both run


def walk_inputs(c: Candidate, pt: PositionTimes, profile: ModelProfile, settings: PlanSettings,
                timer: PipelineTimer, cast_share: float | None) -> WalkInputs:
    """The :class:`WalkInputs` of ``c`` (memoized per key: ZeRO-3's blocks and ZeRO-1/2's first
    forward blocks under ``--overlap-param-gather`` share them)."""
    batch = settings.global_batch // c.dp
    sp = c.sequence_parallel and c.tp > 1
    # the memo keys name cp: a context rank's profile (profile.for_context) differs from cp 1's
    shape = timer.memo(("zero3 shape", profile.recompute, profile.variant), lambda: read_shape(profile))
    reads = timer.memo(("zero3 reads", profile.recompute, profile.variant, batch, c.tp, sp),
                       lambda: param_reads(profile, batch, c.tp, sp, shape))
    compute = profile.op_times(batch, c.micro_batch, cast_share) * scale_at(profile, batch, c.tp, sp, c.micro_batch)
    group = data_group(c)  # ZeRO shards over the dp × cp data ranks
    # what the gathers slow beside them: the TP collectives (and the context ring's exchanges)
    beside = timer.memo(("zero3 beside", c.tp, group, sp), lambda: beside_speeds(profile.platform, tuple(range(c.tp)), group, sp))
    return WalkInputs(shape, reads, compute, pt.op_s - compute, sm_speed(profile), group, beside)


def block_units(c: Candidate, profile: ModelProfile, settings: PlanSettings, timer: PipelineTimer, w: WalkInputs,
                bounds: list[tuple[int, int]], r: int, j: int, phase: str,
                owned: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Stage ``j``'s block of ``phase`` on pipeline rank ``r`` (``owned``: the rank's positions):
    its ops, the unit each op starts (-1: none) and each unit's gather seconds (memoized per key)."""
    batch = settings.global_batch // c.dp
    sp = c.sequence_parallel and c.tp > 1
    lo, hi = bounds[j]
    all_ops, all_pos = w.shape.ops[phase]
    ops = all_ops[(all_pos >= lo) & (all_pos < hi)]
    ukey = ("zero3 units", profile.recompute, profile.variant, batch, c.tp, sp, lo, hi, tuple(bounds[r::c.pp]), phase,
            settings.bucket_bytes)
    firsts, sizes = timer.memo(ukey, lambda: stage_units(w.reads, lo, hi, owned, phase, settings.bucket_bytes))
    unit_of = np.full(len(ops), -1, dtype=np.intp)
    unit_of[np.searchsorted(ops, firsts)] = np.arange(len(firsts))
    gathers = timer.memo((ukey, w.group), lambda: profile.collective_many(
        "all_gather", w.group, np.array(sizes, dtype=np.int64)).tolist())
    return ops, unit_of, gathers


def zero3_pipeline(c: Candidate, pt: PositionTimes, profile: ModelProfile, settings: PlanSettings,
                   timer: PipelineTimer, m: int, starts: list[int], cast_share: float | None):
    """Per stage the forward and backward block seconds with ZeRO-3's unit gathers (:mod:`triosim.plan.zero3_time`:
    from the input's arrival; the ones from the GPU free go to the recurrence) and each rank's end."""
    S, P = c.pp * c.virtual, c.pp
    batch = settings.global_batch // c.dp
    w = walk_inputs(c, pt, profile, settings, timer, cast_share)
    compute, tp_after, speed, group, beside = w.compute, w.tp_after, w.speed, w.group, w.beside
    ring = timer.memo(("zero3 ring", profile.variant, profile.recompute, batch, c.tp, c.sequence_parallel, c.micro_batch,
                       cast_share, group),
                      lambda: ring_beside_gathers(profile, batch, c.tp, c.sequence_parallel, c.micro_batch, cast_share, group))
    bounds = list(zip(starts, [*starts[1:], profile.positions]))
    walked: dict[tuple, tuple[float, float]] = {}  # the stages alike (a model's repeated layers) walked once

    def walk(ops_compute: np.ndarray, after: np.ndarray, unit_of: np.ndarray, gathers: list[float]):
        key = (ops_compute.tobytes(), after.tobytes(), unit_of.tobytes(), tuple(gathers))
        hit = walked.get(key)
        if hit is None:
            hit = walked[key] = block_times(ops_compute, after, unit_of, gathers, speed, beside)
        return hit

    out = np.zeros((4, S))  # forward from the input, backward from the input, both from the GPU free
    gathered = np.zeros((2, S))  # per stage, its forward and backward block's gather seconds
    walks = []  # each block's (row, stage) and its walk's inputs, for a second walk
    for r in range(P):
        owned = np.zeros(profile.positions, dtype=bool)
        for x, y in bounds[r::P]:
            owned[x:y] = True
        for j in range(r, S, P):
            for row, ph in ((0, FORWARD), (1, BACKWARD)):
                ops, unit_of, gathers = block_units(c, profile, settings, timer, w, bounds, r, j, ph, owned)
                # the block's first op waits for its input, whatever it reads (a backward block's
                # re-runs too), as the pipeline waits for a receive before the step using it
                after = tp_after[ops] if ring is None else tp_after[ops] + ring[ops] * gathering_share(gathers, pt.op_s[ops])
                walks.append((row, j, compute[ops], after, unit_of, gathers))
                free, data = walk(compute[ops], after, unit_of, gathers)
                out[row, j], out[row + 2, j] = data, free
                gathered[row, j] = sum(gathers)
    cut_f, cut_b = boundary_bytes(pt, starts)
    # the pipeline's transfers beside the gathers, where they share links (a NIC both cross)
    late = gathers_beside_sends(c, settings, bounds, out[0], out[1], gathered[0] + gathered[1], cut_f, cut_b,
                                profile, timer, m, group)
    if late is not None:
        slower, late = late
        for row, j, ops_compute, after, unit_of, gathers in walks:  # each stage's gathers longer by its GPU's share
            out[row + 2, j], out[row, j] = walk(ops_compute, after, unit_of, [g * (1 + slower[j]) for g in gathers])
    F, B, slowed = with_sends(c, settings, pt, bounds, out[0], out[1], cut_f, cut_b, profile, timer, m)
    if late is not None:
        slowed = late if slowed is None else (slowed[0] + late[0], slowed[1] + late[1])
    out[2:] += (F - out[0], B - out[1])  # the TP collectives beside the pipeline's transfers
    out[0], out[1] = F, B
    ends = timer.rank_ends(c.schedule, P, c.virtual, m, c.stage_stride, out[0], out[1], cut_f, cut_b,
                           (out[2], out[3]), slowed=slowed,
                           blocking=not overlapped_sends(c, settings))  # stage GPUs tp · cp apart
    return out[0], out[1], ends, gathered[1]


__all__ = ["WalkInputs", "block_units", "walk_inputs", "zero3_pipeline"]
