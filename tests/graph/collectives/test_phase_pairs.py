"""A phase scaled from its 1-byte plan finds its busiest link over the distinct (load,
bandwidth) pairs of its links: the same seconds as over every link, for every payload, algorithm
and topology below; pairs that dropped a link's bandwidth (the planted bug) move them."""

from __future__ import annotations

import pytest

from triosim import build_platform
from triosim.graph.collectives import plans
from triosim.graph.collectives.phases import Phase

PLATFORMS = {
    "ring": lambda: build_platform(16, topology="ring", network="flow", collective_algo="auto"),
    "nvlink-cluster": lambda: build_platform(16, topology="nvlink-cluster", gpus_per_node=4, network="flow",
                                             collective_algo="auto"),
    "mesh": lambda: build_platform(16, interconnects=1, num_rows=4, num_cols=4, network="flow"),
}


def _unscaled(p: Phase) -> Phase:
    return Phase(p.name, p.steps, p.step_latency, p.link_load, p.base_latency, p.fill)


@pytest.mark.parametrize("where", PLATFORMS)
@pytest.mark.parametrize("algo", ["ring", "one-way-ring", "direct", "hierarchical"])
@pytest.mark.parametrize("nbytes", [1, 3, 1_000_003, 7.5e8])
def test_pairs_give_every_links_time(where, algo, nbytes) -> None:
    platform = PLATFORMS[where]()
    group = (0, 1, 2, 3, 5, 8, 13, 15)
    if algo == "hierarchical":  # whole nodes
        if where != "nvlink-cluster":
            pytest.skip("hierarchical needs nodes")
        group = tuple(range(8))
    for op in ("all_reduce", "all_gather"):
        for p in plans.plan(platform, group, op, nbytes, algo):
            assert p.scaled is not None
            assert p.seconds(platform) == _unscaled(p).seconds(platform)


def test_planted_bug_caught() -> None:
    platform = PLATFORMS["nvlink-cluster"]()
    phases = plans.plan(platform, (0, 1, 4, 5), "all_reduce", 1e8, "ring")
    p = phases[0]
    pairs, nbytes, graph = p.scaled
    slowest = min(bw for _u, bw in pairs)
    bad = Phase(p.name, p.steps, p.step_latency, p.link_load, p.base_latency, p.fill,
                scaled=(tuple(pr for pr in pairs if pr[1] != slowest), nbytes, graph))
    assert bad.seconds(platform) != _unscaled(p).seconds(platform)
