"""Representatives only where one replica can stand for all: replicas that meet the nodes of
``nvlink-cluster`` differently are built whole (or, past a size, flagged)."""

from __future__ import annotations

from pathlib import Path

import pytest

import triosim.graph.composition as hybrid_module
from triosim.graph import build_graph
from triosim.graph.rank_map import RankMap
from triosim.graph.replica_symmetry import replicas_alike
from triosim.graph.strategy import Strategy
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.trace import load_trace

GPT = Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-cpu-bs8"


def _cluster(n: int):
    return build_platform(num_gpus=n, topology="nvlink-cluster", gpus_per_node=4)


@pytest.mark.parametrize("dp, tp, pp, order, alike", [
    (2, 1, 3, ("tp", "pp", "dp"), False),  # replica 0 in node 0, replica 1 across nodes 0 and 1
    (3, 1, 2, ("tp", "pp", "dp"), True),  # pipelines {0, 1}, {2, 3}, {4, 5} each in a node; DP groups alike
    (2, 2, 2, ("tp", "pp", "dp"), True),
    (4, 2, 2, ("tp", "pp", "dp"), True),
    (2, 4, 2, ("tp", "pp", "dp"), True),
    (8, 1, 1, ("tp", "pp", "dp"), True),
    (2, 3, 1, ("tp", "pp", "dp"), False),  # TP group {3, 4, 5} straddles two nodes, {0, 1, 2} does not
    (2, 2, 2, ("dp", "tp", "pp"), True),
])
def test_replicas_alike_on_nvlink_cluster(dp, tp, pp, order, alike):
    assert replicas_alike(_cluster(dp * tp * pp), RankMap(dp, tp, pp, order)) is alike


def test_every_replica_is_alike_on_a_switch():
    assert replicas_alike(build_platform(num_gpus=6, topology="switch"), RankMap(2, 1, 3))


def _makespan(strategy: Strategy, n: int):
    graph = build_graph(load_trace(GPT, batch_size=8), _cluster(n), strategy)
    return schedule(graph).makespan, graph.meta["hybrid"]


KW = dict(dp=2, tp=1, pp=3, micro_batch_size=2, schedule="1f1b", collective_detail="macro")


def test_unalike_replicas_are_built_whole_and_match_exact():
    exact, _ = _makespan(Strategy(exact=True, **KW), 6)
    rep, meta = _makespan(Strategy(exact=False, **KW), 6)
    assert meta["representatives"] is False and meta["replica_warning"] is None
    assert rep == exact


def test_one_representative_for_unalike_replicas_is_off(monkeypatch):
    """Planted bug: the symmetry check says every mesh is alike; replica 1's pipeline crosses a
    node that replica 0's does not, and the representative's time misses it."""
    exact, _ = _makespan(Strategy(exact=True, **KW), 6)
    monkeypatch.setattr(hybrid_module, "replicas_alike", lambda platform, ranks: True)
    rep, meta = _makespan(Strategy(exact=False, **KW), 6)
    assert meta["representatives"] is True
    assert abs(rep - exact) > 1e-6 * exact


def test_past_the_size_limit_unalike_replicas_are_flagged(monkeypatch):
    monkeypatch.setattr(hybrid_module, "UNALIKE_EXACT_TASKS", 0)
    _, meta = _makespan(Strategy(exact=False, **KW), 6)
    assert meta["representatives"] is True
    assert "meet the nodes differently" in meta["replica_warning"]
