"""Time intervals of a schedule: the union of spans (a GPU's busy time) and its length."""

from __future__ import annotations

import numpy as np

# Above this many intervals the union and the length run with numpy (the same floats).
COLUMNS_FROM = 64


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(intervals) >= COLUMNS_FROM:  # a link's 10^5 spans in a 1T-parameter run
        spans = np.array(intervals, dtype=np.float64)
        return union_of_columns(spans[:, 0], spans[:, 1])
    return union_by_loop(intervals)


def union_by_loop(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """:func:`union` one interval at a time (what the numpy path must equal)."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    if len(intervals) >= COLUMNS_FROM:  # the running sum, left to right, as sum() adds
        spans = np.array(intervals, dtype=np.float64)
        return float(np.add.accumulate(spans[:, 1] - spans[:, 0])[-1])
    return sum(e - s for s, e in intervals)


def subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of union ``a`` outside union ``b`` (both sorted and disjoint)."""
    out: list[tuple[float, float]] = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def union_of_columns(start: np.ndarray, end: np.ndarray) -> list[tuple[float, float]]:
    """:func:`union` of the intervals ``zip(start, end)``, with numpy: the same merged intervals
    (the same floats: no arithmetic, only comparisons), for the 10^5 compute spans of a GPU."""
    keep = end > start
    start, end = start[keep], end[keep]
    if len(start) == 0:
        return []
    order = np.lexsort((end, start))  # as sorted() orders the (start, end) tuples
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    # A new interval begins where a start lies beyond everything so far.
    first = np.flatnonzero(np.concatenate(([True], start[1:] > reach[:-1])))
    last = np.concatenate((first[1:] - 1, [len(start) - 1]))
    return list(zip(start[first].tolist(), reach[last].tolist()))


# Columns: a union as two arrays (starts, ends), sorted and disjoint, for the 10^5 spans of a
# large run's GPU or link (no list of tuples in between).
Columns = tuple[np.ndarray, np.ndarray]


def merged_columns(start: np.ndarray, end: np.ndarray) -> Columns:
    """:func:`union_of_columns` as columns."""
    keep = end > start
    start, end = start[keep], end[keep]
    if len(start) == 0:
        return start, end
    order = np.lexsort((end, start))
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    first = np.flatnonzero(np.concatenate(([True], start[1:] > reach[:-1])))
    last = np.concatenate((first[1:] - 1, [len(start) - 1]))
    return start[first], reach[last]


def columns_length(start: np.ndarray, end: np.ndarray) -> float:
    """:func:`length` of the intervals ``zip(start, end)``: the same running sum (a few: the
    same loop)."""
    if len(start) >= COLUMNS_FROM:
        return float(np.add.accumulate(end - start)[-1])
    return sum(e - s for s, e in zip(start.tolist(), end.tolist()))


def subtract_length(a: Columns, b: Columns) -> float:
    """``length(subtract(a, b))`` on columns: each interval of ``a`` cut by the gaps between
    ``b``'s intervals (the pieces :func:`subtract` finds, in its order), summed as it sums."""
    a_s, a_e = a
    b_s, b_e = b
    if len(a_s) == 0:
        return 0
    gap_s = np.concatenate(([-np.inf], b_e))
    gap_e = np.concatenate((b_s, [np.inf]))
    lo = np.searchsorted(gap_e, a_s, side="right")  # the first gap ending after the interval starts
    hi = np.searchsorted(gap_s, a_e, side="left")  # past the last gap starting before it ends
    count = np.maximum(hi - lo, 0)
    total = int(count.sum())
    which = np.repeat(np.arange(len(a_s)), count)
    gap = np.repeat(lo, count) + (np.arange(total) - np.repeat(np.cumsum(count) - count, count))
    start = np.maximum(a_s[which], gap_s[gap])
    end = np.minimum(a_e[which], gap_e[gap])
    keep = end > start
    return columns_length(start[keep], end[keep])
