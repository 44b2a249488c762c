"""The ``direct`` algorithm's rounds counted instead of routing every pair (ring, switch,
nvlink-cluster): the same links, bytes and latency as routing every pair, without keeping N²
routes; a representative run gives the same iteration time both ways."""

from __future__ import annotations

import random

import pytest

import triosim.graph.collectives.direct_cost as direct_cost
from triosim import build_platform
from triosim.config import configure
from triosim.graph import build_graph
from triosim.graph.collectives.direct_cost import direct_phases
from triosim.schedule.list_scheduler import schedule

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")


def _every_pair_routed(platform, group, op, nbytes, root=None):
    """The phases as the algorithm had them: every (src, dst) of each round routed."""
    pairs = direct_cost.direct_pairs(group, op, root)
    return [direct_cost._pairs_phase(platform, p, nbytes / len(group), name)
            for p, name in zip(pairs, direct_cost.direct_round_names(op))]


def _groups(n: int, rng: random.Random) -> list[tuple[int, ...]]:
    return [tuple(range(n)), *(tuple(rng.sample(range(n), rng.randint(2, n))) for _ in range(4))]


@pytest.mark.parametrize("topology, sizes", [("ring", (2, 3, 4, 5, 6, 8, 9, 16)), ("switch", (2, 3, 8)),
                                             ("nvlink-cluster", (2, 4, 8, 12))])
def test_counted_rounds_equal_every_pair_routed(topology, sizes) -> None:
    rng = random.Random(7)
    counted = 0
    for n in sizes:
        platform = build_platform(num_gpus=n, topology=topology, gpus_per_node=4)
        for group in _groups(n, rng):
            for op in OPS:
                for root in (None, group[-1]):
                    assert direct_cost.direct_transfers(group, op) == sum(map(len, direct_cost.direct_pairs(group, op, root)))
                    new = direct_phases(platform, group, op, 1000.0, root)
                    counted += direct_cost._counted_round(platform, group, "all", group[0], 1.0) is not None
                    for a, b in zip(_every_pair_routed(platform, group, op, 1000.0, root), new, strict=True):
                        assert (a.name, a.steps, a.step_latency) == (b.name, b.steps, b.step_latency)
                        assert a.link_load.keys() == b.link_load.keys()
                        for link, v in a.link_load.items():
                            assert b.link_load[link] == pytest.approx(v, rel=1e-12)
    assert counted  # the counted path ran, not only the fallback


def test_a_large_ring_keeps_no_route_per_pair() -> None:
    """A direct all-reduce on a 512-GPU ring routed all 261,632 pairs (O(N³) links kept)."""
    platform = build_platform(num_gpus=512, topology="ring")
    phases = direct_phases(platform, tuple(range(512)), "all_reduce", 1.0)
    assert len(platform._routes) <= 2 and len(phases[0].link_load) == 2 * 512


@pytest.mark.parametrize("topology", ["ring", "switch", "nvlink-cluster"])
def test_a_representative_run_is_the_same_as_before(monkeypatch, topology) -> None:
    """Representatives with --collective-algo direct: the iteration time with the rounds counted
    equals the one with every pair routed (the algorithm as it was)."""
    # On the ring representatives stand for the others only where one group spans every GPU.
    degrees = dict(dp=16) if topology == "ring" else dict(dp=8, tp=2)
    flags = dict(**degrees, topology=topology, collective_algo="direct", representatives=True, gpus_per_node=4)

    def makespan() -> float:
        trace, platform, strategy = configure(**flags)
        return schedule(build_graph(trace, platform, strategy)).makespan

    counted = makespan()
    monkeypatch.setattr(direct_cost, "_counted_round", lambda *a: None)
    assert counted == pytest.approx(makespan(), rel=1e-12)
