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
from itertools import repeat
from operator import is_

import numpy as np

# Up to this many (fraction, buffer) pairs, the pairs a stage uses are found in a table instead of
# by sorting (a 1T stage: 2 fractions × 15,000 buffers).
DENSE_PAIRS = 1 << 20
# Keys are found in a table (one row per micro-batch) when it has at most this many slots, or
# this many per entry: beyond, by sorting the entries.
DENSE_KEYS = 1 << 16
KEY_SLOTS_PER_ENTRY = 4


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
    if not m:
        return np.zeros(0, dtype=np.int64), 0
    # Templates: one per (ops of a run, optimizer share or not), with each entry's op position.
    # A run's ops tuple is keyed by identity, not value (a 1T stage has 10^4 runs sharing a few
    # dozen tuples; hashing each tuple is what took the time): two equal tuples that are distinct
    # objects get two equal templates, and the entries below are the same.
    _tasks, opss, rs = zip(*runs)
    shared = np.fromiter(map(is_, rs, repeat(None)), dtype=bool, count=m)  # an optimizer share
    ident = np.fromiter(map(id, opss), dtype=np.int64, count=m) * 2 + shared
    _u, first_run, which = np.unique(ident, return_index=True, return_inverse=True)
    seen = np.argsort(first_run)  # templates in first-seen order
    renumber = np.empty(len(seen), dtype=np.int64)
    renumber[seen] = np.arange(len(seen), dtype=np.int64)
    which = renumber[which.reshape(-1)]
    t_ids: list[int] = []
    t_reads: list[bool] = []
    t_keyed: list[bool] = []
    t_local: list[int] = []
    t_len: list[int] = []
    t_ops: list[int] = []
    for j in first_run[seen].tolist():
        ops, r = opss[j], rs[j]
        start = len(t_ids)
        for pos, i in enumerate(ops):
            ids, reads, keyed = template_of(i, r)
            t_ids += ids
            t_reads += reads
            t_keyed += keyed
            t_local += [pos] * len(ids)
        t_len.append(len(t_ids) - start)
        t_ops.append(len(ops))
    ops_in = np.array(t_ops, dtype=np.int64)[which]
    n = int(ops_in.sum())
    lengths = np.array(t_len, dtype=np.int64)[which]
    total_len = int(lengths.sum())
    if n == 0 or total_len == 0:
        return np.zeros(n, dtype=np.int64), 0
    t_len = np.array(t_len, dtype=np.int64)
    flat_ids = np.array(t_ids, dtype=np.int64)
    flat_reads = np.array(t_reads, dtype=bool)
    flat_keyed = np.array(t_keyed, dtype=bool)
    flat_local = np.array(t_local, dtype=np.int64)
    # A run's micro-batch (an optimizer share's None reads as NaN here, then 0: its entries are
    # never keyed per micro-batch).
    mbs = np.where(shared, 0, np.array(rs, dtype=float)).astype(np.int64)
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
    uniq, first_at, last_at = _key_spans(flat_ids, pos, ids, keyed, mbs[run], num_buffers, total_len)
    last_step = step[last_at]
    first_step = step[first_at]
    first_is_read = is_read[first_at]
    # Sizes per distinct (buffer, fraction): a few thousand calls, not one per key.
    slot_of: dict[float, int] = {}
    r_slot = np.array([slot_of.setdefault(f, len(slot_of)) for f in (1.0, *fractions)], dtype=np.int64)
    slot_frac = sorted(slot_of, key=slot_of.get)
    pair = r_slot[uniq // num_buffers] * num_buffers + uniq % num_buffers
    width = len(slot_of) * num_buffers
    if width <= DENSE_PAIRS:  # few distinct fractions: the pairs marked in a table, no sort
        used = np.zeros(width, dtype=bool)
        used[pair] = True
        pairs = np.flatnonzero(used)  # sorted and distinct, as np.unique gives them
        table = np.zeros(width, dtype=np.int64)
        table[pairs] = _sizes(pairs, size_of, slot_frac, num_buffers)
        sizes = table[pair]
    else:
        pairs, inverse = np.unique(pair, return_inverse=True)
        sizes = _sizes(pairs, size_of, slot_frac, num_buffers)[inverse]
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


def _key_spans(flat_ids: np.ndarray, pos: np.ndarray, ids: np.ndarray, keyed: np.ndarray, mb: np.ndarray,
               num_buffers: int, total_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each distinct key among the entries (buffer ``ids``, keyed per micro-batch ``mb`` where
    ``keyed``) and the index of its first and last entry (in no particular key order: what the
    caller sums does not depend on it). ``flat_ids[pos]`` is ``ids``: the templates' buffers."""
    # A stage touches a few hundred of the trace's buffers: numbered among those, every key fits a
    # table of (micro-batches + 1) rows, and a key's first and last entry are found with
    # ufunc.at instead of a sort of every entry (a 1T stage: 10^5 entries, a third of its plan).
    local, inverse = np.unique(flat_ids, return_inverse=True)
    width = (int(mb.max(initial=0)) + 2) * len(local)
    if width <= max(KEY_SLOTS_PER_ENTRY * total_len, DENSE_KEYS):
        lid = inverse.reshape(-1)[pos]
        keys = np.where(keyed, (mb + 1) * len(local) + lid, lid)
        entry = np.arange(total_len, dtype=np.int64)
        first = np.full(width, total_len, dtype=np.int64)
        np.minimum.at(first, keys, entry)
        last = np.full(width, -1, dtype=np.int64)
        np.maximum.at(last, keys, entry)
        used = np.flatnonzero(last >= 0)
        row, buf = np.divmod(used, len(local))
        return row * num_buffers + local[buf], first[used], last[used]
    # Otherwise one stable sort keeps a key's entries in step order: its run in the sorted keys
    # starts at its first use and ends at its last.
    keys = np.where(keyed, (mb + 1) * num_buffers + ids, ids)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1])))
    return sorted_keys[starts], order[starts], order[np.append(starts[1:], total_len) - 1]


def _sizes(pairs: np.ndarray, size_of: Callable[[int, float], int], slot_frac: list[float], num_buffers: int) -> np.ndarray:
    """Bytes of each (fraction slot · ``num_buffers`` + buffer id) in ``pairs``."""
    return np.fromiter((size_of(int(q % num_buffers), slot_frac[int(q // num_buffers)]) for q in pairs),
                       dtype=np.int64, count=len(pairs))


__all__ = ["stage_occupancy"]
