"""A pipeline rank's gradient buckets, when they are ready and the order they are reduced in under
``--overlap-grad-reduce``, in the plan's estimate (:func:`triosim.plan.estimate._dp_synced`).

A bucket is ready once the op completing its last gradient has run in the last micro-batch's
backward: within the backward block of its model chunk, that block's ops one after another.
Buckets are reduced one after another in the order they become ready; each reduction holds
``collective_sms`` of the GPU's SMs while it runs, and the backward compute beside it runs at the
rest (:func:`slowed_by_reductions`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the estimate imports this module
    from .profile import PositionTimes


def rank_buckets(profile, batch: int, tp: int, sp: bool, pp: int, bounds: list[tuple[int, int]], parts: list,
                 bucket_bytes: float | None) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per pipeline rank, per part of its parameters (``parts``: None for all, or an MoE model's
    (expert parameters, whether the experts')), its DDP buckets' bytes and the backward ops
    completing them (:meth:`~triosim.plan.profile.ModelProfile.rank_buckets`); ``bucket_bytes``
    None (no ``--overlap-grad-reduce``): Megatron's default, one bucket per stage of the rank
    in chunk order, reduced after its last block (no op: -1)."""
    def owned(spans: list[tuple[int, int]]) -> np.ndarray:
        mask = np.zeros(profile.positions, dtype=bool)
        for x, y in spans:
            mask[x:y] = True
        return mask

    out = []
    for r in range(pp):
        mine = []
        for part in parts:
            if bucket_bytes is None:
                chunks = [profile.rank_buckets(batch, tp, sp, owned([span]), float("inf"), part)[0]
                          for span in bounds[r::pp]]
                sizes = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
                mine.append((sizes, np.full(len(sizes), -1, dtype=np.intp)))
            else:
                mine.append(profile.rank_buckets(batch, tp, sp, owned(bounds[r::pp]), bucket_bytes, part))
        out.append(mine)
    return out


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


def slowed_by_reductions(ready: np.ndarray, cost: np.ndarray, slow: float, end: float,
                         rounds: int = 2) -> tuple[np.ndarray, float]:
    """When the buckets (in ready order) are ready, and how much later the rank's last block ends
    (at ``end`` with the compute at full speed), while the reductions before them take SMs from
    the backward compute: the compute beside a reduction takes ``slow`` (1 / speed − 1) more of
    the time it runs, so what the GPU completes after a reduction started comes that much later.
    Each bucket's readiness is delayed by ``slow`` × the reductions' running time before it (the
    compute taken as running all that time), the reductions' chain worked out again from the
    delayed readiness, ``rounds`` times (the chain moves with them)."""
    base = ready.tolist()
    costs = cost.tolist()
    shifted = base

    def running_before(spans: list[tuple[float, float]], x: float) -> float:
        return sum(min(b, x) - a for a, b in spans if a < x)

    spans: list[tuple[float, float]] = []
    for _ in range(rounds):
        spans, t = [], -np.inf
        for a, c in zip(shifted, costs):  # t <- max(t, ready) + cost
            t0 = max(t, a)
            t = t0 + c
            spans.append((t0, t))
        shifted = [x + slow * running_before(spans, x) for x in base]
    return np.array(shifted), slow * running_before(spans, end)


__all__ = ["in_ready_order", "rank_buckets", "ready_in_block", "slowed_by_reductions"]
