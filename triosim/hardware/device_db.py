"""The GPU device database: peak rates, memory and efficiency curves, one YAML file per device.

A device file (``triosim/hardware/device_data/<name>.yaml``, or a user's own file of the same
schema) holds what the roofline op-time model needs to know about a GPU:

- ``matrix_tflops``: DENSE peak of the matrix units (tensor cores, AMD matrix cores) per dtype
  (``fp64``, ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``; the vendor's figures *without*
  2:4 sparsity). On NVIDIA parts there is no fp32 tensor-core mode: ``fp32`` there is the
  SGEMM rate of the CUDA cores, the same as the vector figure.
- ``vector_tflops``: peak of the vector (non-tensor) units; ``fp32`` is required.
- ``hbm_gbps`` (10^9 B/s), ``memory_gb`` (the vendor's capacity in 10^9 bytes, taken literally:
  a little under the physical binary size, which leaves room for the CUDA context),
  ``launch_floor_us`` (the shortest time any op takes: launch and tail).
- ``efficiency``: achieved fraction of peak, ``compute`` as a function of an op's FLOPs (with
  optional ``compute_by_dtype`` curves for dtypes whose kernels behave differently) and
  ``memory`` as a function of the bytes it moves, as tables of ``[x, fraction]`` points
  interpolated linearly in log(x) and held constant past either end. A curve may instead be
  written ``{interpolation: step, points: [...]}``: the fraction of the largest point at or
  below x (the first point's below it), which is how Calculon reads its ``gflops_efficiency`` /
  ``MB_efficiency`` tables. Optional ``vector``: the curve for vector-unit ops (elementwise,
  norms, softmax) when they differ from the matrix units; without it they use the compute
  curves. Optional ``attention``: measured fused-attention curves per head size, direction and
  mask (:mod:`triosim.hardware.attention_curves`). They are device-level defaults, to be
  calibrated on measured traces; ``efficiency.source`` says where their shape comes from.
- optional ``processing_mode``: ``roofline`` (the default: an op's time is the larger of its
  compute and memory times, the two overlap) or ``no_overlap`` (their sum, as Calculon's
  system files may say: a kernel that does not hide its memory traffic behind its math).
- optional ``node_fabric``: the shipped topology file (``topologies/<name>.yaml``) of the system
  the GPU is sold in, with ``sources.node_fabric``; ``--gpu NAME`` without a topology runs on it.
- optional ``fp8_recipes``: the FP8 training recipes of Transformer Engine the GPU runs
  (``delayed``, ``current``, ``blockwise``, ``mxfp8``), with ``sources.fp8_recipes``; without it a
  GPU with an fp8 matrix peak runs the per-tensor ones (delayed, current). A GPU that runs
  ``mxfp8`` (Blackwell, SM 10.0+) is the default's MXFP8 and reads FP8 operands columnwise without
  a transposed copy ("Blackwell hardware supports multiple GEMM layouts natively"), as
  :mod:`triosim.trace.fp8` describes.
- ``sources``: the public document behind every peak number (one entry per peak field).
- optional, for kernels whose parallelism the op's shape limits (cuDNN's training batch norm
  runs one thread block per channel): ``sm_count`` (streaming multiprocessors, from the spec
  sheet) and ``block_read_gbps`` (the rate at which ONE thread block alone on an SM reads a
  contiguous slice: bound by its loads in flight and the memory latency, not by HBM bandwidth;
  calibrated, its origin in ``sources.block_read_gbps``). Without both, no such limit applies.
- optional ``collective_sms``: the SMs one NCCL collective or send takes from the GPU's compute
  while it runs (one CUDA block per channel, each on an SM of its own), with
  ``sources.collective_sms``; with ``sm_count`` it turns on SM sharing in the scheduler
  (:mod:`triosim.schedule.sm_sharing`). Without it, communication takes no SMs.
- optional ``host_link_gbps``: GB/s each way between the GPU and its host's memory (PCIe, or
  NVLink-C2C on a Grace-Blackwell superchip), with ``sources.host_link_gbps``; activation offload
  copies over it. Without it, ``--offload-activations`` is refused on that GPU.

Names are case-insensitive; ``aliases`` lists other names a device answers to (``h100`` is the
SXM part); an alias must be unambiguous across the database. Every problem with a file is a
one-line :class:`~triosim.errors.ConfigError` naming the file and the field.
"""

from __future__ import annotations

import difflib
import importlib.resources
import math
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..safe_yaml import parse_yaml_text, read_text_file
from ..trace.fp8 import FP8_RECIPES
from .attention_curves import AttentionCurves, parse_attention

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
PEAK_FIELDS = ("matrix_tflops", "vector_tflops", "hbm_gbps", "memory_gb")
REQUIRED = ("name", "memory_gb", "hbm_gbps", "launch_floor_us", "matrix_tflops", "vector_tflops", "efficiency",
            "sources")
KEYS = frozenset((*REQUIRED, "display_name", "vendor", "aliases", "notes", "sm_count", "block_read_gbps", "node_fabric",
                  "processing_mode", "collective_sms", "fp8_recipes", "host_link_gbps"))
PER_TENSOR_FP8 = ("delayed", "current")  # the recipes of a GPU with an fp8 peak whose file names none
EFFICIENCY_KEYS = frozenset(("compute", "memory", "source"))
EFFICIENCY_OPTIONAL = frozenset(("attention", "compute_by_dtype", "vector"))
PROCESSING_MODES = ("roofline", "no_overlap")
INTERPOLATIONS = ("log-linear", "step")


@dataclass(frozen=True)
class Curve:
    """Achieved fraction of peak at a given size: ``points`` are (size, fraction) with sizes
    strictly increasing; between points the fraction is linear in log(size) (``step``: the
    lower point's fraction), outside them it is the end point's."""

    points: tuple[tuple[float, float], ...]
    step: bool = False

    def at(self, x: float) -> float:
        pts = self.points
        if not x > pts[0][0]:
            return pts[0][1]
        if x >= pts[-1][0]:
            return pts[-1][1]
        i = bisect_right([p[0] for p in pts], x)
        (x0, f0), (x1, f1) = pts[i - 1], pts[i]
        if self.step:
            return f0
        w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return f0 + w * (f1 - f0)


@dataclass(frozen=True)
class Device:
    """One GPU: peaks in FLOP/s per dtype, HBM in B/s, capacity in bytes, floor in seconds."""

    name: str
    display_name: str
    matrix_flops: dict[str, float]
    vector_flops: dict[str, float]
    hbm_bytes_per_s: float
    memory_bytes: float
    launch_floor_s: float
    compute_efficiency: Curve
    memory_efficiency: Curve
    compute_by_dtype: dict[str, Curve] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)
    path: str = field(default="", compare=False)
    sm_count: int | None = None  # streaming multiprocessors (compute units)
    block_read_bytes_per_s: float | None = None  # one thread block's read rate alone on an SM
    vector_efficiency: Curve | None = None  # vector-unit ops; None: the compute curves
    processing_mode: str = "roofline"  # how an op's compute and memory times combine
    node_fabric: str | None = None  # the shipped topology file of the system this GPU is sold in
    collective_sms: int | None = None  # SMs one NCCL collective or send occupies (None: SM sharing off)
    fp8_recipe_names: tuple[str, ...] | None = None  # the file's fp8_recipes (None: not given)
    host_link_bytes_per_s: float | None = None  # GPU <-> host memory, each way (activation offload)
    attention_efficiency: AttentionCurves | None = None  # measured fused-attention curves (None: the GEMM curve)

    @property
    def fp8_recipes(self) -> tuple[str, ...]:
        """The FP8 training recipes this GPU runs (none without an fp8 matrix peak)."""
        if "fp8" not in self.matrix_flops:
            return ()
        return self.fp8_recipe_names if self.fp8_recipe_names is not None else PER_TENSOR_FP8

    @property
    def default_fp8_recipe(self) -> str:
        """MXFP8 where the GPU runs it (Blackwell), else current scaling."""
        return "mxfp8" if "mxfp8" in self.fp8_recipes else "current"

    @property
    def fp8_transposed_copy(self) -> bool:
        """Whether an FP8 operand used columnwise needs a physically transposed copy (Hopper,
        Ada); a GPU that runs MXFP8 (Blackwell) reads it columnwise as it is."""
        return "mxfp8" not in self.fp8_recipes

    def block_limited_rate(self, blocks: int | None) -> float | None:
        """Read rate (B/s) of a kernel that runs ``blocks`` thread blocks, each streaming its own
        slice: at most one block per SM streams at the single-block rate. None when the device
        file gives no such limit or the op does not have one."""
        if blocks is None or self.sm_count is None or self.block_read_bytes_per_s is None:
            return None
        return min(blocks, self.sm_count) * self.block_read_bytes_per_s

    def compute_curve(self, dtype: str) -> Curve:
        """The compute efficiency curve for math in ``dtype`` (its own, else the default)."""
        return self.compute_by_dtype.get(dtype, self.compute_efficiency)

    def vector_curve(self, dtype: str) -> Curve:
        """The efficiency curve for vector-unit math in ``dtype``."""
        return self.vector_efficiency if self.vector_efficiency is not None else self.compute_curve(dtype)

    def combine(self, compute_s: float, memory_s: float) -> float:
        """An op's time from its compute and memory times under the device's processing mode."""
        return compute_s + memory_s if self.processing_mode == "no_overlap" else max(compute_s, memory_s)

    def matrix_peak(self, dtype: str) -> float:
        """Dense matrix-unit peak in FLOP/s for ``dtype`` (ConfigError when the device has none)."""
        return self._peak(self.matrix_flops, "matrix_tflops", dtype)

    def vector_peak(self, dtype: str) -> float:
        """Vector-unit peak in FLOP/s; a dtype without its own vector figure runs at the fp32 rate
        (bf16/fp16 math on the CUDA cores is at least as fast as fp32)."""
        if dtype in self.vector_flops:
            return self.vector_flops[dtype]
        if dtype in ("bf16", "fp16", "fp8", "tf32"):
            return self.vector_flops["fp32"]
        return self._peak(self.vector_flops, "vector_tflops", dtype)

    def _peak(self, table: dict[str, float], key: str, dtype: str) -> float:
        if dtype not in table:
            have = ", ".join(d for d in DTYPES if d in table)
            raise ConfigError(f"{self.path or self.name}: field {key}.{dtype}: device {self.name} has no {dtype} "
                              f"peak (it has {have})")
        return table[dtype]


def packaged_dir() -> Path:
    """Where the shipped device files live."""
    return Path(str(importlib.resources.files("triosim.hardware"))) / "device_data"


_NUMBER = re.compile(r"^[+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _positive(where: str, key: str, value: Any) -> float:
    # PyYAML reads 1e6 (no dot, no exponent sign) as text: a plain number written so is one.
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        value = float(value)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        try:
            ok = math.isfinite(float(value)) and float(value) > 0
        except OverflowError:
            ok = False
    if not ok:
        shown = repr(value) if len(repr(value)) <= 40 else f"a value of {len(repr(value))} characters"
        raise ConfigError(f"{where}: field {key!r} must be a positive finite number, got {shown}")
    return float(value)


# The plausible range of each number, in the file's units (TFLOPS, GB/s, GB, µs). Checked after
# the conversion to SI: a finite 1e300 in the file is an infinite capacity or an op of 10^294 s
# once multiplied, and a GPU outside these ranges (a millionth of a GFLOP/s, an exabyte of
# memory, a launch of a second) is a typo.
PLAUSIBLE = {
    "tflops": (1e-3, 1e6, "TFLOPS", 1e12),
    "gbps": (1e-3, 1e6, "GB/s", 1e9),
    "memory_gb": (1e-6, 1e9, "GB", 1e9),  # a kilobyte to an exabyte
    "launch_floor_us": (1e-3, 1e6, "µs", 1e-6),
    "sm_count": (1, 1e6, "SMs", 1),
    "fraction": (1e-6, 1, "of peak", 1),
}


def _quantity(where: str, key: str, value: Any, kind: str) -> float:
    """A positive number of the file (see :func:`_positive`) in SI units (FLOP/s, B/s, bytes,
    seconds), within the plausible range of its ``kind``."""
    low, high, unit, scale = PLAUSIBLE[kind]
    x = _positive(where, key, value) * scale
    if not (math.isfinite(x) and low * scale <= x <= high * scale):
        shown = str(value) if len(str(value)) <= 40 else f"a number of {len(str(value))} characters"
        raise ConfigError(f"{where}: field {key!r} must be between {low:g} and {high:g} {unit}, got {shown}")
    return x


def _shown(value: Any) -> str:
    return repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."


def _line(where: str, key: str, value: Any) -> str:
    """A name shown on one line of a table or a header: a non-empty string without line breaks
    (a mapping, a list or a multi-line text would break the output that shows it)."""
    if not isinstance(value, str) or not value.strip() or len(value.splitlines()) > 1 or len(value) > 200:
        raise ConfigError(f"{where}: field {key!r} must be a non-empty line of text (at most 200 characters), "
                          f"got {_shown(value)}")
    return value.strip()


def _peaks(where: str, data: dict, key: str) -> dict[str, float]:
    table = data[key]
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{where}: field {key!r} must be a mapping of dtype to TFLOPS ({', '.join(DTYPES)})")
    out = {}
    for dtype, value in table.items():
        if dtype not in DTYPES:
            raise ConfigError(f"{where}: field {key}.{dtype}: unknown dtype (known: {', '.join(DTYPES)})")
        out[dtype] = _quantity(where, f"{key}.{dtype}", value, "tflops")
    return out


def _curve(where: str, key: str, raw: Any) -> Curve:
    step = False
    if isinstance(raw, dict):
        unknown = sorted(set(map(str, raw)) - {"interpolation", "points"})
        if unknown:
            raise ConfigError(f"{where}: unknown field {key}.{unknown[0]} (known: interpolation, points)")
        mode = raw.get("interpolation", "log-linear")
        if mode not in INTERPOLATIONS:
            raise ConfigError(f"{where}: field {key}.interpolation must be one of {', '.join(INTERPOLATIONS)}, "
                              f"got {mode!r}")
        step, raw = mode == "step", raw.get("points")
        key = f"{key}.points"
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: field {key!r} must be a list of [size, fraction] points")
    points = []
    for n, pt in enumerate(raw):
        if not isinstance(pt, list) or len(pt) != 2:
            raise ConfigError(f"{where}: field {key}[{n}] must be a [size, fraction] pair, got {pt!r}")
        x = _positive(where, f"{key}[{n}] size", pt[0])
        f = _positive(where, f"{key}[{n}] fraction", pt[1])
        if f > 1:
            raise ConfigError(f"{where}: field {key}[{n}] fraction must be at most 1, got {pt[1]!r}")
        f = _quantity(where, f"{key}[{n}] fraction", f, "fraction")
        if points and not x > points[-1][0]:
            raise ConfigError(f"{where}: field {key}[{n}]: sizes must increase, got {pt[0]!r} after {points[-1][0]!r}")
        points.append((x, f))
    return Curve(tuple(points), step)


def parse_device(where: str, data: Any) -> Device:
    """Check a device file's mapping and build the Device (``where`` names the file in errors)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of device fields at the top level")
    unknown = sorted(set(map(str, data)) - KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
    for key in REQUIRED:
        if key not in data:
            raise ConfigError(f"{where}: missing field {key!r}")
    name = _line(where, "name", data["name"])
    display_name = _line(where, "display_name", data.get("display_name", name))
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list):
        raise ConfigError(f"{where}: field 'aliases' must be a list of names, got {_shown(aliases)}")
    aliases = [_line(where, f"aliases[{i}]", a) for i, a in enumerate(aliases)]
    matrix = _peaks(where, data, "matrix_tflops")
    vector = _peaks(where, data, "vector_tflops")
    if "fp32" not in vector:
        raise ConfigError(f"{where}: field vector_tflops.fp32: missing (every device needs its fp32 vector peak)")
    eff = data["efficiency"]
    if not isinstance(eff, dict):
        raise ConfigError(f"{where}: field 'efficiency' must be a mapping with compute, memory and source")
    bad = sorted(set(map(str, eff)) - EFFICIENCY_KEYS - EFFICIENCY_OPTIONAL)
    if bad:
        raise ConfigError(f"{where}: unknown field efficiency.{bad[0]} (known: attention, compute, compute_by_dtype, "
                          "memory, source, vector)")
    by_dtype = eff.get("compute_by_dtype", {})
    if not isinstance(by_dtype, dict):
        raise ConfigError(f"{where}: field efficiency.compute_by_dtype must map a dtype to a curve")
    for dtype in by_dtype:
        if dtype not in DTYPES:
            raise ConfigError(f"{where}: field efficiency.compute_by_dtype.{dtype}: unknown dtype "
                              f"(known: {', '.join(DTYPES)})")
    for key in sorted(EFFICIENCY_KEYS):
        if key not in eff:
            raise ConfigError(f"{where}: missing field efficiency.{key}")
    sources = data["sources"]
    if not isinstance(sources, dict):
        raise ConfigError(f"{where}: field 'sources' must map each of {', '.join(PEAK_FIELDS)} to its public source")
    for key in PEAK_FIELDS:
        if not isinstance(sources.get(key), str) or not sources[key].strip():
            raise ConfigError(f"{where}: missing field sources.{key} (the public document behind that number)")
    if not isinstance(eff["source"], str) or not eff["source"].strip():
        raise ConfigError(f"{where}: field efficiency.source must say where the curves come from")
    sm_count = None
    if "sm_count" in data:
        sm_count = _quantity(where, "sm_count", data["sm_count"], "sm_count")
        if sm_count != int(sm_count):
            raise ConfigError(f"{where}: field 'sm_count' must be a whole number, got {data['sm_count']!r}")
        sm_count = int(sm_count)
    comm_sms = None
    if "collective_sms" in data:
        comm_sms = _quantity(where, "collective_sms", data["collective_sms"], "sm_count")
        if comm_sms != int(comm_sms) or sm_count is None or comm_sms >= sm_count:
            raise ConfigError(f"{where}: field 'collective_sms' must be a whole number of SMs below sm_count "
                              f"(which it needs), got {data['collective_sms']!r}")
        if not isinstance(sources.get("collective_sms"), str) or not sources["collective_sms"].strip():
            raise ConfigError(f"{where}: missing field sources.collective_sms (where that number comes from)")
        comm_sms = int(comm_sms)
    host_link = None
    if "host_link_gbps" in data:
        host_link = _quantity(where, "host_link_gbps", data["host_link_gbps"], "gbps")
        if not isinstance(sources.get("host_link_gbps"), str) or not sources["host_link_gbps"].strip():
            raise ConfigError(f"{where}: missing field sources.host_link_gbps (where that number comes from)")
    block_rate = None
    if "block_read_gbps" in data:
        block_rate = _quantity(where, "block_read_gbps", data["block_read_gbps"], "gbps")
        if not isinstance(sources.get("block_read_gbps"), str) or not sources["block_read_gbps"].strip():
            raise ConfigError(f"{where}: missing field sources.block_read_gbps (where that number comes from)")
    mode = data.get("processing_mode", "roofline")
    if mode not in PROCESSING_MODES:
        raise ConfigError(f"{where}: field 'processing_mode' must be one of {', '.join(PROCESSING_MODES)}, "
                          f"got {mode!r}")
    fabric = data.get("node_fabric")
    if fabric is not None and (not isinstance(fabric, str) or not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", fabric)):
        raise ConfigError(f"{where}: field 'node_fabric' must name a shipped topology file (such as "
                          f"dgx-h100-superpod), got {fabric!r}")
    if fabric is not None and not (isinstance(sources.get("node_fabric"), str) and sources["node_fabric"].strip()):
        raise ConfigError(f"{where}: missing field sources.node_fabric (the system this GPU is sold in)")
    recipes = None
    if "fp8_recipes" in data:
        raw = data["fp8_recipes"]
        if not isinstance(raw, list) or not raw or any(r not in FP8_RECIPES for r in raw):
            raise ConfigError(f"{where}: field 'fp8_recipes' must be a list of FP8 recipes ({', '.join(FP8_RECIPES)}), "
                              f"got {_shown(raw)}")
        if "fp8" not in matrix:
            raise ConfigError(f"{where}: field 'fp8_recipes' needs an fp8 matrix peak (matrix_tflops.fp8)")
        if not (isinstance(sources.get("fp8_recipes"), str) and sources["fp8_recipes"].strip()):
            raise ConfigError(f"{where}: missing field sources.fp8_recipes (where the GPU's FP8 recipes come from)")
        recipes = tuple(dict.fromkeys(raw))
    return Device(
        name=name.lower(),
        display_name=display_name,
        matrix_flops=matrix,
        vector_flops=vector,
        hbm_bytes_per_s=_quantity(where, "hbm_gbps", data["hbm_gbps"], "gbps"),
        memory_bytes=_quantity(where, "memory_gb", data["memory_gb"], "memory_gb"),
        launch_floor_s=_quantity(where, "launch_floor_us", data["launch_floor_us"], "launch_floor_us"),
        compute_efficiency=_curve(where, "efficiency.compute", eff["compute"]),
        memory_efficiency=_curve(where, "efficiency.memory", eff["memory"]),
        compute_by_dtype={d: _curve(where, f"efficiency.compute_by_dtype.{d}", c) for d, c in by_dtype.items()},
        aliases=tuple(a.strip().lower() for a in aliases),
        sources={str(k): str(v) for k, v in sources.items()},
        path=where,
        sm_count=sm_count,
        block_read_bytes_per_s=block_rate,
        vector_efficiency=_curve(where, "efficiency.vector", eff["vector"]) if "vector" in eff else None,
        processing_mode=mode,
        node_fabric=fabric,
        collective_sms=comm_sms,
        fp8_recipe_names=recipes,
        host_link_bytes_per_s=host_link,
        attention_efficiency=parse_attention(where, eff["attention"], _curve) if "attention" in eff else None,
    )


def read_device_file(path: str | Path) -> Device:
    """Read and check one device file (``--gpu-file``): UTF-8 YAML within the limits of
    :mod:`triosim.safe_yaml` (1 MiB, 32 levels, 100,000 values with aliases expanded)."""
    p = Path(path)
    return parse_device(str(p), parse_yaml_text(read_text_file(p, "file"), str(p)))


@lru_cache(maxsize=1)
def shipped_devices() -> dict[str, Device]:
    """The packaged devices by name (read and checked once)."""
    devices = {}
    for f in sorted(packaged_dir().glob("*.yaml")):
        dev = read_device_file(f)
        if dev.name in devices:
            raise ConfigError(f"{f}: field 'name': {dev.name} is also defined in {devices[dev.name].path}")
        devices[dev.name] = dev
    return devices


def _aliases(devices: dict[str, Device]) -> dict[str, str]:
    """alias -> device name, for aliases claimed by exactly one device and not a device's own name."""
    claims: dict[str, set[str]] = {}
    for dev in devices.values():
        for alias in dev.aliases:
            claims.setdefault(alias, set()).add(dev.name)
    return {a: next(iter(n)) for a, n in claims.items() if len(n) == 1 and a not in devices}


def device_names() -> list[str]:
    """The shipped device names, sorted."""
    return sorted(shipped_devices())


def get_device(name: str) -> Device:
    """The shipped device called ``name`` (case-insensitive, or an unambiguous alias); an unknown
    name is a ConfigError that lists the valid ones and the closest match."""
    devices = shipped_devices()
    key = str(name).strip().lower()
    if key in devices:
        return devices[key]
    aliases = _aliases(devices)
    if key in aliases:
        return devices[aliases[key]]
    close = difflib.get_close_matches(key, [*devices, *aliases], n=1)
    hint = f"; did you mean {aliases.get(close[0], close[0])}?" if close else ""
    raise ConfigError(f"--gpu {name}: unknown GPU (known: {', '.join(sorted(devices))}){hint}")


__all__ = ["DTYPES", "Curve", "Device", "device_names", "get_device", "parse_device", "read_device_file",
           "shipped_devices"]
