"""Topologies as data: read a cluster description from a YAML file (``--topology-file``).

Two kinds of file:

- ``kind: preset`` names a built-in topology (``topology: ring``, ``fully-connected``,
  ``switch``, ``mesh``, ``nvlink-cluster``) with its link bandwidths, i.e. the same platform
  the command-line flags build (``topologies/ring.yaml`` is the default platform).
- ``kind: cluster`` describes a GPU cluster: nodes of ``gpus_per_node`` GPUs joined by an
  NVSwitch (``nvlink``), ``nics_per_gpu`` NICs per GPU (striped: one link of their summed
  bandwidth to the GPU's rail), rail-optimized leaf
  switches (``leaf``: every scalable unit of ``nodes_per_leaf`` nodes has one leaf per rail) and
  one spine layer (``spine``) whose leaf uplinks are ``oversubscription``:1 narrower than the
  NIC ports below them. Routes take the cheapest path (NVLink 1, a NIC hop 2, a leaf↔spine hop
  4), so traffic between rails crosses NVLink to the rail's GPU first, as NCCL's PXN does.

Bandwidths are GB/s per direction, latencies µs per link. ``nvlink``, ``nic`` and ``spine`` may
give an ``efficiency`` (0 < e ≤ 1): the share of the nominal bandwidth NCCL achieves on that link
class (defaults :data:`~triosim.hardware.link_efficiency.DEFAULT_CLUSTER_EFFICIENCY`). ``nvlink`` may
say ``sharp: true``: the node's NVLink switch reduces and multicasts in the switch (NVLink SHARP,
NCCL's NVLS algorithm), reaching ``sharp_efficiency`` of the nominal rate (default: the link's
``efficiency``). The GPU count comes from ``-GPUnumber``; ``gpus`` in the file, if present, must
agree with it.

The file is read by :func:`triosim.safe_yaml.load_yaml_file` (at most 1 MiB, nested at most 32
deep, 100,000 values with aliases expanded, no key twice). Every field is checked here: an
unknown key, at the top or inside ``nvlink``/``nic``/``leaf``/``spine``, is an error with the
closest known key; every number must be finite and inside the range of :data:`RANGES` (a
400-digit integer is "too large", never an OverflowError). Only a bare name (``ring``,
``ring.yaml``) may mean a shipped file; a path with a directory must exist.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..limits import MAX_GPUS
from ..safe_yaml import load_yaml_file
from ..shipped_files import package_dir, resolve_shipped
from .link_efficiency import DEFAULT_CLUSTER_EFFICIENCY

KINDS = ("preset", "cluster")
PRESET_KEYS = {"kind", "name", "description", "source", "gpus", "topology", "ptp_bandwidth_gbps",
               "remote_bandwidth_gbps", "link_latency_us", "gpus_per_node", "node_bandwidth_gbps",
               "num_rows", "num_cols", "interconnects"}
CLUSTER_KEYS = {"kind", "name", "description", "source", "gpus", "gpus_per_node", "nvlink", "nics_per_gpu", "nic",
                "leaf", "spine", "remote_bandwidth_gbps"}
LINK_KEYS = {"bandwidth_gbps", "latency_us", "efficiency"}
NESTED_KEYS = {"nvlink": LINK_KEYS | {"sharp", "sharp_efficiency"}, "nic": LINK_KEYS, "leaf": {"nodes_per_leaf"},
               "spine": {"oversubscription", "latency_us", "efficiency"}}

# The largest value each field may take (the smallest is 0 or just above it). Far above any
# real cluster, and low enough that products of them stay finite and exact.
MAX_BANDWIDTH_GBPS = 1e9  # 1 EB/s per link
MAX_LATENCY_US = 1e9  # 1,000 s per link (the --link-latency-us limit)
RANGES = {
    "bandwidth_gbps": MAX_BANDWIDTH_GBPS, "ptp_bandwidth_gbps": MAX_BANDWIDTH_GBPS,
    "remote_bandwidth_gbps": MAX_BANDWIDTH_GBPS, "node_bandwidth_gbps": MAX_BANDWIDTH_GBPS,
    "latency_us": MAX_LATENCY_US, "link_latency_us": MAX_LATENCY_US,
    "gpus": MAX_GPUS, "gpus_per_node": MAX_GPUS, "nodes_per_leaf": MAX_GPUS, "num_rows": MAX_GPUS,
    "num_cols": MAX_GPUS, "nics_per_gpu": 64, "oversubscription": 1024, "interconnects": 1,
    "efficiency": 1,  # achieved share of the nominal rate (triosim.hardware.link_efficiency)
    "sharp_efficiency": 1,  # the same for NVLink SHARP collectives (NCCL's NVLS)
}


def _unknown_key(where: str, key: object, allowed: set[str], what: str = "") -> ConfigError:
    """An unknown key, with the closest known one when there is one."""
    close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    what = f" {what}" if what else ""
    return ConfigError(f"{where}: unknown field {key!r}{what} (known: {', '.join(sorted(allowed))}){hint}")


@dataclass(frozen=True)
class LinkSpec:
    bandwidth_gbps: float
    latency_us: float = 0.0
    efficiency: float = 1.0  # achieved share of bandwidth_gbps (see triosim.hardware.link_efficiency)


@dataclass(frozen=True)
class ClusterSpec:
    """A ``kind: cluster`` file, checked."""

    name: str
    gpus_per_node: int
    nvlink: LinkSpec
    nics_per_gpu: int
    nic: LinkSpec
    nodes_per_leaf: int
    oversubscription: float
    spine_latency_us: float
    remote_bandwidth_gbps: float | None
    gpus: int | None
    spine_efficiency: float = DEFAULT_CLUSTER_EFFICIENCY["spine"]
    # The NVLink switch's SHARP (in-switch reduction and multicast): the share of the nominal
    # NVLink rate NCCL's NVLS algorithm reaches; None: the switch offers no SHARP.
    nvlink_sharp_efficiency: float | None = None

    def efficiency(self) -> dict[str, float]:
        """The achieved share of nominal bandwidth per link class."""
        return {"nvlink": self.nvlink.efficiency, "nic": self.nic.efficiency, "spine": self.spine_efficiency}


def packaged_dir() -> Path:
    """Where the shipped topology files live (the ``triosim.topologies`` package's folder)."""
    return package_dir("triosim.topologies")


def resolve(path: str | Path) -> Path:
    """``path`` as given if it exists, else, for a bare name only (``ring``, ``ring.yaml``: no
    directory in it), a shipped file of that name (with or without ``.yaml``). A path naming a
    directory (``/nonexistent/ring.yaml``) never falls back to the shipped file of its name."""
    return resolve_shipped(path, "triosim.topologies", "--topology-file", "topologies")


def read(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The file's mapping; a clear error if pyyaml is missing or the YAML is bad."""
    p = resolve(path)
    data = load_yaml_file(p, "topology file")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of settings at the top level")
    kind = data.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{p}: field 'kind' must be preset or cluster, got {kind!r}")
    allowed = PRESET_KEYS if kind == "preset" else CLUSTER_KEYS
    unknown = sorted(map(str, set(data) - allowed))
    if unknown:
        raise _unknown_key(str(p), unknown[0], allowed, f"for kind {kind}")
    for key, keys in NESTED_KEYS.items():
        sub = data.get(key)
        if key in allowed and isinstance(sub, dict):
            bad = sorted(map(str, set(sub) - keys))
            if bad:
                raise _unknown_key(f"{p}: {key}", bad[0], keys)
    return p, data


def _shown(value: object) -> str:
    """A value for an error message: a huge integer by its digit count, not 400 digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        try:
            return f"an integer of {len(str(abs(value)))} digits"
        except ValueError:  # over Python's 4,300-digit conversion limit
            return f"an integer of about {int(abs(value).bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number(p: Path, data: dict, key: str, default: Any = None, positive: bool = True, integer: bool = False) -> Any:
    if key not in data:
        if default is None:
            raise ConfigError(f"{p}: missing field {key!r}")
        return default
    value = data[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and integer:
        # An int of 400 digits is whole; float() of it would raise OverflowError.
        ok = isinstance(value, int) or (math.isfinite(value) and value.is_integer())
    if ok:
        ok = (value > 0) if positive else (value >= 0)
        ok = ok and (isinstance(value, int) or math.isfinite(value))
    if not ok:
        need = "a positive" if positive else "a non-negative"
        raise ConfigError(f"{p}: field {key!r} must be {need} {'integer' if integer else 'number'}, got {_shown(value)}")
    high = RANGES.get(key)
    if high is not None and value > high:
        raise ConfigError(f"{p}: field {key!r} must be <= {int(high):,}, got {_shown(value)}")
    return int(value) if integer else float(value)


def _link(p: Path, data: dict, key: str) -> LinkSpec:
    sub = data.get(key)
    if not isinstance(sub, dict):
        raise ConfigError(f"{p}: field {key!r} must be a mapping with bandwidth_gbps (and latency_us)")
    q = Path(f"{p}: {key}")
    return LinkSpec(_number(q, sub, "bandwidth_gbps"), _number(q, sub, "latency_us", 0.0, positive=False),
                    _number(q, sub, "efficiency", DEFAULT_CLUSTER_EFFICIENCY[key]))


def _sharp(p: Path, data: dict, nvlink: LinkSpec) -> float | None:
    """The ``nvlink`` mapping's SHARP efficiency (``sharp: true``), or None without SHARP."""
    sub = data.get("nvlink")
    q = Path(f"{p}: nvlink")
    sharp = sub.get("sharp", False)
    if not isinstance(sharp, bool):
        raise ConfigError(f"{q}: field 'sharp' must be true or false, got {_shown(sharp)}")
    if not sharp:
        if "sharp_efficiency" in sub:
            raise ConfigError(f"{q}: field 'sharp_efficiency' needs 'sharp: true'")
        return None
    return _number(q, sub, "sharp_efficiency", nvlink.efficiency)


def cluster_spec(p: Path, data: dict) -> ClusterSpec:
    leaf = data.get("leaf", {})
    spine = data.get("spine", {})
    if not isinstance(leaf, dict) or not isinstance(spine, dict):
        raise ConfigError(f"{p}: fields 'leaf' and 'spine' must be mappings")
    nvlink = _link(p, data, "nvlink")
    return ClusterSpec(
        name=str(data.get("name", p.stem)),
        gpus_per_node=_number(p, data, "gpus_per_node", integer=True),
        nvlink=nvlink,
        nics_per_gpu=_number(p, data, "nics_per_gpu", 1, integer=True),
        nic=_link(p, data, "nic"),
        nodes_per_leaf=_number(Path(f"{p}: leaf"), leaf, "nodes_per_leaf", integer=True),
        oversubscription=_number(Path(f"{p}: spine"), spine, "oversubscription", 1.0),
        spine_latency_us=_number(Path(f"{p}: spine"), spine, "latency_us", 0.0, positive=False),
        remote_bandwidth_gbps=_number(p, data, "remote_bandwidth_gbps") if "remote_bandwidth_gbps" in data else None,
        gpus=_number(p, data, "gpus", integer=True) if "gpus" in data else None,
        spine_efficiency=_number(Path(f"{p}: spine"), spine, "efficiency", DEFAULT_CLUSTER_EFFICIENCY["spine"]),
        nvlink_sharp_efficiency=_sharp(p, data, nvlink),
    )


def preset_arguments(p: Path, data: dict) -> dict[str, Any]:
    """``build_platform`` keyword arguments of a ``kind: preset`` file."""
    out: dict[str, Any] = {"topology": data.get("topology", "ring")}
    for key, arg in (("ptp_bandwidth_gbps", "ptp_bandwidth_gbps"), ("remote_bandwidth_gbps", "bandwidth_gbps"),
                     ("node_bandwidth_gbps", "node_bandwidth_gbps")):
        if key in data:
            out[arg] = _number(p, data, key)
    if "link_latency_us" in data:
        out["link_latency_us"] = _number(p, data, "link_latency_us", positive=False)
    for key in ("gpus_per_node", "num_rows", "num_cols"):
        if key in data:
            out[key] = _number(p, data, key, integer=True)
    if "interconnects" in data:
        out["interconnects"] = int(_number(p, data, "interconnects", positive=False, integer=True))
    return out


def check(path: str | Path) -> Path:
    """Read and check a topology file without building it: its YAML, keys and every number
    (what a run that simulates one GPU does with a ``--topology-file`` it does not use, so that
    a bad file is an error whatever the case)."""
    from .platform import TOPOLOGIES

    where, data = read(path)
    if "gpus" in data:
        _number(where, data, "gpus", integer=True)
    if data["kind"] == "cluster":
        cluster_spec(where, data)
        return where
    topology = preset_arguments(where, data)["topology"]
    if topology not in TOPOLOGIES:
        raise ConfigError(f"{where}: field 'topology' must be one of {', '.join(TOPOLOGIES)}, got {_shown(topology)}")
    return where


__all__ = ["ClusterSpec", "LinkSpec", "check", "cluster_spec", "packaged_dir", "preset_arguments", "read", "resolve"]
