"""The union and length of many intervals run with numpy (report/intervals.py): the same merged
intervals and the same running sum, float for float, as the loops over a few; a pairwise sum
(numpy's ``sum``, the planted bug) is caught."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from triosim.report import intervals as iv

times = st.floats(0.0, 10.0, allow_nan=False).map(lambda x: round(x, 3)) | st.floats(0.0, 10.0, allow_nan=False)
spans = st.lists(st.tuples(times, times), min_size=iv.COLUMNS_FROM, max_size=160)


@settings(max_examples=60, deadline=None)
@given(xs=spans)
def test_columns_equal_loops(xs) -> None:
    assert iv.union(xs) == iv.union_by_loop(xs)
    assert iv.length(xs) == sum(e - s for s, e in xs)


def test_pairwise_sum_caught() -> None:
    rng = np.random.default_rng(2)
    xs = [(float(s), float(s + d)) for s, d in zip(rng.random(5000) * 1e3, rng.random(5000) * 1e-3)]
    sequential = sum(e - s for s, e in xs)
    assert iv.length(xs) == sequential
    spans_ = np.array(xs)
    assert float((spans_[:, 1] - spans_[:, 0]).sum()) != sequential  # numpy's pairwise sum differs here
