"""ZeRO-1/2's parameter gathers under ``--overlap-param-gather`` in the plan's estimate.

Megatron-Core then gathers the updated parameters during the next iteration's forward pass
rather than after the optimizer: a forward pre-hook waits for a bucket's all-gather and dispatches
the next one. The task DAG (:mod:`triosim.graph.pipeline.rank_program`) builds one iteration so:
each stage's forward units (:func:`triosim.graph.data.zero.fsdp_units`, as ZeRO-3's) are gathered
in that stage's first micro-batch only, unit 0 once the GPU is free, unit k + 1 when unit k's
first op is reached, each first op waiting for its unit. The other blocks gather nothing.

Here the first micro-batch's forward block of each rank's first model chunk is walked with those
gathers (:func:`triosim.plan.zero3_time.block_times`), giving its seconds from the input's arrival
and from the GPU free; the other blocks keep their times. Under the interleaved schedule
Megatron-LM aligns the gathers (chunks 0 and 1 dispatched at the start, chunk c at forward block
(c − 1)·P − p of rank p): the first chunk's units are gathered one after another from the start,
each op waiting for its unit (SM sharing beside them left out), and the other chunks' taken as
gathered by their first block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..graph.pipeline.schedules import FORWARD
from .zero3_pipeline import block_units, walk_inputs
from .zero3_time import block_times

if TYPE_CHECKING:  # the estimate imports this module
    from .candidates import Candidate
    from .estimate import PlanSettings
    from .pipeline_time import PipelineTimer
    from .profile import ModelProfile, PositionTimes


def gathers_in_first_forward(c: Candidate, settings: PlanSettings) -> bool:
    """Whether the candidate's updated parameters are gathered in its first forward blocks."""
    return settings.overlap_param_gather and c.zero in (1, 2) and c.data > 1


def first_forward(c: Candidate, pt: PositionTimes, profile: ModelProfile, settings: PlanSettings,
                  timer: PipelineTimer, starts: list[int], F: np.ndarray,
                  cast_share: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Per stage, the first micro-batch's forward block seconds from its input's arrival and from
    the GPU free, ``F`` (each stage's forward block) where it gathers nothing."""
    P = c.pp
    w = walk_inputs(c, pt, profile, settings, timer, cast_share)  # ZeRO-3's, memoized alike
    bounds = list(zip(starts, [*starts[1:], profile.positions]))
    data, free = F.astype(float), F.astype(float)
    for r in range(P):
        owned = np.zeros(profile.positions, dtype=bool)
        for x, y in bounds[r::P]:
            owned[x:y] = True
        # the rank's first chunk: stage r
        ops, unit_of, gathers = block_units(c, profile, settings, timer, w, bounds, r, r, FORWARD, owned)
        if not gathers:
            continue
        plain = float(pt.op_s[ops].sum())
        if c.virtual > 1:
            # aligned: every unit dispatched at the start, one after another; an op waits for its
            # unit (the ops' seconds from each unit's first op to the block's end after it)
            starts_at = np.flatnonzero(unit_of >= 0)
            starts_at = starts_at[np.argsort(unit_of[starts_at])]  # each unit's first op, unit by unit
            after_first = np.cumsum(pt.op_s[ops][::-1])[::-1][starts_at]
            free[r] += max(plain, float((np.cumsum(gathers) + after_first).max())) - plain
            continue
        from_free, from_data = block_times(w.compute[ops], w.tp_after[ops], unit_of, gathers, w.speed, w.beside)
        data[r] += from_data - plain
        free[r] += from_free - plain
    return data, free


__all__ = ["first_forward", "gathers_in_first_forward"]
