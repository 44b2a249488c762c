"""A ``kind: cluster`` topology file as a platform: nodes of GPUs on an NVSwitch, one NIC link per
GPU to its rail's leaf switch, leaves joined by a spine with an oversubscription, and closed-form
routes between any two GPUs (:class:`ClusterRouter`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import networkx as nx

from ..errors import ConfigError
from ..limits import check_link_count
from .link_efficiency import link_class
from .platform import GB, REMOTE, Platform, gpu_node
from .topology_file import ClusterSpec


class ClusterRouter:
    """Routes of a ``kind: cluster`` platform in closed form (a graph search per pair would cost
    more than the simulation at 10^3 GPUs): inside a node over the NVSwitch; across nodes over
    NVLink to the GPU on the destination's rail (if not already on it), then that rail's leaf,
    and the spine when the nodes are in different scalable units."""

    def __init__(self, gpus_per_node: int, nodes_per_leaf: int) -> None:
        self.g = gpus_per_node
        self.npl = nodes_per_leaf

    def __call__(self, src: str, dst: str) -> list[str]:
        if not (src.startswith("gpu") and dst.startswith("gpu")):
            return [src, dst]  # GPU <-> remote memory: the GPU's own link
        a, b = int(src[3:]), int(dst[3:])
        na, nb = a // self.g, b // self.g
        if na == nb:
            return [src, f"nvsw{na}", dst]
        rail = b % self.g
        path = [src]
        if a % self.g != rail:
            path += [f"nvsw{na}", f"gpu{na * self.g + rail}"]
        su_a, su_b = na // self.npl, nb // self.npl
        path.append(f"leaf{su_a}r{rail}")
        if su_a != su_b:
            path += ["spine", f"leaf{su_b}r{rail}"]
        path.append(dst)
        return path

    def canonical(self, groups: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """``groups`` with their nodes renumbered together, in order inside each scalable unit
        (the j-th of their nodes in unit u becomes node u·nodes_per_leaf + j), every GPU keeping
        its rail.

        Every link of a kind has the same attributes, except a leaf's uplink, which is its
        unit's, and a route is named by its GPUs' nodes, rails and units alone: groups renamed
        so have routes over the same links, renamed, with the same attributes in the same
        order, and cross each other's links as before. The renaming keeps the order of GPU ids
        (sorting, first appearance and node membership are kept)."""
        g, npl = self.g, self.npl
        rename: dict[int, int] = {}
        unit, j = -1, 0
        for node in sorted({x // g for group in groups for x in group}):
            if node // npl != unit:
                unit, j = node // npl, 0
            rename[node] = unit * npl + j
            j += 1
        return [tuple(rename[x // g] * g + x % g for x in group) for group in groups]

    def link_renaming(self, source: tuple[int, ...], target: tuple[int, ...]) -> Callable[[str], str]:
        """The renaming of links that takes ``source``'s routes to ``target``'s, member for member
        (two groups with one canonical group): each node of ``source`` becomes the matching node of
        ``target`` (its GPUs by rail, its NVSwitch); leaves and the spine are kept. A route between
        two members only crosses their nodes' GPUs and NVSwitches, leaves and the spine."""
        g = self.g
        node = {a // g: b // g for a, b in zip(source, target)}

        def one(name: str) -> str:
            if name.startswith("gpu"):
                x = int(name[3:])
                return f"gpu{node[x // g] * g + x % g}"
            if name.startswith("nvsw"):
                return f"nvsw{node[int(name[4:])]}"
            return name

        def rename(link: str) -> str:
            a, b = link.split("->")
            return f"{one(a)}->{one(b)}"

        return rename


def edge_attrs(a: str, b: str, bandwidth: float, latency: float, kind: str, efficiency: dict[str, float]) -> dict:
    """The attributes of the directed link ``a -> b`` that :func:`~triosim.hardware.platform.add_link`
    and then :func:`~triosim.hardware.link_efficiency.scale_links` give it, in that order."""
    cls = link_class(a, b, kind)
    if cls is None:
        return {"bandwidth": bandwidth, "latency": latency, "kind": kind}
    eff = efficiency.get(cls, 1.0)
    return {"bandwidth": bandwidth * eff, "latency": latency, "kind": kind, "nominal_bandwidth": bandwidth,
            "efficiency": eff}


def link_graph(nodes: dict[str, dict], links: list[tuple[str, str, float, float, str]],
               efficiency: dict[str, float]) -> nx.DiGraph:
    """The graph ``add_nodes_from(nodes.items())`` then ``add_edges_from`` of both directions of
    each (a, b, bandwidth, latency, kind) with :func:`edge_attrs` makes, nodes and edges in the
    same order, written straight into its adjacency dicts: the generic inserts check and merge
    every edge (a third of a 131,072-GPU run's 10^6 edges). Every edge is new and between known
    nodes; links alike share their attributes' values, each edge has its own dict."""
    g = nx.DiGraph()
    node, succ, pred = g._node, g._succ, g._pred
    for name, attrs in nodes.items():
        node[name] = attrs
        succ[name] = {}
        pred[name] = {}
    alike: dict[tuple, dict] = {}
    for a, b, bw, lat, kind in links:
        # A link's class, hence its attributes, depends on its kind and on whether it is a spine link.
        key = (bw, lat, kind, "spine" in (a, b))
        attrs = alike.get(key)
        if attrs is None:
            attrs = alike[key] = edge_attrs(a, b, bw, lat, kind, efficiency)
        succ[a][b] = pred[b][a] = attrs.copy()
        succ[b][a] = pred[a][b] = attrs.copy()
    return g


def build_cluster(spec: ClusterSpec, path: Path, num_gpus: int, capacity_log2: float, remote_bandwidth_gbps: float,
                  network: str, collective_algo: str, collective_latency_us: float | None):
    """The platform of a ``kind: cluster`` file with ``num_gpus`` GPUs: whole nodes, or part of
    one node (2 of a DGX's 8 GPUs, on its NVSwitch)."""
    per = spec.gpus_per_node
    if num_gpus % per and num_gpus > per:
        raise ConfigError(f"{path}: -GPUnumber {num_gpus} is not a whole number of nodes of {per} GPUs "
                          f"(fewer than {per} run on part of one node)")
    nodes_count = -(-num_gpus // per)
    units = -(-nodes_count // spec.nodes_per_leaf)
    # Both directions of: GPU-remote memory, GPU-NVSwitch, GPU-leaf, and each leaf's uplink.
    check_link_count(2 * (3 * num_gpus + (units * per if units > 1 else 0)), num_gpus,
                     f"{path}: nodes of {per} GPU{'s' if per > 1 else ''}")
    remote = (spec.remote_bandwidth_gbps or remote_bandwidth_gbps) * GB
    # A GPU's NICs are one link of their summed bandwidth to its rail's leaf: traffic is striped
    # evenly over them (NCCL spreads its channels over a GPU's NICs), and the leaf has that many
    # more ports, so its uplink widens with them.
    nic_bw, nv_bw = spec.nics_per_gpu * spec.nic.bandwidth_gbps * GB, spec.nvlink.bandwidth_gbps * GB
    # Collectives reach only a share of each link's nominal rate (the file's ``efficiency``).
    efficiency = spec.efficiency()
    # A switch offering NVLink SHARP carries the share of the NVLink rate NVLS reaches
    # (triosim.graph.collectives.nvls_cost); the attribute is absent otherwise.
    sharp = {} if spec.nvlink_sharp_efficiency is None else {"sharp_efficiency": spec.nvlink_sharp_efficiency}
    gpus = [gpu_node(i) for i in range(num_gpus)]
    nodes: dict[str, dict] = {name: {"kind": "gpu"} for name in gpus}
    nodes[REMOTE] = {"kind": "remote"}
    links = [(name, REMOTE, remote, 0.0, "pcie") for name in gpus]
    nv_lat, nic_lat, npl = spec.nvlink.latency_us * 1e-6, spec.nic.latency_us * 1e-6, spec.nodes_per_leaf
    for i, name in enumerate(gpus):
        node, rail = divmod(i, per)
        switch, leaf = f"nvsw{node}", f"leaf{node // npl}r{rail}"
        if switch not in nodes:
            nodes[switch] = {"kind": "switch", **sharp}
        links.append((name, switch, nv_bw, nv_lat, "nvlink"))
        if leaf not in nodes:
            nodes[leaf] = {"kind": "switch"}
        links.append((name, leaf, nic_bw, nic_lat, "net"))
    if units > 1:
        nodes["spine"] = {"kind": "switch"}
        for su in range(units):
            in_unit = min(npl, nodes_count - su * npl)
            # A leaf's uplinks carry its downlinks' bandwidth divided by the oversubscription.
            up = in_unit * nic_bw / spec.oversubscription
            for rail in range(per):
                links.append((f"leaf{su}r{rail}", "spine", up, spec.spine_latency_us * 1e-6, "net"))
    g = link_graph(nodes, links, efficiency)
    return Platform(
        num_gpus=num_gpus, capacity_bytes=int(2**capacity_log2), graph=g, ring=tuple(range(num_gpus)),
        topology=spec.name, remote_bandwidth=remote, ptp_bandwidth=nv_bw, ptp_bandwidth_nominal=nv_bw,
        network=network, collective_algo=collective_algo, collective_latency_us=collective_latency_us,
        node_of=tuple(i // per for i in range(num_gpus)), channel_style="rails",
        router=ClusterRouter(per, spec.nodes_per_leaf), link_efficiency=spec.efficiency(),
    )
