"""Transformer Engine's per-GEMM userbuffer settings for ``--tp-comm-overlap``: which method
overlaps each sequence-parallel collective with its GEMM and how many SMs it takes.

Transformer Engine names ten GEMMs of a transformer layer (``initialize_ub`` in
``transformer_engine/pytorch/module/base.py``): the column linears' forward (``qkv_fprop``,
``fc1_fprop``) and the row linears' input-gradient GEMMs (``proj_dgrad``, ``fc2_dgrad``) follow an
all-gather; the row linears' forward (``proj_fprop``, ``fc2_fprop``) precede a reduce-scatter; the
column linears' backward GEMMs (``qkv_dgrad``, ``qkv_wgrad``, ``fc1_dgrad``, ``fc1_wgrad``) run
beside the re-gather of their input and the reduce-scatter of its gradient. Each gets TE's default
(``get_default_config``) updated by the entries of a table (Megatron-LM's ``--tp-comm-overlap-cfg``
YAML file, Megatron-Bridge's ``tp_comm_overlap_cfg``):

- ``method``: ``ring_exchange`` (the GEMM in ``tp`` chunks, point-to-point sends of one chunk at a
  time by the copy engines) for the all-gather GEMMs, ``pipeline`` (the GEMM in ``num_splits``
  chunks, each chunk's reduce-scatter by userbuffer kernels on ``num_sm`` SMs) for the
  reduce-scatter ones, ``bulk`` (one collective beside the whole GEMM) for the backward ones. A
  reduce-scatter GEMM may also run by ``ring_exchange``: the GEMM in ``tp`` chunks, each chunk's
  partial output sent to the rank that owns it while the next chunk runs, then one kernel sums the
  ``tp`` partial chunks a rank holds.
- ``num_sm``: the SMs the communication kernels take (defaults: 1 for ring exchange, 16 otherwise).
- ``set_sm_margin`` (default: on except for ring exchange): the GEMM is launched on the GPU's SMs
  less ``num_sm`` for its whole run (cuBLAS's SM-count target), so it runs ``N / (N - num_sm)`` of
  its time and the communication kernels take none of its SMs while they run; off, the two share
  the SMs while both run (the scheduler's SM sharing).
- ``num_splits``: the pipelined method's chunks (default 4). ``cga_size``, ``fp8_buf``, ``use_ce``
  and the stream priorities change no time here; ``aggregate`` and ``atomic_gemm`` are refused
  (not modelled).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...compute.op_cost import OpCost
from ...compute.op_time_source import gpu_timing
from ...compute.roofline import Precision, roofline_seconds
from ...errors import ConfigError
from ...hardware.device_db import Device

ALL_GATHER_GEMMS = ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad")
REDUCE_SCATTER_GEMMS = ("proj_fprop", "fc2_fprop")
BULK_GEMMS = ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")
GEMMS = ALL_GATHER_GEMMS + REDUCE_SCATTER_GEMMS + BULK_GEMMS
# The methods triosim models for each GEMM (TE's default first)
METHODS = {**{n: ("ring_exchange",) for n in ALL_GATHER_GEMMS},
           **{n: ("pipeline", "ring_exchange") for n in REDUCE_SCATTER_GEMMS},
           **{n: ("bulk",) for n in BULK_GEMMS}}
# Keys of a TE userbuffer entry that change no time in this model
TIMELESS_KEYS = frozenset({"cga_size", "fp8_buf", "use_ce", "comm_priority", "gemm_priority",
                           "pipeline_rs_overlap_first_gemm", "is_reduce_scatter"})
KEYS = frozenset({"method", "num_sm", "num_splits", "set_sm_margin", "aggregate", "atomic_gemm"}) | TIMELESS_KEYS


@dataclass(frozen=True)
class UserbufferSetting:
    """One GEMM's overlap: its method, the SMs its communication takes, whether the GEMM leaves
    them free for its whole run, and the pipelined method's chunks."""

    method: str
    num_sm: int
    set_sm_margin: bool
    num_splits: int = 4

    def margin(self) -> int:
        """The SMs the GEMM leaves to its communication for its whole run (0: none)."""
        return self.num_sm if self.set_sm_margin else 0

    def comm_sms(self) -> int:
        """The SMs the communication kernels take from a GEMM running beside them: none when the
        GEMM already left them free."""
        return 0 if self.set_sm_margin else self.num_sm


def te_default(name: str) -> UserbufferSetting:
    """Transformer Engine's default for GEMM ``name`` (``get_default_config``)."""
    method = METHODS[name][0]
    ring = method == "ring_exchange"
    return UserbufferSetting(method, 1 if ring else 16, not ring, 4)


@dataclass(frozen=True)
class UserbufferTable:
    """Every GEMM's setting (TE's defaults, updated by a table) and where the table came from."""

    settings: tuple[tuple[str, UserbufferSetting], ...]
    source: str | None = None

    def __getitem__(self, name: str) -> UserbufferSetting:
        return dict(self.settings)[name]

    def changed(self) -> dict[str, UserbufferSetting]:
        """The GEMMs whose setting is not TE's default."""
        return {n: s for n, s in self.settings if s != te_default(n)}


DEFAULT_TABLE = UserbufferTable(tuple((n, te_default(n)) for n in GEMMS))


def userbuffer_table(entries: Any, source: str = "--tp-comm-overlap-cfg") -> UserbufferTable:
    """TE's defaults updated by ``entries`` (GEMM name -> its keys, as Megatron-LM's
    ``--tp-comm-overlap-cfg`` YAML file holds them); ``source`` starts every error message."""
    if entries is None:
        entries = {}
    if not isinstance(entries, Mapping):
        raise ConfigError(f"{source}: must map GEMM names ({', '.join(GEMMS)}) to their settings")
    out = dict(DEFAULT_TABLE.settings)
    for name, keys in entries.items():
        if name not in METHODS:
            raise ConfigError(f"{source}: {name}: not a userbuffer GEMM (one of {', '.join(GEMMS)})")
        out[name] = _setting(name, keys, f"{source}: {name}")
    return UserbufferTable(tuple((n, out[n]) for n in GEMMS), source if entries else None)


def _setting(name: str, keys: Any, where: str) -> UserbufferSetting:
    """GEMM ``name``'s default updated by ``keys`` (TE: ``ub_cfg.update(ub_cfgs[name])``)."""
    if keys is None:
        keys = {}
    if not isinstance(keys, Mapping):
        raise ConfigError(f"{where}: must map setting names (method, num_sm, num_splits, set_sm_margin, ...) "
                          "to values")
    for key in keys:
        if key not in KEYS:
            raise ConfigError(f"{where}: {key}: not a userbuffer setting (one of {', '.join(sorted(KEYS))})")
    default = te_default(name)
    method = keys.get("method", default.method)
    if method not in METHODS[name]:
        raise ConfigError(f"{where}: method {method!r} is not modelled for this GEMM (it takes "
                          f"{' or '.join(METHODS[name])})")
    for key in ("aggregate", "atomic_gemm"):
        if _flag(keys.get(key, False), f"{where}: {key}"):
            raise ConfigError(f"{where}: {key}: true is not modelled (leave it false)")
    num_sm = _count(keys.get("num_sm", default.num_sm), f"{where}: num_sm", low=0)
    splits = _count(keys.get("num_splits", default.num_splits), f"{where}: num_splits", low=1)
    margin = _flag(keys.get("set_sm_margin", default.set_sm_margin), f"{where}: set_sm_margin")
    return UserbufferSetting(method, num_sm, margin, splits)


def gemm_slowdown(trace, strategy, network: str = "flow") -> tuple[Device | None, Callable[[int], float]]:
    """The run's device (None without ``--gpu``) and the factor by which a GEMM left ``m`` SMs
    short runs longer: ``N / (N - m)`` where SMs are shared at all (a device file giving its SM
    count and the SMs a collective takes, the flow network, not ``--reference-compat``), else 1."""
    timing = gpu_timing(trace)
    device = timing.device if timing is not None else None
    n = device.sm_count if device is not None and device.sm_count and device.collective_sms \
        and network == "flow" and not getattr(strategy, "reference_compat", False) else 0

    def slow(m: int) -> float:
        return n / (n - min(m, n - 1)) if n and m else 1.0
    return device, slow


def partial_sum_seconds(chunk_bytes: int, parts: int, device: Device | None) -> float:
    """The kernel that ends a ring-exchange reduce-scatter: ``parts`` partial chunks of
    ``chunk_bytes`` (bf16) read, their sum written, timed by ``device``'s roofline (memory-bound);
    0 without a device to time it on."""
    if device is None or chunk_bytes <= 0:
        return 0.0
    elements = chunk_bytes / 2
    cost = OpCost((parts - 1) * elements, float(parts * chunk_bytes), float(chunk_bytes), "partial_sum",
                  "elementwise", "bf16")
    return roofline_seconds(cost, device, Precision())


def _count(value: Any, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 4096:
        raise ConfigError(f"{where}: must be an integer from {low} to 4096, got {value!r}")
    return value


def _flag(value: Any, where: str) -> bool:
    # TE's tables write flags as Python booleans or 0/1 (Megatron-Bridge's PipelineOverlapCfg
    # defaults fp8_buf to a one-element tuple, which is timeless here)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{where}: must be true or false, got {value!r}")


__all__ = ["ALL_GATHER_GEMMS", "BULK_GEMMS", "DEFAULT_TABLE", "GEMMS", "METHODS", "REDUCE_SCATTER_GEMMS",
           "UserbufferSetting", "UserbufferTable", "gemm_slowdown", "partial_sum_seconds", "te_default",
           "userbuffer_table"]
