"""Closed forms of the ring algorithms: the original one-way ring and the multi-channel ring.

- ``one-way-ring``: one ring in the group's order, N chunks. With W and α the bandwidth and
  total latency of the slowest hop, all-reduce (reduce-scatter then all-gather) takes
  ``2(N−1)(α + S/(N·W))``, reduce-scatter and all-gather ``(N−1)(α + S/(N·W))`` and broadcast
  (a pipelined chain from the root in ring order, N chunks) ``2(N−1)(α + S/(N·W))``; kept bit
  for bit from the original.
- ``ring``: the rings the topology offers (``Platform.channel_style``): both directions of a
  ring, one ring per stride of a fully connected group, one ring per NIC rail of a cluster.
  The payload is split evenly over the channels; a broadcast is a pipelined chain per channel
  in at least :data:`BROADCAST_CHUNKS` chunks. A step's latency follows NCCL: the network's
  only on the steps that leave a node (:func:`~triosim.graph.collectives.protocols.ring_step_latency_s`).
"""

from __future__ import annotations

import math

from ...hardware.platform import Platform, gpu_node
from .groups import node_groups, spans_even_nodes
from .phases import Phase, add_load
from .protocols import base_latency_s, ring_step_latency_s, route_latency, step_latency_s

# A pipelined ring broadcast cuts the payload into at least this many chunks, so it takes
# ≈ S/W (k + N − 2 chunk times of S/k), as NCCL's chunked broadcast does.
BROADCAST_CHUNKS = 64


# ----------------------------------------------------------------------------- one-way ring


def ring_step_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """One ring step: a chunk of ``nbytes / n`` over a hop of ``bandwidth`` B/s, ``latency`` s."""
    return latency + nbytes / (n * bandwidth)


def ring_all_reduce_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` GPUs: ``2(n−1)(α + S/(n·W))``."""
    if n < 2:
        return 0.0
    return 2 * (n - 1) * ring_step_time(nbytes, n, bandwidth, latency)


def ring_reduce_scatter_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Ring reduce-scatter of ``nbytes`` (each GPU keeps 1/n): ``(n−1)(α + S/(n·W))``."""
    if n < 2:
        return 0.0
    return (n - 1) * ring_step_time(nbytes, n, bandwidth, latency)


def ring_all_gather_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Ring all-gather to ``nbytes`` in total (each GPU brings 1/n): ``(n−1)(α + S/(n·W))``."""
    return ring_reduce_scatter_time(n, nbytes, bandwidth, latency)


def ring_broadcast_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Pipelined chain broadcast in n chunks over n−1 hops: ``2(n−1)(α + S/(n·W))``."""
    return ring_all_reduce_time(n, nbytes, bandwidth, latency)


def chain_positions(n: int, root_pos: int) -> list[int]:
    """The ring positions sending over hop p = 1 … n−1 of a chain from ring position ``root_pos``."""
    return [(root_pos + p) % n for p in range(n - 1)]


def one_way_ring_seconds(platform: Platform, group: tuple[int, ...], op: str, nbytes: float,
                         root: int | None = None) -> float:
    """The original ring's closed form, bit for bit: steps × the slowest hop's time for S/N."""
    n = len(group)
    hops = list(range(n))
    if op == "broadcast":
        hops = chain_positions(n, group.index(group[0] if root is None else root))
    steps = {"all_reduce": 2 * (n - 1), "broadcast": 2 * (n - 1)}.get(op, n - 1)
    best = -1.0
    for i in hops:
        route = platform.route(gpu_node(group[i]), gpu_node(group[(i + 1) % n]))
        lat = route_latency(platform, route) + step_latency_s(platform, "ring", route)
        bw = min(platform.link_bandwidth(x) for x in route)
        # The same arithmetic as the original's macro step, so numbers stay bit for bit.
        t = ring_step_time(nbytes, n, bw, lat)
        if t > best:
            best = t
    return base_latency_s(platform, "ring") + steps * best


# ----------------------------------------------------------------------------- phases


def ring_orders(platform: Platform, group: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The channels (ring orders) the ``ring`` algorithm uses for ``group``."""
    n = len(group)
    style = platform.channel_style
    if n < 3 or style == "single":
        return [group]
    if style == "bidirectional":
        return [group, group[::-1]]
    if style == "strides":
        return [tuple(group[(i * k) % n] for i in range(n)) for k in range(1, n) if math.gcd(k, n) == 1]
    nodes = node_groups(platform, group)
    if not spans_even_nodes(nodes):
        return [tuple(g for x in (nodes or [list(group)]) for g in x)]
    per = len(nodes[0])
    # Channel c enters every node at local rank c+1 and leaves it from local rank c, so each
    # GPU's NIC carries exactly one channel in each direction.
    return [tuple(x[(c + 1 + k) % per] for x in nodes for k in range(per)) for c in range(per)]


def _ring_phase(platform: Platform, orders: list[tuple[int, ...]], nbytes: float, steps: int, name: str,
                chunks_per_channel: int | None = None, hops: list[list[int]] | None = None,
                nccl_steps: bool = False) -> Phase:
    """``steps`` ring steps on every channel; each step a hop carries its channel's chunk.

    With ``hops`` (a chain broadcast) each hop carries all ``chunks_per_channel`` chunks once.
    ``nccl_steps``: a step's latency by NCCL's count of network steps
    (:func:`~triosim.graph.collectives.protocols.ring_step_latency_s`), else the slowest hop's.
    """
    n = len(orders[0])
    share = nbytes / len(orders)
    k = chunks_per_channel or n
    load: dict[str, float] = {}
    lat = 0.0
    per_hop = share if hops is not None else steps * share / k
    for ci, order in enumerate(orders):
        idx = hops[ci] if hops is not None else range(n)
        routes = [platform.route(gpu_node(order[i]), gpu_node(order[(i + 1) % n])) for i in idx]
        for route in routes:
            add_load(load, route, per_hop)
        if nccl_steps:  # network latency only on the steps that leave a node
            lat = max(lat, ring_step_latency_s(platform, routes, steps))
        else:
            for route in routes:
                lat = max(lat, route_latency(platform, route) + step_latency_s(platform, "ring", route))
    return Phase(name, steps, lat, load, fill=steps / k if hops is not None else 1.0)


def one_way_ring_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float,
                        root: int | None = None) -> list[Phase]:
    """The one-way ring as phases: one ring phase, or a chain from the root for a broadcast."""
    n = len(group)
    if op == "broadcast":
        r = group.index(group[0] if root is None else root)
        return [_ring_phase(platform, [group], nbytes, 2 * (n - 1), "chain", hops=[chain_positions(n, r)])]
    steps = {"all_reduce": 2 * (n - 1)}.get(op, n - 1)
    return [_ring_phase(platform, [group], nbytes, steps, "ring")]


def ring_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float,
                root: int | None = None) -> list[Phase]:
    """The multi-channel ring as phases: reduce-scatter and all-gather for an all-reduce, one
    phase for the others, a pipelined chain per channel for a broadcast."""
    n = len(group)
    orders = ring_orders(platform, group)
    if op == "broadcast":
        k = max(n, BROADCAST_CHUNKS)
        r = group[0] if root is None else root
        hops = [chain_positions(n, o.index(r)) for o in orders]
        return [_ring_phase(platform, orders, nbytes, k + n - 2, "chain", chunks_per_channel=k, hops=hops)]
    if op == "all_reduce":
        return [_ring_phase(platform, orders, nbytes, n - 1, "rs", nccl_steps=True),
                _ring_phase(platform, orders, nbytes, n - 1, "ag", nccl_steps=True)]
    return [_ring_phase(platform, orders, nbytes, n - 1, op, nccl_steps=True)]
