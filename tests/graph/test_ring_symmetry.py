"""Rotation classes on the built-in ring: a class's routes are its groups' routes moved round
the ring, so one closed form stands for all of them."""

from __future__ import annotations

import pytest

from triosim.graph.collectives.group_comm import closed_form_seconds
from triosim.graph.ring_symmetry import rotation_class
from triosim.hardware.platform import gpu_node
from triosim.hardware.presets import build_platform


def _hops(platform, group):
    """Every member-to-member route as (from, to) GPU index pairs of its links."""
    out = []
    for a in group:
        for b in group:
            if a != b:
                route = platform.route(gpu_node(a), gpu_node(b))
                out.append(tuple(tuple(int(x[3:]) for x in link.split("->")) for link in route))
    return out


GROUPS = [(1, 9), (3, 11), (0, 8), (2, 5, 8, 11, 14), (5, 6, 7, 8), (1, 5, 9, 13), (7, 15), (4, 12, 13)]


@pytest.mark.parametrize("n", [15, 16, 24])
@pytest.mark.parametrize("group", GROUPS)
def test_class_routes_are_the_groups_routes_moved(n, group):
    p = build_platform(n)
    group = tuple(g % n for g in group)
    base = rotation_class(n, group)
    shift = (group[0] - base[0]) % n
    moved = [tuple(((a + shift) % n, (b + shift) % n) for a, b in hop) for hop in _hops(p, base)]
    assert moved == _hops(p, group)


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_class_cost_is_the_groups_cost(op):
    p = build_platform(32).with_network(network="flow", collective_algo="auto", collective_latency_us=None)
    for group in [(3, 11, 19, 27), (1, 2, 3, 4, 5, 6, 7, 8), (5, 21), (2, 9, 16, 23, 30)]:
        base = rotation_class(32, group)
        assert closed_form_seconds(p, base, op, 10_000_000) == closed_form_seconds(p, group, op, 10_000_000)


def test_classes_of_the_data_parallel_groups():
    """dp 4 × tp 2 × pp 2 on 16 GPUs: the DP groups {t + 2s + 4d} fall into two classes."""
    groups = {(t + 2 * s, t + 2 * s + 4, t + 2 * s + 8, t + 2 * s + 12) for t in range(2) for s in range(2)}
    assert {rotation_class(16, g) for g in groups} == {(0, 4, 8, 12), (1, 5, 9, 13)}
