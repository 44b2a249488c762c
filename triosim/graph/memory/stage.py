"""Peak memory of one pipeline stage's program when every buffer fits: vectorised over steps.

A stage runs the same ops in every micro-batch, so its program is a few hundred op templates
repeated per micro-batch, and a large run's program has 10^5 steps. When the sum of every buffer
the program ever touches fits on the GPU, :func:`~triosim.graph.memory.plan.plan_memory` adds no
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
    runs: Sequence[tuple[int, tuple[int, ...], int | None]],
    template_of: Callable[[int, int | None], tuple[list[int], list[bool], list[bool]]],
    size_of: Callable[[int, float], int],
    fractions: Sequence[float],
    num_buffers: int,
    delivered: set[int],
    persistent: set[int],
    capacity: int,
    resident: set[int] = frozenset(),
) -> tuple[np.ndarray, int] | None:
    """Bytes resident during each op step and the total of every buffer, or ``None`` if that
    total exceeds ``capacity``.

    ``runs``: (task, its ops, micro-batch or ``None`` for an optimizer share) in program order;
    every op is one step. ``template_of(op, r)``: the step's buffer ids, reads first then writes,
    with per id whether it is a read and whether it is keyed per micro-batch (the same for every
    ``r`` but ``None``). ``size_of(buffer id, fraction)``: its bytes in a micro-batch of
    ``fraction`` of the batch (``fractions[r]`` for micro-batch ``r``; 1.0 for keys without a
    micro-batch). ``delivered``: keys another stage sends (not external even when first read
    here). ``persistent``: buffer ids alive to the end once touched. ``resident``: buffer ids
    allocated before the program even when it first writes them (a preallocated gradient buffer).
    """
    m = len(runs)
    # Templates: one per (ops of a run, optimizer share or not), in first-seen order, with each
    # entry's op position; the runs are matched to them in one pass (a 1T stage has 10^4 runs).
    keys = [(ops, r is None) for _task, ops, r in runs]
    first_r = dict(zip(reversed(keys), [r for _task, _ops, r in reversed(runs)]))  # each key's first run's
    slot: dict[tuple[tuple[int, ...], bool], int] = {}
    t_ids: list[list[int]] = []
    t_reads: list[list[bool]] = []
    t_keyed: list[list[bool]] = []
    t_local: list[list[int]] = []
    for ck in dict.fromkeys(keys):
        ops = ck[0]
        slot[ck] = len(t_ids)
        ids_k: list[int] = []
        reads_k: list[bool] = []
        keyed_k: list[bool] = []
        local_k: list[int] = []
        for pos, i in enumerate(ops):
            ids, reads, keyed = template_of(i, first_r[ck])
            ids_k += ids
            reads_k += reads
            keyed_k += keyed
            local_k += [pos] * len(ids)
        t_ids.append(ids_k)
        t_reads.append(reads_k)
        t_keyed.append(keyed_k)
        t_local.append(local_k)
    which = np.fromiter(map(slot.__getitem__, keys), dtype=np.int64, count=m)
    mbs = np.fromiter((0 if r is None else r for _task, _ops, r in runs), dtype=np.int64, count=m)
    ops_in = np.fromiter((len(ops) for ops, _ in slot), dtype=np.int64, count=len(slot))[which] if m else \
        np.zeros(0, dtype=np.int64)
    n = int(ops_in.sum()) if m else 0
    t_len = np.array([len(x) for x in t_ids], dtype=np.int64)
    lengths = t_len[which] if m else np.zeros(0, dtype=np.int64)
    total_len = int(lengths.sum())
    if n == 0 or total_len == 0:
        return np.zeros(n, dtype=np.int64), 0
    count = int(t_len.sum())
    flat_ids = np.fromiter((x for ids in t_ids for x in ids), dtype=np.int64, count=count)
    flat_reads = np.fromiter((x for rs in t_reads for x in rs), dtype=bool, count=count)
    flat_keyed = np.fromiter((x for ks in t_keyed for x in ks), dtype=bool, count=count)
    flat_local = np.fromiter((x for ls in t_local for x in ls), dtype=np.int64, count=count)
    t_ptr = np.concatenate(([0], np.cumsum(t_len)[:-1]))
    # Position of every (run, entry) in the flat template arrays: the run's template start plus
    # the entry's offset inside the run; its step: the run's first step plus the op's position.
    run = np.repeat(np.arange(m, dtype=np.int64), lengths)
    out_start = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    pos = t_ptr[which][run] + (np.arange(total_len, dtype=np.int64) - out_start[run])
    first_step_of_run = np.concatenate(([0], np.cumsum(ops_in)[:-1]))
    step = first_step_of_run[run] + flat_local[pos]
    ids = flat_ids[pos]
    is_read = flat_reads[pos]
    keyed = flat_keyed[pos]
    keys = np.where(keyed, (mbs[run] + 1) * num_buffers + ids, ids)
    # Each distinct key's first and last entry: one stable sort keeps a key's entries in step
    # order, so its run in the sorted keys starts at its first use and ends at its last.
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1])))
    uniq = sorted_keys[starts]
    first_at = order[starts]
    last_step = step[order[np.append(starts[1:], total_len) - 1]]
    first_step = step[first_at]
    first_is_read = is_read[first_at]
    # Sizes per distinct (buffer, fraction): a few thousand calls, not one per key.
    slot_of: dict[float, int] = {}
    r_slot = np.array([slot_of.setdefault(f, len(slot_of)) for f in (1.0, *fractions)], dtype=np.int64)
    slot_frac = sorted(slot_of, key=slot_of.get)
    pair = r_slot[uniq // num_buffers] * num_buffers + uniq % num_buffers
    pairs, inverse = np.unique(pair, return_inverse=True)
    table = np.fromiter((size_of(int(q % num_buffers), slot_frac[int(q // num_buffers)]) for q in pairs),
                        dtype=np.int64, count=len(pairs))
    sizes = table[inverse]
    total = int(sizes.sum())
    if total > capacity:
        return None
    raw = uniq < num_buffers
    live_to_end = raw & np.isin(uniq, np.fromiter(persistent, dtype=np.int64, count=len(persistent)))
    external = first_is_read & ~np.isin(uniq, np.fromiter(delivered, dtype=np.int64, count=len(delivered)))
    if resident:
        external |= raw & np.isin(uniq, np.fromiter(resident, dtype=np.int64, count=len(resident)))
    begin = np.where(external, 0, first_step)
    end = np.where(live_to_end, n - 1, last_step)
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, begin, sizes)
    np.add.at(delta, end + 1, -sizes)
    return np.cumsum(delta[:n]), total


__all__ = ["stage_occupancy"]
