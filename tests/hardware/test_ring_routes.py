"""The built-in ring's closed-form routes equal networkx's search on the same link graph."""

from __future__ import annotations

import networkx as nx
import pytest

from triosim import build_platform
from triosim.hardware.platform import gpu_node, link_name
from triosim.hardware.ring_routes import ring_path


def _searched(platform, a: int, b: int) -> tuple[str, ...]:
    path = nx.shortest_path(platform._gpu_graph(), gpu_node(a), gpu_node(b))
    return tuple(link_name(x, y) for x, y in zip(path, path[1:]))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 17, 30, 32, 64])
def test_every_pair_as_the_search_finds_it(n):
    p = build_platform(n)
    for a in range(n):
        for b in range(n):
            if a != b:
                assert p.route(gpu_node(a), gpu_node(b)) == _searched(p, a, b), (n, a, b)


@pytest.mark.parametrize("n", [1000, 1024, 4096])
def test_opposite_gpus_on_large_rings(n):
    """The tie (both arcs N/2 long) for sources 0, 1, N−1 and one in the middle."""
    p = build_platform(n)
    for a in (0, 1, n // 2 - 1, n - 1):
        b = (a + n // 2) % n
        assert p.route(gpu_node(a), gpu_node(b)) == _searched(p, a, b)


def test_path_walks_the_shorter_arc():
    assert ring_path(10, 8, 1) == [8, 9, 0, 1]
    assert ring_path(10, 1, 8) == [1, 0, 9, 8]
    assert ring_path(10, 3, 3) == [3]


@pytest.mark.parametrize("kw", [dict(num_gpus=12, topology="switch"),
                                dict(num_gpus=12, topology="nvlink-cluster", gpus_per_node=4)])
def test_star_routes_as_the_search_finds_them(kw):
    p = build_platform(**kw)
    weight = "cost" if p.topology == "nvlink-cluster" else None
    for a in range(p.num_gpus):
        for b in range(p.num_gpus):
            if a != b:
                path = nx.shortest_path(p._gpu_graph(), gpu_node(a), gpu_node(b), weight=weight)
                assert p.route(gpu_node(a), gpu_node(b)) == tuple(link_name(x, y) for x, y in zip(path, path[1:]))
