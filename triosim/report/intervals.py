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
