"""Closed form of the ``direct`` algorithm: every GPU sends its share straight to every peer.

One round per phase: reduce-scatter, all-gather and all-to-all are one round each, all-reduce
is both, broadcast is a scatter from the root then an all-gather. Every transfer carries S/N.
A GPU posts its sends to its peers one after another (NCCL's point-to-point operations), so a
round's latency is α + (peers)·λ.
"""

from __future__ import annotations

from ...hardware.platform import Platform, gpu_node
from .phases import Phase, add_load
from .protocols import route_latency, step_latency_s


def direct_pairs(group: tuple[int, ...], op: str, root: int | None = None) -> list[list[tuple[int, int]]]:
    """The (src, dst) transfers of each direct phase; every transfer carries S/N."""
    allpairs = [(s, d) for s in group for d in group if s != d]
    if op == "all_reduce":
        return [allpairs, allpairs]
    if op == "broadcast":
        r = group[0] if root is None else root
        return [[(r, d) for d in group if d != r], [(s, d) for s, d in allpairs if d != r]]
    return [allpairs]


def direct_round_names(op: str) -> list[str]:
    """The name of each round of :func:`direct_pairs`."""
    return {"all_reduce": ["rs", "ag"], "broadcast": ["scatter", "ag"]}.get(op, [op])


def direct_peers(pairs: list[tuple[int, int]]) -> int:
    """The most sends one GPU posts in a direct round: each pays the per-step latency λ."""
    count: dict[int, int] = {}
    for s, _d in pairs:
        count[s] = count.get(s, 0) + 1
    return max(count.values(), default=0)


def _pairs_phase(platform: Platform, pairs: list[tuple[int, int]], chunk: float, name: str) -> Phase:
    """One direct round: all transfers at once; a GPU's sends to its peers are posted one after
    another, so the round's latency is α + (peers)·λ (NCCL's point-to-point operations)."""
    load: dict[str, float] = {}
    lat = 0.0
    peers = direct_peers(pairs)
    for s, d in pairs:
        route = platform.route(gpu_node(s), gpu_node(d))
        add_load(load, route, chunk)
        lat = max(lat, route_latency(platform, route) + peers * step_latency_s(platform, "ring", route))
    return Phase(name, 1 if pairs else 0, lat, load)


def direct_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float,
                  root: int | None = None) -> list[Phase]:
    """The direct algorithm as phases, one per round."""
    n = len(group)
    return [_pairs_phase(platform, pairs, nbytes / n, nm)
            for pairs, nm in zip(direct_pairs(group, op, root), direct_round_names(op))]
