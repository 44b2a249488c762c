"""The interleaved pipeline under Megatron-Core's combined 1F1B (``--moe-a2a-overlap``) in the
plan's estimate: the block-level recurrence of :mod:`triosim.plan.pipeline_time` with each
steady-state forward block run together with the backward block after it
(:func:`~triosim.graph.pipeline.schedules.combined_pairs`), as the DAG builds them
(:mod:`triosim.graph.pipeline.combined`): both start after the block before the pair, each also
waits for its own input, and the block after the pair waits for both.

A pair's blocks A (first) and B start at t_a and t_b. From their chains run alone (A1, B1) and
run together from one start (A ends at Pa, B at Pb: :mod:`triosim.plan.combined_time`), with
d = t_b − t_a ≥ 0 (B later; the other way round is the mirror):

- A ends at t_a + max(A1, Pa − d): the later B starts, the more of A runs alone (t_a + A1 once
  B starts after it; the last stage pairs a micro-batch's forward with its own backward, which
  starts when the forward ends);
- B ends at max(t_b + B1, t_a + Pb): it cannot end before it has run, nor before the pair's
  shared GPU has done what it would from the common start.

Both are exact at d = 0 and once the chains no longer meet. Blocks are grouped into levels of
independent blocks (a pair's two blocks in one level) and each level is one numpy step, as in
:mod:`triosim.graph.pipeline.estimate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..graph.pipeline.estimate import Level, block_levels, walk_blocks
from ..graph.pipeline.schedules import (
    FORWARD,
    combined_pairs,
    interleaved_warmup,
    schedule_blocks,
)


@dataclass(frozen=True)
class PairLevel(Level):
    """One level of :class:`~triosim.graph.pipeline.estimate.Level`'s blocks and, per pair in it,
    its two blocks' rows, its key (the index in :attr:`CombinedProgram.pairs`) and the row of its
    end (both blocks done)."""

    first: np.ndarray
    second: np.ndarray
    key: np.ndarray
    pair_end: np.ndarray
    chained: np.ndarray  # the second block waits for the first (the last stage's backward of its forward)


@dataclass(frozen=True)
class CombinedProgram:
    """The recurrence's structure for one (pp, V, micro-batches, routes) under combined 1F1B.
    Times live in one array: rows [0, B) block ends, [B, 2B) transfer arrivals, 2B zero, then one
    row per pair for when both its blocks are done. ``pairs``: each pair key's (first block's
    (phase, stage), second's)."""

    num_blocks: int
    num_pairs: int
    levels: tuple[PairLevel, ...]
    duration_row: np.ndarray
    transfer_row: np.ndarray
    last: np.ndarray
    runnable: bool
    pairs: tuple[tuple[tuple[str, int], tuple[str, int]], ...]


def compile_combined(ranks: int, virtual: int, micro: int,
                     routes: Sequence[tuple[tuple[str, ...], tuple[str, ...]]]) -> CombinedProgram:
    """Walk the interleaved block orders once, recording what each block waits for (as
    :func:`~triosim.graph.pipeline.estimate.compile_program`), the pairs and their levels."""
    n = ranks * virtual
    orders = [schedule_blocks("interleaved", ranks, micro, p, virtual) for p in range(ranks)]
    roles = [combined_pairs(orders[p], interleaved_warmup(ranks, micro, p, virtual)) for p in range(ranks)]
    walked, runnable = walk_blocks(orders, ranks, virtual, routes, [0] * micro)
    # per block: GPU, the block it needs data from, duration row, route id (-1 same GPU, -2 none), transfer row
    blocks: list[tuple[int, int, int, int, int]] = []
    prev: list[int] = []  # the block before it on its GPU (a pair: the one before the pair)
    pair_of: list[int] = []  # the pair it belongs to, or -1
    pair_blocks: list[list[int]] = []
    keys: dict[tuple[tuple[str, int], tuple[str, int]], int] = {}
    pair_key: list[int] = []
    chained: list[bool] = []  # the pair's second block is the backward of its first (the last stage's micro-batch)
    last = [-1] * ranks  # the last block on each GPU (a pair's second stands for the pair)
    open_pair = [-1] * ranks
    for w in walked:
        b, p = len(blocks), w.gpu
        blocks.append((p, w.need, (0 if w.phase == FORWARD else n) + w.stage, w.route, w.transfer_row))
        role = roles[p].get(w.position)
        if role is None:
            prev.append(last[p])
            pair_of.append(-1)
            last[p] = b
        elif role == 0:
            prev.append(last[p])
            q = len(pair_blocks)
            pair_blocks.append([b])
            pair_of.append(q)
            open_pair[p] = q
            second = orders[p][w.position + 1]
            key = ((w.phase, w.stage), (second[0], second[2] * ranks + p))
            pair_key.append(keys.setdefault(key, len(keys)))
            chained.append(w.phase == FORWARD and w.stage == n - 1 and second[1] == w.micro
                           and second[2] * ranks + p == w.stage)
        else:
            q = open_pair[p]
            prev.append(prev[pair_blocks[q][0]])  # both chains start after the block before the pair
            pair_blocks[q].append(b)
            pair_of.append(q)
            last[p] = b
    nb = len(blocks)

    def after(b: int) -> int:
        """The level a block's successor on its GPU must exceed: a pair's is its blocks'."""
        return -1 if b < 0 else level[b]

    # Levels: one more than everything a block waits for; a pair's two blocks share the larger.
    level = [0] * nb
    changed = True
    while changed:
        changed = False
        for b in range(nb):
            lv = max(after(prev[b]) + 1, after(blocks[b][1]) + 1, 0)
            q = pair_of[b]
            if q >= 0 and len(pair_blocks[q]) == 2:
                lv = max(lv, *(level[x] for x in pair_blocks[q]))
            if lv > level[b]:
                level[b] = lv
                changed = True
        for members in pair_blocks:
            top = max(level[x] for x in members)
            for x in members:
                if level[x] != top:
                    level[x] = top
                    changed = True
    zero = 2 * nb

    def done_row(rows: dict[int, int], b: int) -> int:
        if b < 0:
            return zero
        q = pair_of[b]
        return zero + 1 + q if q >= 0 and len(pair_blocks[q]) == 2 else rows[b]

    order, new, runs = block_levels(blocks, level, prev, done_row)
    levels = []
    for members, fields in runs:
        qs = sorted({pair_of[b] for b in members if pair_of[b] >= 0 and len(pair_blocks[pair_of[b]]) == 2})
        levels.append(PairLevel(
            **fields,
            first=np.array([new[pair_blocks[q][0]] for q in qs], dtype=np.intp),
            second=np.array([new[pair_blocks[q][1]] for q in qs], dtype=np.intp),
            key=np.array([pair_key[q] for q in qs], dtype=np.intp),
            pair_end=np.array([zero + 1 + q for q in qs], dtype=np.intp),
            chained=np.array([chained[q] for q in qs], dtype=bool),
        ))
    return CombinedProgram(
        nb, len(pair_blocks), tuple(levels),
        duration_row=np.array([blocks[b][2] for b in order], dtype=np.intp),
        transfer_row=np.array([blocks[b][4] if blocks[b][3] >= 0 else 2 * n for b in order], dtype=np.intp),
        last=np.array([done_row(new, b) for b in last], dtype=np.intp),
        runnable=runnable,
        pairs=tuple(keys),
    )


def combined_ends(prog: CombinedProgram, durations: np.ndarray, transfers: np.ndarray,
                  together: np.ndarray) -> np.ndarray:
    """Per pipeline rank, when its last block ends. ``durations``: rows (phase, stage), forward
    first, each block alone; ``transfers``: rows (direction, boundary) then a zero row;
    ``together``: per pair key, (the first block's end, the second's) both started at 0."""
    nb = prog.num_blocks
    dur = durations[prog.duration_row]
    sent = transfers[prog.transfer_row]
    times = np.zeros(2 * nb + 1 + prog.num_pairs)
    for lv in prog.levels:
        a, b = lv.start, lv.end
        start = np.maximum(times[lv.wait_gpu], times[lv.wait_data])
        times[a:b] = start + dur[a:b]
        if len(lv.first):
            x, y = lv.first - a, lv.second - a
            a1, b1 = dur[lv.first], dur[lv.second]
            ta = start[x]
            tb = np.where(lv.chained, np.maximum(start[y], ta + a1), start[y])
            pa, pb = together[lv.key, 0], together[lv.key, 1]
            d = tb - ta
            later = d >= 0
            # a chain the other starts after it ends runs alone (exact); otherwise the interpolation
            ae = np.where(later, ta + np.where(d >= a1, a1, np.maximum(a1, pa - d)), np.maximum(ta + a1, tb + pa))
            be = np.where(later, np.maximum(tb + b1, ta + pb), tb + np.where(-d >= b1, b1, np.maximum(b1, pb + d)))
            times[lv.first], times[lv.second] = ae, be
            times[lv.pair_end] = np.maximum(ae, be)
        if lv.sends:
            e = a + lv.sends
            times[nb + a: nb + e] = np.maximum(times[lv.wait_route], times[a:e]) + sent[a:e]
    return times[prog.last]


__all__ = ["CombinedProgram", "PairLevel", "combined_ends", "compile_combined"]
