"""Peak memory of one pipeline stage's program when every buffer fits: vectorised over steps.

A stage runs the same ops in every micro-batch, so its program is a few hundred op templates
repeated per micro-batch, and a large run's program has 10^5 steps. When the sum of every buffer
the program ever touches fits on the GPU, :func:`~triosim.graph.memory.plan_memory` adds no
memcpy and the plan is each buffer's lifetime: resident from its first use (from the start for
buffers that exist before the program) to its last use (to the end for parameters and optimizer
state). This module computes exactly that occupancy with numpy instead of per-step dicts of
string keys; it returns ``None`` when the buffers do not all fit, and the caller then plans step
by step with eviction and prefetch.

A buffer of micro-batch ``r`` is keyed ``(r + 1) · B + id`` (``B`` buffers in the trace); a buffer
the same in every micro-batch (parameters, optimizer state, batch-invariant tensors) is keyed by
its id alone, as the step-by-step planner keys it by its bare name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def stage_occupancy(
    steps: Sequence[tuple[int, int, int | None]],
    template_of: Callable[[int, int | None], tuple[list[int], list[bool], list[bool]]],
    size_of: Callable[[int], int],
    num_buffers: int,
    delivered: set[int],
    persistent: set[int],
    capacity: int,
) -> tuple[np.ndarray, int] | None:
    """Bytes resident during each step and the total of every buffer, or ``None`` if that total
    exceeds ``capacity``.

    ``steps``: (task, op, micro-batch or ``None`` for an optimizer share) in program order.
    ``template_of(op, r)``: the step's buffer ids, reads first then writes, with per id whether it
    is a read and whether it is keyed per micro-batch. ``size_of(key)``: bytes of a key.
    ``delivered``: keys another stage sends (not external even when first read here).
    ``persistent``: buffer ids alive to the end once touched.
    """
    n = len(steps)
    cache: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    ids_parts: list[np.ndarray] = []
    read_parts: list[np.ndarray] = []
    keyed_parts: list[np.ndarray] = []
    lengths = np.zeros(n, dtype=np.int64)
    mbs = np.zeros(n, dtype=np.int64)
    for j, (_task, i, r) in enumerate(steps):
        ck = (i, r is None)
        hit = cache.get(ck)
        if hit is None:
            ids, reads, keyed = template_of(i, r)
            hit = cache[ck] = (np.asarray(ids, dtype=np.int64), np.asarray(reads, dtype=bool),
                               np.asarray(keyed, dtype=bool))
        ids_parts.append(hit[0])
        read_parts.append(hit[1])
        keyed_parts.append(hit[2])
        lengths[j] = len(hit[0])
        mbs[j] = 0 if r is None else r
    if n == 0 or not lengths.sum():
        return np.zeros(n, dtype=np.int64), 0
    ids = np.concatenate(ids_parts)
    is_read = np.concatenate(read_parts)
    keyed = np.concatenate(keyed_parts)
    step = np.repeat(np.arange(n, dtype=np.int64), lengths)
    keys = np.where(keyed, (np.repeat(mbs, lengths) + 1) * num_buffers + ids, ids)
    uniq, first_at = np.unique(keys, return_index=True)
    rev_uniq, rev_at = np.unique(keys[::-1], return_index=True)
    last_step = step[len(keys) - 1 - rev_at]  # rev_uniq == uniq (both sorted)
    first_step = step[first_at]
    first_is_read = is_read[first_at]
    sizes = np.fromiter((size_of(int(k)) for k in uniq), dtype=np.int64, count=len(uniq))
    total = int(sizes.sum())
    if total > capacity:
        return None
    raw = uniq < num_buffers
    live_to_end = raw & np.isin(uniq, np.fromiter(persistent, dtype=np.int64, count=len(persistent)))
    external = first_is_read & ~np.isin(uniq, np.fromiter(delivered, dtype=np.int64, count=len(delivered)))
    begin = np.where(external, 0, first_step)
    end = np.where(live_to_end, n - 1, last_step)
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, begin, sizes)
    np.add.at(delta, end + 1, -sizes)
    return np.cumsum(delta[:n]), total


__all__ = ["stage_occupancy"]
