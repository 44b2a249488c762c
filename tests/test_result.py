"""The run summary: per-GPU busy times from the compute spans, merged with numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import triosim.report.result as result_module

times = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 1e-9, 0.1 + 0.2]) | st.floats(0, 10, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(times, times), max_size=40))
def test_merging_columns_gives_the_loops_intervals(spans):
    """The same merged intervals, float for float, as the loop over sorted tuples (empty and
    reversed spans skipped, touching ones joined, ties on start ordered by end)."""
    start = np.array([s for s, _ in spans], dtype=np.float64)
    end = np.array([e for _, e in spans], dtype=np.float64)
    assert result_module._union_of_columns(start, end) == result_module._union(spans)


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
    monkeypatch.setattr(result_module, "_union_of_columns", _touching_kept_apart)
    with pytest.raises(AssertionError):
        test_merging_columns_gives_the_loops_intervals()
