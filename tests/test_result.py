"""The run summary: per-GPU busy times from the compute spans, merged with numpy, and the
exposed communication (comm spans less compute spans) on columns."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import triosim.report.intervals as result_module

times = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 1e-9, 0.1 + 0.2]) | st.floats(0, 10, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(times, times), max_size=40))
@example([(0.0, 1.0), (1.0, 2.0)])  # touching spans every run, not only when the search draws them
def test_merging_columns_gives_the_loops_intervals(spans):
    """The same merged intervals, float for float, as the loop over sorted tuples (empty and
    reversed spans skipped, touching ones joined, ties on start ordered by end)."""
    start = np.array([s for s, _ in spans], dtype=np.float64)
    end = np.array([e for _, e in spans], dtype=np.float64)
    merged = result_module.merged_columns(start, end)
    assert list(zip(merged[0].tolist(), merged[1].tolist())) == result_module.union_by_loop(spans)


def _touching_kept_apart(start, end):
    """Planted bug: spans that touch (one ends where the next starts) are not joined."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(zip(start.tolist(), end.tolist())):
        if e <= s:
            continue
        if out and s < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def test_the_property_catches_a_planted_bug(monkeypatch):
    def columns(start, end):
        kept = _touching_kept_apart(start, end)
        return np.array([s for s, _ in kept], dtype=np.float64), np.array([e for _, e in kept], dtype=np.float64)

    monkeypatch.setattr(result_module, "merged_columns", columns)
    with pytest.raises(AssertionError):
        test_merging_columns_gives_the_loops_intervals()


def _columns(spans):
    merged = result_module.union(spans)
    return (np.array([s for s, _ in merged], dtype=np.float64), np.array([e for _, e in merged], dtype=np.float64))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(times, times), max_size=90), st.lists(st.tuples(times, times), max_size=90))
def test_exposed_time_on_columns_equals_the_loop(comm, compute):
    """Comm time outside compute: the pieces and the running sum of :func:`subtract`, float for
    float (a few pieces summed by the loop, many by numpy's running sum)."""
    a, b = result_module.union(comm), result_module.union(compute)
    want = result_module.length(result_module.subtract(a, b))
    got = result_module.subtract_length(_columns(comm), _columns(compute))
    assert got == want and type(got) is type(want)


def test_exposed_time_property_catches_a_planted_bug(monkeypatch):
    """Planted bug: the last piece of comm time outside compute is left out of the sum."""
    real = result_module.columns_length

    def without_last(start, end):
        return real(start[:-1], end[:-1])

    monkeypatch.setattr(result_module, "columns_length", without_last)
    with pytest.raises(AssertionError):
        test_exposed_time_on_columns_equals_the_loop()
