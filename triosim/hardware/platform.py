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

from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx

from ..checks import flag_number, positive
from ..errors import ConfigError

REMOTE = "remote"
TOPOLOGIES = ("ring", "fully-connected", "switch", "mesh", "nvlink-cluster")
NETWORKS = ("flow", "exclusive")
# "one-way-ring" is the original single ring in the group's order; "ring" uses every channel
# the topology offers (both directions, one ring per rail); see triosim/graph/collectives/cost.py.
COLLECTIVE_ALGOS = ("auto", "ring", "one-way-ring", "tree", "hierarchical", "direct")
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
    _routes: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict, repr=False)
    _route_params: dict[tuple[str, ...], tuple[float, float]] = field(default_factory=dict, repr=False)
    _routes_graph: dict[str, nx.DiGraph] = field(default_factory=dict, repr=False)
    _route_kinds: dict[tuple[str, ...], str] = field(default_factory=dict, repr=False)
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

    def link(self, name: str) -> dict:
        a, b = name.split("->")
        return self.graph.edges[a, b]

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
        return [link_name(a, b) for a, b in self.graph.edges]

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


def _from_file(path: str, num_gpus: int, capacity_log2: float, bandwidth_gbps: float, reference_compat: bool,
               network: str, collective_algo: str, collective_latency_us: float | None) -> Platform:
    """A platform described by a topology file (see :mod:`triosim.hardware.topology_file`)."""
    from . import topology_file as tf

    where, data = tf.read(path)
    if "gpus" in data and tf._number(where, data, "gpus", integer=True) != num_gpus:
        raise ConfigError(f"{where}: field 'gpus' is {data['gpus']}, but -GPUnumber is {num_gpus}")
    if data["kind"] == "preset":
        kwargs = {"bandwidth_gbps": bandwidth_gbps, **tf.preset_arguments(where, data)}
        return build_platform(num_gpus, capacity_log2=capacity_log2, reference_compat=reference_compat,
                              network=network, collective_algo=collective_algo,
                              collective_latency_us=collective_latency_us, **kwargs)
    return tf.build_cluster(tf.cluster_spec(where, data), where, num_gpus, capacity_log2, bandwidth_gbps,
                            network, collective_algo, collective_latency_us)


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


def _add_link(g: nx.DiGraph, a: str, b: str, bandwidth: float, latency: float, cost: int = 1,
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


def build_platform(
    num_gpus: int,
    capacity_log2: float = 40,
    bandwidth_gbps: float = 696,
    ptp_bandwidth_gbps: float = 65,
    interconnects: int = 0,
    num_rows: int | None = None,
    num_cols: int | None = None,
    topology: str = "ring",
    link_latency_us: float | None = None,
    reference_compat: bool = False,
    gpus_per_node: int = 8,
    node_bandwidth_gbps: float = 50.0,
    network: str = "exclusive",
    collective_algo: str = "one-way-ring",
    collective_latency_us: float | None = 0.0,
    topology_file: str | None = None,
) -> Platform:
    """Build the platform from the seed flags (see the README's flag table).

    ``nvlink-cluster``: nodes of ``gpus_per_node`` GPUs; inside a node every GPU reaches an
    NVSwitch (``nvswK``) at ``ptp_bandwidth``; every GPU also has its own NIC to the cluster
    network switch (``net``) at ``node_bandwidth`` (rail-style, one NIC per GPU).

    ``reference_compat`` implies the original's network: exclusive links, the one-way ring and
    no collective latency, whatever the other network arguments say.
    """
    check_network_settings(network, collective_algo, collective_latency_us)
    if reference_compat:
        network, collective_algo, collective_latency_us = "exclusive", "one-way-ring", 0.0
    if topology_file is not None:
        return _from_file(topology_file, num_gpus, capacity_log2, bandwidth_gbps, reference_compat,
                          network, collective_algo, collective_latency_us)
    if num_gpus < 1:
        raise ConfigError(f"-GPUnumber must be >= 1, got {num_gpus}")
    # NaN and infinity are refused: `x <= 0` would let NaN through as an infinitely fast link.
    positive(bandwidth_gbps, "-bandwidth", "GB/s")
    positive(ptp_bandwidth_gbps, "-ptp-bandwidth", "GB/s")
    if not 10 <= capacity_log2 <= 60:
        raise ConfigError(f"-capacity must be between 10 and 60 (GPU memory = 2^capacity bytes), got {capacity_log2}")
    if link_latency_us is not None:
        flag_number(link_latency_us, "--link-latency-us", low=0, high=MAX_LINK_LATENCY_US, unit="µs")
    if gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    positive(node_bandwidth_gbps, "--node-bandwidth", "GB/s")
    if interconnects not in (0, 1):
        raise ConfigError(f"-interconnects must be 0 (electrical) or 1 (optical), got {interconnects}")
    if topology not in TOPOLOGIES:
        raise ConfigError(f"--topology must be one of {', '.join(TOPOLOGIES)}, got {topology!r}")
    if interconnects == 1 and topology not in ("ring", "mesh"):
        # The optical interconnect is always a mesh with a snake ring; silently dropping an
        # explicit electrical topology would mislead.
        raise ConfigError(f"-interconnects 1 (optical mesh) cannot be combined with --topology {topology}")

    remote_bw = bandwidth_gbps * GB
    ptp_bw = ptp_bandwidth_gbps * GB
    if reference_compat:
        latency = 0.0
        if num_gpus >= 2 and interconnects == 0 and topology == "ring":
            # The original pre-multiplies ring links so that an all-reduce of S takes S/ptp.
            ptp_bw = ptp_bw * 2 * (num_gpus - 1) / num_gpus
    else:
        latency = (link_latency_us or 0.0) * 1e-6

    g = nx.DiGraph()
    for i in range(num_gpus):
        g.add_node(gpu_node(i), kind="gpu")
    g.add_node(REMOTE, kind="remote")
    for i in range(num_gpus):
        _add_link(g, gpu_node(i), REMOTE, remote_bw, 0.0 if reference_compat else latency, kind="pcie")
    node_of = None
    style = "bidirectional"

    if interconnects == 1 or topology == "mesh":
        rows = num_rows if num_rows else 1
        cols = num_cols if num_cols else num_gpus
        if rows < 1 or cols < 1 or rows * cols != num_gpus:
            raise ConfigError(
                f"optical mesh: -numRows × -numCols = {rows} × {cols} = {rows * cols}, "
                f"which is not -GPUnumber = {num_gpus}"
            )
        hop = 20e-9 if link_latency_us is None else latency
        if reference_compat:
            hop = 0.0
        for r in range(rows):
            for c in range(cols):
                me = gpu_node(r * cols + c)
                if c + 1 < cols:
                    _add_link(g, me, gpu_node(r * cols + c + 1), ptp_bw, hop)
                if r + 1 < rows:
                    _add_link(g, me, gpu_node((r + 1) * cols + c), ptp_bw, hop)
        ring = snake_order(rows, cols)
        name = "optical-mesh"
        style = "bidirectional"
    elif topology == "fully-connected":
        for i in range(num_gpus):
            for j in range(i + 1, num_gpus):
                _add_link(g, gpu_node(i), gpu_node(j), ptp_bw, latency)
        ring = tuple(range(num_gpus))
        name = topology
        style = "strides"
    elif topology == "switch":
        g.add_node("switch", kind="switch")
        for i in range(num_gpus):
            _add_link(g, gpu_node(i), "switch", ptp_bw, latency)
        ring = tuple(range(num_gpus))
        name = topology
        style = "single"
    elif topology == "nvlink-cluster":
        g.add_node("net", kind="switch")
        for i in range(num_gpus):
            node = i // gpus_per_node
            g.add_node(f"nvsw{node}", kind="switch")
            _add_link(g, gpu_node(i), f"nvsw{node}", ptp_bw, latency, cost=1)
            _add_link(g, gpu_node(i), "net", node_bandwidth_gbps * GB, latency, cost=2, kind="net")
        ring = tuple(range(num_gpus))
        name = topology
        node_of = tuple(i // gpus_per_node for i in range(num_gpus))
        style = "rails"
    else:
        for i in range(num_gpus if num_gpus > 2 else num_gpus - 1):
            _add_link(g, gpu_node(i), gpu_node((i + 1) % num_gpus), ptp_bw, latency)
        ring = tuple(range(num_gpus))
        name = "ring"
        # Links are full duplex: a second ring runs the other way round.
        style = "bidirectional"

    return Platform(
        num_gpus=num_gpus,
        capacity_bytes=int(2**capacity_log2),
        graph=g,
        ring=ring,
        topology=name,
        remote_bandwidth=remote_bw,
        ptp_bandwidth=ptp_bw,
        ptp_bandwidth_nominal=ptp_bandwidth_gbps * GB,
        network=network,
        collective_algo=collective_algo,
        collective_latency_us=collective_latency_us,
        node_of=node_of,
        channel_style=style,
    )
