"""The repeated-unit search with numpy (triosim/trace/layers.py) finds what the pairwise loop finds."""

from __future__ import annotations

import random

from triosim.trace.layers import _repeat_runs, _repeat_runs_by_loop


def test_repeat_runs_equal_the_loop_on_random_names() -> None:
    rng = random.Random(7)
    for _ in range(600):
        alphabet = "abcd"[:rng.randint(1, 4)]
        unit = [rng.choice(alphabet) for _ in range(rng.randint(1, 6))]
        names = [rng.choice(alphabet) for _ in range(rng.randint(0, 5))] + unit * rng.randint(0, 6) + \
            [rng.choice(alphabet) for _ in range(rng.randint(0, 5))]
        assert _repeat_runs(names) == _repeat_runs_by_loop(names), names


def test_repeat_runs_keep_the_first_longest_run() -> None:
    # two runs of period 2 as long as each other: the earlier one is the layer's place
    names = ["x", "a", "b", "a", "b", "y", "c", "d", "c", "d", "z"]
    assert (2, 2, 1, 2) in _repeat_runs(names)
