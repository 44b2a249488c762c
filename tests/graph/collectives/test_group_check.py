"""A collective's group is checked once per platform: a case-3 run's every collective is on
the same 4,096 GPUs. An equal group (numpy integers) gets the checked tuple of ints."""

from __future__ import annotations

import numpy as np
import pytest

from triosim import build_platform
from triosim.graph.collectives.groups import check_group


def test_a_checked_group_is_not_checked_again():
    p = build_platform(16)
    first = check_group(p, tuple(range(16)))
    again = check_group(p, tuple(np.arange(16)))
    assert again is first and all(type(g) is int for g in again)
    assert check_group(p, list(range(16))) == first  # a list converts as before


def test_bad_groups_are_still_refused():
    p = build_platform(4)
    check_group(p, (0, 1))
    with pytest.raises(ValueError, match="repeated"):
        check_group(p, (0, 1, 1))
    with pytest.raises(ValueError, match="not on the platform"):
        check_group(p, (0, 4))
