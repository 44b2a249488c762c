"""The platform from the seed flags: ring, fully connected, switch, optical mesh, NVLink cluster,
or a topology file (a preset's flags, or a ``kind: cluster`` file built by :mod:`.cluster`)."""

from __future__ import annotations

import networkx as nx

from ..checks import flag_number, positive
from ..errors import ConfigError
from ..limits import check_link_count
from . import topology_file as tf
from .cluster import build_cluster
from .link_efficiency import LINK_CLASSES, with_link_efficiency
from .platform import (
    GB,
    MAX_LINK_LATENCY_US,
    REMOTE,
    TOPOLOGIES,
    Platform,
    add_link,
    check_network_settings,
    gpu_node,
    snake_order,
)


def _from_file(path: str, num_gpus: int, capacity_log2: float, bandwidth_gbps: float, reference_compat: bool,
               network: str, collective_algo: str, collective_latency_us: float | None) -> Platform:
    """A platform described by a topology file (see :mod:`triosim.hardware.topology_file`)."""
    where, data = tf.read(path)
    if "gpus" in data and tf._number(where, data, "gpus", integer=True) != num_gpus:
        raise ConfigError(f"{where}: field 'gpus' is {data['gpus']}, but -GPUnumber is {num_gpus}")
    if data["kind"] == "preset":
        kwargs = {"bandwidth_gbps": bandwidth_gbps, **tf.preset_arguments(where, data)}
        return build_platform(num_gpus, capacity_log2=capacity_log2, reference_compat=reference_compat,
                              network=network, collective_algo=collective_algo,
                              collective_latency_us=collective_latency_us, **kwargs)
    platform = build_cluster(tf.cluster_spec(where, data), where, num_gpus, capacity_log2, bandwidth_gbps,
                             network, collective_algo, collective_latency_us)
    if reference_compat:  # the original's network: every link at its nominal rate
        platform = with_link_efficiency(platform, dict.fromkeys(LINK_CLASSES, 1.0))
    return platform


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
    capacity_bytes: int | None = None,
) -> Platform:
    """Build the platform from the seed flags (see the README's flag table).

    ``nvlink-cluster``: nodes of ``gpus_per_node`` GPUs; inside a node every GPU reaches an
    NVSwitch (``nvswK``) at ``ptp_bandwidth``; every GPU also has its own NIC to the cluster
    network switch (``net``) at ``node_bandwidth`` (rail-style, one NIC per GPU).

    ``reference_compat`` implies the original's network: exclusive links, the one-way ring and
    no collective latency, whatever the other network arguments say.

    ``capacity_bytes``: each GPU's memory in bytes (a device's), instead of 2^``capacity_log2``
    (which is still checked).
    """
    if capacity_bytes is not None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 1:
            raise ConfigError(f"GPU memory capacity must be a positive number of bytes, got {capacity_bytes!r}")
        platform = build_platform(num_gpus, capacity_log2, bandwidth_gbps, ptp_bandwidth_gbps, interconnects,
                                  num_rows, num_cols, topology, link_latency_us, reference_compat, gpus_per_node,
                                  node_bandwidth_gbps, network, collective_algo, collective_latency_us, topology_file)
        platform.capacity_bytes = capacity_bytes  # a fresh platform: nothing was planned with the old one
        return platform
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
        add_link(g, gpu_node(i), REMOTE, remote_bw, 0.0 if reference_compat else latency, kind="pcie")
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
                    add_link(g, me, gpu_node(r * cols + c + 1), ptp_bw, hop)
                if r + 1 < rows:
                    add_link(g, me, gpu_node((r + 1) * cols + c), ptp_bw, hop)
        ring = snake_order(rows, cols)
        name = "optical-mesh"
        style = "bidirectional"
    elif topology == "fully-connected":
        check_link_count(num_gpus * (num_gpus - 1), num_gpus, "--topology fully-connected")
        for i in range(num_gpus):
            for j in range(i + 1, num_gpus):
                add_link(g, gpu_node(i), gpu_node(j), ptp_bw, latency)
        ring = tuple(range(num_gpus))
        name = topology
        style = "strides"
    elif topology == "switch":
        g.add_node("switch", kind="switch")
        for i in range(num_gpus):
            add_link(g, gpu_node(i), "switch", ptp_bw, latency)
        ring = tuple(range(num_gpus))
        name = topology
        style = "single"
    elif topology == "nvlink-cluster":
        g.add_node("net", kind="switch")
        for i in range(num_gpus):
            node = i // gpus_per_node
            g.add_node(f"nvsw{node}", kind="switch")
            add_link(g, gpu_node(i), f"nvsw{node}", ptp_bw, latency, cost=1)
            add_link(g, gpu_node(i), "net", node_bandwidth_gbps * GB, latency, cost=2, kind="net")
        ring = tuple(range(num_gpus))
        name = topology
        node_of = tuple(i // gpus_per_node for i in range(num_gpus))
        style = "rails"
    else:
        for i in range(num_gpus if num_gpus > 2 else num_gpus - 1):
            add_link(g, gpu_node(i), gpu_node((i + 1) % num_gpus), ptp_bw, latency)
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
