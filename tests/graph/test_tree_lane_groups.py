"""The tree walk's shared lane heaps (one per group of links crossed by the same routes) give
the times a heap per link gives: replayed here link by link on topologies whose routes overlap."""

from __future__ import annotations

import heapq

import pytest

from triosim.graph.collectives import tree_cost
from triosim.graph.collectives.double_tree import _lanes
from triosim.hardware.presets import build_platform


def _replayed_ends(platform, plan) -> list[float]:
    """Each transfer of ``plan`` in its order, taking the free-first lane of every link of its route."""
    lanes = _lanes(platform, list(plan.route))
    free = {x: [(0.0, j) for j in range(m)] for x, m in lanes.items()}
    ends: list[float] = []
    for i in range(len(plan)):
        start = max((ends[p] for p in plan.data_preds[i]), default=0.0) + plan.delay[i]  # λ holds no link
        picks = [heapq.heappop(free[x]) for x in plan.route[i]]
        start = max([start, *(at for at, _lane in picks)])
        ends.append(start + plan.duration[i])
        for x, (_at, lane) in zip(plan.route[i], picks):
            heapq.heappush(free[x], (ends[-1], lane))
    return ends


@pytest.mark.parametrize("kw", [dict(num_gpus=24), dict(num_gpus=16, topology="mesh", num_rows=4, num_cols=4)])
@pytest.mark.parametrize("network", ["flow", "exclusive"])
@pytest.mark.parametrize("stride", [1, 3, 5])
def test_shared_heaps_equal_one_heap_per_link(kw, network, stride):
    p = build_platform(**kw).with_network(network=network, collective_latency_us=None)
    group = tuple(range(0, p.num_gpus, stride))
    for nbytes in (4e3, 5e6, 3e8):
        plan = tree_cost.tree_plan(p, group, nbytes)
        assert _replayed_ends(p, plan) == pytest.approx(plan.end, rel=0, abs=0)
