"""A check shared by the tests of the builders' recorded lookups (graph.recorded_dict)."""

from __future__ import annotations

import pytest


def assert_reads_as(lazy, plain: dict, keys) -> None:
    """``lazy`` answers ``get``, ``in`` and ``[]`` for every key as the plain dict ``plain`` does."""
    for key in keys:
        assert lazy.get(key) == plain.get(key) and (key in lazy) == (key in plain)
        assert lazy.get(key, "none") == plain.get(key, "none")
        if key in plain:
            assert lazy[key] == plain[key]
        else:
            with pytest.raises(KeyError):
                lazy[key]
