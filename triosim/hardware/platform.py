"""The hardware: GPUs with a memory capacity, a remote-memory node, and the interconnect.

The interconnect is a networkx directed graph. Nodes are ``gpu0`` … ``gpuN-1``, ``remote`` and
optional switch nodes; every physical link is two directed edges, each with a bandwidth (B/s)
and a latency (s). A transfer holds every directed link of its route (shortest path by hop
count) for ``Σ latency + bytes / min bandwidth``. ``ring`` is the logical ring collectives use.

Every link also has a ``kind``: ``nvlink`` (GPU↔GPU or GPU↔NVSwitch), ``net`` (a NIC or a
cluster-network switch port) or ``pcie`` (GPU↔remote memory); the collective latency model
charges NCCL's per-step constant of the slowest kind a step crosses.

The network settings live here too: ``network`` (``flow``: links shared max-min fairly;
``exclusive``: a transfer reserves its route), ``collective_algo`` and
``collective_latency_us`` (``None``: NCCL's published constants) and ``collective_protocol``
(NCCL's ``simple``, ``ll``, ``ll128`` or ``auto``; set with ``with_network``). ``build_platform``'s Python
defaults keep the original model (exclusive links, one-way ring, no collective latency); the
command line defaults to ``flow``, ``auto`` and NCCL's latencies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import networkx as nx

from ..errors import ConfigError
from .ring_routes import ring_path

REMOTE = "remote"
TOPOLOGIES = ("ring", "fully-connected", "switch", "mesh", "nvlink-cluster")
NETWORKS = ("flow", "exclusive")
# "one-way-ring" is the original single ring in the group's order; "ring" uses every channel
# the topology offers (both directions, one ring per rail); see triosim/graph/collectives/cost.py.
COLLECTIVE_ALGOS = ("auto", "ring", "one-way-ring", "tree", "hierarchical", "direct", "nvls")
# NCCL's protocols: Simple (bandwidth), LL and LL128 (low latency, less bandwidth); auto picks
# per collective with the algorithm.
COLLECTIVE_PROTOCOLS = ("auto", "simple", "ll", "ll128")
LINK_KINDS = ("nvlink", "net", "pcie")
# single: one ring; bidirectional: the ring and its reverse (full-duplex ring or mesh links);
# strides: rings i -> i+k for each stride k coprime to N (fully connected); rails: one ring per
# local rank through every node (node-structured clusters with a NIC per GPU).
CHANNEL_STYLES = ("single", "bidirectional", "strides", "rails")
GB = 1e9  # 1 GB/s = 1e9 B/s, as the original
MAX_LINK_LATENCY_US = 1e9  # 1000 s per hop: anything above is a unit mistake


def gpu_node(g: int) -> str:
    return f"gpu{g}"


def link_name(a: str, b: str) -> str:
    return f"{a}->{b}"


@dataclass
class Platform:
    """GPUs, memory and the link graph; routes are computed once and cached per instance."""

    num_gpus: int
    capacity_bytes: int
    graph: nx.DiGraph
    ring: tuple[int, ...]
    topology: str
    remote_bandwidth: float
    ptp_bandwidth: float  # what GPU↔GPU links carry (pre-multiplied under reference-compat)
    ptp_bandwidth_nominal: float = 0.0  # the -ptp-bandwidth flag in B/s
    network: str = "exclusive"
    collective_algo: str = "one-way-ring"
    collective_latency_us: float | None = 0.0  # None: NCCL's constants; a number: per step
    # Node index of every GPU (hierarchical collectives); None: one flat level.
    node_of: tuple[int, ...] | None = None
    # How the "ring" algorithm spreads a group over the topology's links (CHANNEL_STYLES).
    channel_style: str = "single"
    collective_protocol: str = "simple"
    # Achieved share of nominal bandwidth per link class (triosim.hardware.link_efficiency); the
    # links' bandwidths already include it. Empty: every link at its nominal rate.
    link_efficiency: dict[str, float] = field(default_factory=dict)
    _routes: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict, repr=False)
    _route_params: dict[tuple[str, ...], tuple[float, float]] = field(default_factory=dict, repr=False)
    _routes_graph: dict[str, nx.DiGraph] = field(default_factory=dict, repr=False)
    _route_kinds: dict[tuple[str, ...], str] = field(default_factory=dict, repr=False)
    _link_attrs: dict = field(default_factory=dict, repr=False)  # link name -> attributes; None -> graph
    # Collective plans per (group, op, algorithm, root, latency setting), for a 1-byte payload.
    _plans: dict = field(default_factory=dict, repr=False)
    # Closed-form routing for large generated clusters (src, dst) -> node path, or None.
    router: Callable[[str, str], list[str]] | None = field(default=None, repr=False)
    # The same platform with another protocol, per protocol (shared by all of them).
    _variants: dict = field(default_factory=dict, repr=False)

    def _gpu_graph(self) -> nx.DiGraph:
        """The link graph without remote memory, made once: searching a filtered view costs a
        filter call per node visited, which dominated large platforms."""
        g = self._routes_graph.get("gpu")
        if g is None:
            g = self._routes_graph["gpu"] = self.graph.copy()
            if REMOTE in g:
                g.remove_node(REMOTE)
        return g

    def route(self, src: str, dst: str) -> tuple[str, ...]:
        """Directed link names from ``src`` to ``dst`` (fewest hops, deterministic)."""
        key = (src, dst)
        hit = self._routes.get(key)
        if hit is None:
            if src == dst:
                hit = ()
            elif self.router is not None:
                path = self.router(src, dst)
                hit = tuple(link_name(a, b) for a, b in zip(path, path[1:]))
            elif self.topology == "ring" and REMOTE not in (src, dst) and self.num_gpus > 1:
                # The built-in ring: the search's own answer in closed form (hardware/ring_routes.py).
                path = ring_path(self.num_gpus, int(src[3:]), int(dst[3:]))
                hit = tuple(link_name(gpu_node(a), gpu_node(b)) for a, b in zip(path, path[1:]))
            elif (hub := self._star_hub(src, dst)) is not None:
                hit = (link_name(src, hub), link_name(hub, dst))
            else:
                # GPU-to-GPU traffic never detours through remote memory.
                g = self.graph
                if REMOTE not in (src, dst):
                    g = self._gpu_graph()
                try:
                    # In a two-level cluster a link's "cost" makes NVLink win inside a node;
                    # elsewhere every link costs 1, i.e. fewest hops.
                    path = nx.shortest_path(g, src, dst, weight="cost" if self.topology == "nvlink-cluster" else None)
                except (nx.NetworkXNoPath, nx.NodeNotFound):
                    raise ConfigError(f"no route from {src} to {dst} in the {self.topology} topology") from None
                hit = tuple(link_name(a, b) for a, b in zip(path, path[1:]))
            self._routes[key] = hit
        return hit

    def _star_hub(self, src: str, dst: str) -> str | None:
        """The switch between two GPUs of the built-in ``switch`` or ``nvlink-cluster`` (their
        node's NVSwitch when they share a node, else the cluster network): the only shortest path
        there, found without a search over 10^4 nodes (None: search)."""
        if self.router is not None or not (src.startswith("gpu") and dst.startswith("gpu")):
            return None
        if self.topology == "switch":
            return "switch"
        if self.topology != "nvlink-cluster" or self.node_of is None:
            return None
        a, b = self.node_of[int(src[3:])], self.node_of[int(dst[3:])]
        return f"nvsw{a}" if a == b else "net"

    def canonical_group(self, group: tuple[int, ...]) -> tuple[int, ...]:
        """A group whose routes cross links of the same attributes in the same pattern as
        ``group``'s, member for member, and the same for every group alike in that way (a
        cluster file's groups of different nodes: :meth:`ClusterRouter.canonical
        <triosim.hardware.cluster.ClusterRouter.canonical>`); ``group`` itself elsewhere. Closed
        forms that depend only on the links of a group's routes are found once per canonical group."""
        return self.canonical_groups((group,))[0]

    def canonical_groups(self, groups: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """:meth:`canonical_group` of several groups renamed together, so that they also share
        links as the given groups do (the groups unchanged where the platform has no renaming)."""
        canonical = getattr(self.router, "canonical", None)
        return list(groups) if canonical is None else canonical(groups)

    def link_renaming(self, source: tuple[int, ...], target: tuple[int, ...]) -> Callable[[str], str] | None:
        """How the links of ``source``'s routes are named on ``target``, member for member, for two
        groups with one :meth:`canonical_group` (None where the platform renames no group)."""
        renaming = getattr(self.router, "link_renaming", None)
        return None if renaming is None else renaming(source, target)

    def link(self, name: str) -> dict:
        # Looked up millions of times by the collectives' closed forms on large rings: a dict of
        # the edge attribute dicts themselves (so attributes read later are the graph's own),
        # kept with the graph it reads: a copy made with another graph (``replace``) starts afresh.
        cache = self._link_attrs
        if cache.get(None) is not self.graph:
            cache = self._link_attrs = {None: self.graph}
        hit = cache.get(name)
        if hit is None:
            a, b = name.split("->")
            hit = cache[name] = self.graph.edges[a, b]
        return hit

    def route_time(self, route: tuple[str, ...], nbytes: float) -> float:
        """Latency of every hop plus the bytes at the slowest link's bandwidth."""
        if not route:
            return 0.0
        params = self._route_params.get(route)
        if params is None:
            lat = 0.0
            bw = float("inf")
            for name in route:
                attrs = self.link(name)
                lat += attrs["latency"]
                bw = min(bw, attrs["bandwidth"])
            params = self._route_params[route] = (lat, bw)
        return params[0] + nbytes / params[1]

    def ring_links(self, group: tuple[int, ...] | None = None) -> list[tuple[str, ...]]:
        """Routes of each step of the ring over ``group`` (default: all GPUs in ring order)."""
        order = tuple(group) if group is not None else self.ring
        n = len(order)
        if n < 2:
            return []
        return [self.route(gpu_node(order[i]), gpu_node(order[(i + 1) % n])) for i in range(n)]

    def links(self) -> list[str]:
        """Every directed link's name, in the graph's edge order."""
        # link_name inlined over the raw adjacency: 1.6 million links at 131,072 GPUs.
        return [f"{a}->{b}" for a, nbrs in self.graph.adjacency() for b in nbrs]

    def link_bandwidth(self, name: str) -> float:
        return self.link(name)["bandwidth"]

    def route_kind(self, route: tuple[str, ...]) -> str:
        """``net`` if the route crosses the cluster network, else ``nvlink`` (``pcie`` to remote)."""
        hit = self._route_kinds.get(route)
        if hit is None:
            kinds = {self.link(name).get("kind", "nvlink") for name in route}
            hit = next((k for k in ("net", "pcie") if k in kinds), "nvlink")
            self._route_kinds[route] = hit
        return hit

    def with_network(self, **changes) -> Platform:
        """A copy with other network settings (``network``, ``collective_algo``, …), checked."""
        from dataclasses import replace

        out = replace(self, _routes={}, _route_params={}, _route_kinds={}, _plans={}, _variants={}, **changes)
        check_network_settings(out.network, out.collective_algo, out.collective_latency_us, out.collective_protocol)
        return out

    def protocol_variant(self, protocol: str) -> Platform:
        """This platform with ``collective_protocol`` = ``protocol``, sharing its links and routes."""
        if protocol == self.collective_protocol:
            return self
        from dataclasses import replace

        variants = self._variants
        variants.setdefault(self.collective_protocol, self)
        hit = variants.get(protocol)
        if hit is None:
            hit = variants[protocol] = replace(self, collective_protocol=protocol, _plans={})
        return hit


def check_network_settings(network: str, collective_algo: str, collective_latency_us: float | None,
                           collective_protocol: str = "simple") -> None:
    if network not in NETWORKS:
        raise ConfigError(f"--network must be flow or exclusive, got {network!r}")
    if collective_algo not in COLLECTIVE_ALGOS:
        raise ConfigError(f"--collective-algo must be one of {', '.join(COLLECTIVE_ALGOS)}, got {collective_algo!r}")
    if collective_latency_us is not None and not (collective_latency_us >= 0 and collective_latency_us < float("inf")):
        raise ConfigError(f"--collective-latency-us must be a number >= 0, got {collective_latency_us}")
    if collective_protocol not in COLLECTIVE_PROTOCOLS:
        raise ConfigError(f"--collective-protocol must be one of {', '.join(COLLECTIVE_PROTOCOLS)}, "
                          f"got {collective_protocol!r}")


def add_link(g: nx.DiGraph, a: str, b: str, bandwidth: float, latency: float, cost: int = 1,
              kind: str = "nvlink") -> None:
    # A routing cost other than one hop is stored only where it matters (nvlink-cluster).
    extra = {"cost": cost} if cost != 1 else {}
    g.add_edge(a, b, bandwidth=bandwidth, latency=latency, kind=kind, **extra)
    g.add_edge(b, a, bandwidth=bandwidth, latency=latency, kind=kind, **extra)


def snake_order(rows: int, cols: int) -> tuple[int, ...]:
    """GPU ids of a rows × cols mesh visited boustrophedon: the optical ring order."""
    order = []
    for r in range(rows):
        cs = range(cols) if r % 2 == 0 else range(cols - 1, -1, -1)
        order.extend(r * cols + c for c in cs)
    return tuple(order)
