"""Achieved link bandwidth: the share of a link's nominal rate that collectives reach, per link class.

NCCL never moves data at a link's nominal rate: protocol headers, flow control, the proxy thread
and the GPU's copy engines cost a share of it. nccl-tests measure that share as the bus bandwidth
("busbw") of large all-reduces; it is a property of the link class, not of the run, so it is a
device-level number kept with the topology (``efficiency`` in a topology file's ``nvlink``,
``nic`` and ``spine`` mappings) and overridable with ``--link-efficiency``.

Link classes (``LINK_CLASSES``): ``nvlink`` (a GPU's NVLink/NVSwitch port, or a GPU↔GPU link of a
flag-built topology), ``nic`` (a GPU's network port to its leaf switch) and ``spine`` (a leaf's
uplink). GPU↔remote-memory links (``pcie``) carry no collective and keep their rate.

A link's ``bandwidth`` is nominal × efficiency; its ``nominal_bandwidth`` and ``efficiency`` stay
on the link, so the flag can replace the file's values and the report can show both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import networkx as nx

from ..errors import ConfigError
from .platform import Platform

LINK_CLASSES = ("nvlink", "nic", "spine")
# Defaults of a ``kind: cluster`` file that gives no ``efficiency``, from nccl-tests' published
# all-reduce bus bandwidth (see docs/collectives.md, "Achieved bandwidth"): NVLink/NVSwitch
# reaches about 80 % of its per-direction rate (DGX A100 ≈ 230 of 300 GB/s, DGX H100 ≈ 370 of
# 450 GB/s), an InfiniBand port about 92 % (HDR ≈ 23 of 25 GB/s, NDR ≈ 46 of 50 GB/s).
DEFAULT_CLUSTER_EFFICIENCY = {"nvlink": 0.8, "nic": 0.92, "spine": 0.92}


def check_efficiency(value: object, where: str) -> float:
    """``value`` as an efficiency: a number with 0 < e ≤ 1, else a one-line error naming ``where``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not 0 < value <= 1:
        raise ConfigError(f"{where} must be a number with 0 < efficiency <= 1, got {value!r}")
    return float(value)


def link_class(a: str, b: str, kind: str) -> str | None:
    """The class of the directed link ``a -> b`` of ``kind`` (None: not a collective link)."""
    if kind == "pcie":
        return None
    if kind == "net":
        return "spine" if "spine" in (a, b) else "nic"
    return "nvlink"


def scale_links(graph: nx.DiGraph, efficiency: Mapping[str, float]) -> None:
    """Set every collective link's bandwidth to nominal × its class's efficiency (in place; a
    class not in ``efficiency`` keeps the link's current efficiency, 1 at first)."""
    for a, b, attrs in graph.edges(data=True):
        cls = link_class(a, b, attrs.get("kind", "nvlink"))
        if cls is None:
            continue
        nominal = attrs.setdefault("nominal_bandwidth", attrs["bandwidth"])
        eff = efficiency.get(cls, attrs.get("efficiency", 1.0))
        attrs["efficiency"] = eff
        attrs["bandwidth"] = nominal * eff


def with_link_efficiency(platform: Platform, efficiency: Mapping[str, float]) -> Platform:
    """A copy of ``platform`` whose links of the given classes run at nominal × efficiency."""
    if not efficiency:
        return platform
    graph = platform.graph.copy()
    scale_links(graph, efficiency)
    merged = {**platform.link_efficiency, **efficiency}
    return replace(platform, graph=graph, link_efficiency=merged, _routes={}, _route_params={},
                   _routes_graph={}, _route_kinds={}, _plans={}, _variants={})


__all__ = ["DEFAULT_CLUSTER_EFFICIENCY", "LINK_CLASSES", "check_efficiency", "link_class", "scale_links",
           "with_link_efficiency"]
