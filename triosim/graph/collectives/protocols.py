"""NCCL's protocols in the closed forms: the latency of a step and of a call, and the share of a
link's bandwidth that carries payload (hence the bytes a collective puts on its links).

With ``Platform.collective_latency_us`` None, NCCL's published constants
(``src/graph/tuning.cc``, NCCL 2.18) for the platform's protocol: a per-call base latency and
a per-step hardware latency by algorithm family (``ring`` or ``tree``) and link kind. A number
instead is λ per step for every algorithm, with no per-call latency; 0 turns the model off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ...hardware.platform import Platform, gpu_node, link_name
from .groups import node_groups, sharp_switch

# NCCL 2.18 src/graph/tuning.cc (µs): baseLat and hwLat, Simple protocol; NVLS (NVLink SHARP,
# Simple only) from NCCL 2.30's: no base latency, 25 µs on NVLink.
NCCL_BASE_LATENCY_US = {"ring": 8.4, "tree": 0.0, "nvls": 0.0}
NCCL_STEP_LATENCY_US = {
    ("ring", "nvlink"): 3.4, ("ring", "pcie"): 5.7, ("ring", "net"): 14.0,
    ("tree", "nvlink"): 28.0, ("tree", "pcie"): 28.0, ("tree", "net"): 28.0,
    ("nvls", "nvlink"): 25.0,
}
# The same for the LL and LL128 protocols.
NCCL_PROTOCOL_BASE_LATENCY_US = {
    "ll": {"ring": 6.6, "tree": 6.8}, "ll128": {"ring": 14.0, "tree": 14.0}, "simple": NCCL_BASE_LATENCY_US,
}
NCCL_PROTOCOL_STEP_LATENCY_US = {
    "ll": {("ring", "nvlink"): 0.6, ("ring", "pcie"): 1.0, ("ring", "net"): 2.7,
           ("tree", "nvlink"): 0.6, ("tree", "pcie"): 1.0, ("tree", "net"): 5.0},
    "ll128": {("ring", "nvlink"): 1.9, ("ring", "pcie"): 2.5, ("ring", "net"): 4.0,
              ("tree", "nvlink"): 1.25, ("tree", "pcie"): 1.9, ("tree", "net"): 8.5},
    "simple": NCCL_STEP_LATENCY_US,
}


def protocol(platform: Platform) -> str:
    """The platform's protocol, ``simple`` for ``auto`` (resolved per collective by
    :func:`triosim.graph.collectives.choice.resolve`)."""
    p = platform.collective_protocol
    return "simple" if p == "auto" else p


def latency_family(algo: str) -> str:
    """Which of NCCL's latency rows an algorithm pays: ``tree``, ``nvls`` or ``ring`` (the rest)."""
    return algo if algo in ("tree", "nvls") else "ring"


def step_latency_s(platform: Platform, family: str, route: tuple[str, ...]) -> float:
    """λ for one step of ``family`` ("ring", "tree" or "nvls") over ``route``."""
    lat = platform.collective_latency_us
    if lat is not None:
        return lat * 1e-6
    return NCCL_PROTOCOL_STEP_LATENCY_US[protocol(platform)][(family, platform.route_kind(route))] * 1e-6


def base_latency_s(platform: Platform, family: str) -> float:
    """The per-call latency of a collective of ``family`` ("ring", "tree" or "nvls")."""
    if platform.collective_latency_us is not None:
        return 0.0
    return NCCL_PROTOCOL_BASE_LATENCY_US[protocol(platform)][family] * 1e-6


def route_latency(platform: Platform, route: tuple[str, ...]) -> float:
    """The summed latency of the links of ``route`` (s), found once per route by the platform."""
    return platform.route_time(route, 0.0)


def ring_step_latency_s(platform: Platform, routes: Sequence[tuple[str, ...]], steps: int) -> float:
    """The mean latency of one of ``steps`` ring steps over a ring whose hops are ``routes``.

    NCCL's model (``src/graph/tuning.cc``, ``nInterSteps``): a chunk travelling ``steps`` hops
    round a ring pays the network's latency only on the hops that leave a node (a ring through
    ``m`` nodes crosses the network ``m − 1`` times in ``N − 1`` steps, so an all-reduce's
    2(N−1) steps have 2(m−1) network steps) and the intra-node latency on the others. A step's
    latency is its hops' link latency plus λ of their kind, the slowest hop of each kind.
    A ring inside one node, or whose every hop crosses the network, keeps one kind on every step.
    """
    intra = inter = None
    net_hops = 0
    for route in routes:
        lat = route_latency(platform, route) + step_latency_s(platform, "ring", route)
        if platform.route_kind(route) == "net":
            net_hops += 1
            inter = lat if inter is None else max(inter, lat)
        else:
            intra = lat if intra is None else max(intra, lat)
    if steps <= 0 or (intra is None and inter is None):
        return 0.0
    if inter is None:
        return intra
    if intra is None:
        return inter
    on_net = min(steps, max(0, net_hops - 1))
    return ((steps - on_net) * intra + on_net * inter) / steps


def protocol_efficiency(platform: Platform, algo: str, group: tuple[int, ...], op: str) -> float:
    """The share of a link's bandwidth that carries payload under the platform's protocol.

    NCCL's tuner (``src/graph/tuning.cc``): Simple 1; LL (8-byte lines of 4 data bytes and a
    flag, and slower polling) 1/4 on rings for all-reduce or across nodes, else 1/3, and 1/3.8
    on trees; LL128 (120 data bytes per 128-byte line) 0.92 on rings, 0.7 when each node has
    one GPU of the group, and on trees 120/128 across nodes, 7/9 inside one. NVLS (Simple only)
    reaches its switch's ``sharp_efficiency`` of the nominal rate where the links run at the
    ring's ``efficiency``: its share is their ratio (1 when the file gives no own figure).
    """
    if algo == "nvls":
        return nvls_share(platform, group)
    proto = protocol(platform)
    if proto == "simple":
        return 1.0
    nodes = node_groups(platform, group)
    multi_node = nodes is not None and len(nodes) > 1
    tree = algo == "tree"
    if proto == "ll":
        return 1 / 3.8 if tree else (1 / 4 if multi_node or op == "all_reduce" else 1 / 3)
    if tree:
        return 120 / 128 if multi_node else 7 / 9
    return 0.7 if nodes is not None and all(len(x) == 1 for x in nodes) and multi_node else 0.92


def nvls_share(platform: Platform, group: tuple[int, ...]) -> float:
    """NVLS's payload share of the GPU↔switch links' modelled bandwidth: the switch's SHARP
    efficiency over the link's own (both shares of the same nominal rate)."""
    switch = sharp_switch(platform, group)
    if switch is None:
        raise ValueError(f"NVLS needs a SHARP switch linking every GPU of {group}")
    link = platform.link(link_name(gpu_node(group[0]), switch))
    sharp = platform.graph.nodes[switch]["sharp_efficiency"]
    own = link.get("efficiency", 1.0)  # bandwidth = nominal × efficiency (link_efficiency)
    return 1.0 if sharp == own else sharp / own


def wire_bytes(platform: Platform, algo: str, group: tuple[int, ...], op: str, nbytes: float) -> int:
    """The bytes a collective of ``nbytes`` payload puts through its links under the protocol:
    the payload divided by :func:`protocol_efficiency`, rounded up to whole bytes."""
    eff = protocol_efficiency(platform, algo, group, op)
    return int(nbytes) if eff == 1.0 else math.ceil(nbytes / eff)
