"""When a pipeline rank's gradient buckets are ready and the order they are reduced in, under
``--overlap-grad-reduce``, in the plan's estimate (:func:`triosim.plan.estimate._dp_synced`).

A bucket is ready once the op completing its last gradient has run in the last micro-batch's
backward: within the backward block of its model chunk, that block's ops one after another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the estimate imports this module
    from .profile import PositionTimes


def in_ready_order(ready: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The buckets in the order they become ready, the order they are reduced in (the interleaved
    schedule's model chunks each complete theirs in their own last backward block, the last
    layers' chunk first)."""
    order = np.argsort(ready, kind="stable")
    return ready[order], cost[order]


def ready_in_block(pt: PositionTimes, bound: tuple[int, int], ready_ops: np.ndarray,
                   end: float) -> tuple[np.ndarray, np.ndarray]:
    """When each of ``ready_ops`` has run in the backward block of the positions ``bound`` that
    ends at ``end`` (the block's ops one after another), and whether it is in that block."""
    a, b = bound
    ops = pt.b_ops[(pt.b_pos >= a) & (pt.b_pos < b)]
    if not len(ops):
        return np.full(len(ready_ops), end), np.zeros(len(ready_ops), dtype=bool)
    left = np.concatenate((np.cumsum(pt.op_s[ops][::-1])[::-1][1:], [0.0]))  # block time after each op
    k = np.minimum(np.searchsorted(ops, ready_ops), len(ops) - 1)
    return end - left[k], ops[k] == ready_ops


__all__ = ["in_ready_order", "ready_in_block"]
