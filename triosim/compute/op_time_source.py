"""Where an op's time comes from on the GPU asked about: the trace, a roofline, or a retarget.

The trace says *what* runs (ops, shapes, dtypes); a device (:mod:`triosim.hardware.device_db`)
says *how fast*. Three sources of an op's time, each a small class with one method
(:meth:`OpTimeSource.apply`, trace in, trace out), chosen by name:

- ``trace`` (:class:`MeasuredSource`): the measured time, scaled to other batches by the trace's
  op-time model (:mod:`triosim.compute.op_time`). Right when the trace came from the GPU asked about.
- ``roofline`` (:class:`RooflineSource`): every op's time is its roofline on the device
  (:func:`triosim.compute.roofline.roofline_seconds`) from its FLOPs and bytes
  (:mod:`triosim.compute.op_cost`) at the batch asked about. The FLOPs of an op that follows the
  batch (every op but the optimizer's and those on scalars only:
  :func:`~triosim.compute.op_time.batch_independent_ops`) scale with the batch, and so do the
  bytes of its batch-sized tensors; weights and the like keep their bytes.
- ``retarget`` (:class:`RetargetSource`): the measured time at the batch asked about (the trace's
  op-time model) × roofline(target) / roofline(source), per op. On the source GPU itself that is
  exactly the measured time: the trace is returned unchanged.

``auto`` (:func:`choose_source`): a CPU-timed or synthetic trace → roofline; a trace from the GPU
asked about → trace; from another GPU → retarget; a GPU trace whose GPU is unknown → an error
that asks for ``--trace-gpu``.

``--dtype fp8`` (FP8 training) times every op by the roofline in bf16 and is refused on measured
or retargeted times; the training precision then switches the linear layers to their fp8 GEMMs
and cast kernels (:mod:`triosim.compute.fp8_training`, ``RooflineTimes.fp8``).

A source is applied to the trace at its recorded batch, before batch scaling: it replaces the
ops' times at that batch and the trace's op-time model (so ``-batch-size-sim`` and pipeline
micro-batches ask the source for their times), and records its name as the trace's time source.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigError
from ..hardware.device_db import Device, device_names, get_device
from ..trace import Trace
from .fp8_time import Fp8Plan
from .op_cost import OpCost, trace_op_costs
from .op_time import batch_independent_ops
from .roofline import Precision, math_dtype, roofline_seconds

SOURCES = ("auto", "trace", "roofline", "retarget")
DTYPE_CHOICES = ("auto", "fp32", "tf32", "bf16", "fp16", "fp8")
SOURCE_WORDS = {"trace": "measured", "roofline": "roofline from shapes", "retarget": "retargeted"}
# FP8 training (--dtype fp8) runs every op but its FP8 linears' GEMMs in bf16 (triosim.compute.fp8_time).
FP8_BASE_DTYPE = "bf16"


# ----------------------------------------------------------------------------- which GPU a trace came from


def trace_origin(trace: Trace) -> str:
    """``"cpu"``, ``"synthetic"``, ``"gpu"`` (meta.json says so) or ``"unknown"`` (no meta.json)."""
    info = trace.info or {}
    device = str(info.get("device", "")).lower()
    if trace.time_source == "cpu" or device.startswith("cpu"):
        return "cpu"
    if device == "synthetic":
        return "synthetic"
    if device.startswith(("cuda", "gpu", "rocm", "hip")) or info.get("device_name") or \
            info.get("time_source") in ("kernels", "cuda"):
        return "gpu"
    return "unknown"


_VENDOR_WORDS = re.compile(r"\b(nvidia|amd|instinct|tesla|geforce)\b")


def device_from_name(device_name: str) -> Device | None:
    """The database device a recorded device name (``torch.cuda.get_device_name``, as meta.json's
    ``device_name``: "NVIDIA H200", "NVIDIA A100-SXM4-40GB", "NVIDIA H100 PCIe") means, or None.

    The first word is the family (h100, a100, mi300x); a device of that family whose other name
    parts all appear in the name wins ("h100 pcie" → h100-pcie, "a100 sxm4 40gb" → a100-40gb),
    else the family's own name or alias (h100 → h100-sxm)."""
    words = [w for w in re.split(r"[\s_-]+", _VENDOR_WORDS.sub(" ", str(device_name).lower())) if w]
    if not words:
        return None
    family, rest = words[0], set(words[1:])
    for name in device_names():
        parts = name.split("-")
        if parts[0] == family and set(parts[1:]) <= rest:
            if parts[1:] or name == family:
                return get_device(name)
    try:
        return get_device(family)
    except ConfigError:
        return None


def lookup_gpu(name: str, flag: str) -> Device:
    """A shipped device by name, the unknown-name error naming ``flag``."""
    try:
        return get_device(name)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("--gpu ", f"{flag} ", 1)) from None


def _known() -> str:
    return ", ".join(device_names())


def source_device(trace: Trace, trace_gpu: str | None) -> Device | None:
    """The GPU the trace's times were measured on: ``--trace-gpu``, else meta.json's device name
    (None for a CPU-timed or synthetic trace, and for a GPU whose name the database lacks)."""
    if trace_gpu is not None:
        return lookup_gpu(trace_gpu, "--trace-gpu")
    if trace_origin(trace) != "gpu":
        return None
    return device_from_name(str(trace.info.get("device_name", "")))


def check_trace_gpu(trace: Trace, trace_gpu: str | None) -> None:
    """``--trace-gpu`` says which GPU measured a trace whose meta.json does not say; it cannot
    turn a CPU-timed or synthetic trace's times into a GPU's (a CPU's op times are not an H100's,
    and claiming so would retarget or keep them as if they were)."""
    if trace_gpu is None:
        return
    origin = trace_origin(trace)
    if origin == "cpu":
        recorded = trace.info.get("device_name")
        raise ConfigError(f"--trace-gpu {trace_gpu}: meta.json says this trace was timed on the CPU"
                          + (f" ({recorded})" if recorded else "") + ", and CPU times are not a GPU's; leave "
                          "--trace-gpu out (--op-time-source auto times its ops by the roofline on --gpu)")
    if origin == "synthetic":
        raise ConfigError(f"--trace-gpu {trace_gpu}: this trace is synthetic (meta.json device: synthetic) and holds "
                          "no measured times; leave --trace-gpu out (--op-time-source auto times its ops by the roofline on --gpu)")


def choose_source(requested: str, target: Device, trace: Trace, trace_gpu: str | None = None) -> str:
    """The source ``auto`` (or the requested one) means for ``trace`` on ``target``; checks that
    ``retarget`` has a source GPU."""
    if requested not in SOURCES:
        raise ConfigError(f"--op-time-source must be one of {', '.join(SOURCES)}, got {requested!r}")
    check_trace_gpu(trace, trace_gpu)
    origin = "gpu" if trace_gpu is not None else trace_origin(trace)
    if requested in ("trace", "roofline"):
        return requested
    source = source_device(trace, trace_gpu)
    if source is None and origin in ("gpu", "unknown"):
        recorded = trace.info.get("device_name")
        why = (f"meta.json's device {recorded!r} is not in the device database" if recorded
               else "the trace does not say which GPU it was timed on (no meta.json device_name)")
        raise ConfigError(f"--op-time-source {requested}: {why}; give --trace-gpu NAME (known: {_known()}) "
                          "or --op-time-source roofline")
    if requested == "retarget":
        if source is None:
            what = "was timed on the CPU" if origin == "cpu" else "holds no measured times (synthetic)"
            raise ConfigError(f"--op-time-source retarget needs a GPU-timed trace, and this one {what}: use "
                              "--op-time-source roofline (or auto)")
        return "retarget"
    if origin in ("cpu", "synthetic"):
        return "roofline"
    return "trace" if source == target else "retarget"


# ----------------------------------------------------------------------------- batch-scaled op costs


@dataclass
class ShapeCosts:
    """The trace's op costs at its recorded batch and how they follow the batch: per op, whether
    it scales, and the share of its read and written bytes in batch-sized tensors."""

    batch: int
    costs: list[OpCost]
    fixed: tuple[bool, ...]
    read_share: list[float]
    write_share: list[float]
    _at: dict[int, list[OpCost]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, trace: Trace) -> ShapeCosts:
        b0 = trace.batch_size
        inv = trace.batch_invariant

        def follows(tid: str) -> bool:
            if tid in inv or trace.base(tid) in inv:
                return False
            t = trace.tensors[tid]
            return t.shape is None or (len(t.shape) > 0 and t.shape[0] == b0)

        def share(ids: Sequence[str]) -> float:
            seen = dict.fromkeys(ids)
            total = sum(trace.tensors[t].bytes for t in seen)
            moving = sum(trace.tensors[t].bytes for t in seen if follows(t))
            return moving / total if total > 0 else 0.0

        return cls(b0, trace_op_costs(trace), batch_independent_ops(trace),
                   [share(op.inputs) for op in trace.ops], [share(op.outputs) for op in trace.ops])

    def at(self, batch: int) -> list[OpCost]:
        """Every op's cost at ``batch`` samples."""
        if batch == self.batch:
            return self.costs
        hit = self._at.get(batch)
        if hit is None:
            r = batch / self.batch
            hit = [c if fixed else c.with_work(c.flops * r, c.bytes_read * (1 + (r - 1) * rs),
                                               c.bytes_written * (1 + (r - 1) * ws))
                   for c, fixed, rs, ws in zip(self.costs, self.fixed, self.read_share, self.write_share)]
            self._at[batch] = hit
        return hit

    @property
    def bytes_only(self) -> int:
        """Ops whose kind has no FLOP formula: costed by the bytes they read and write."""
        return sum(1 for c in self.costs if not c.known)


# ----------------------------------------------------------------------------- the op-time models they attach


@dataclass
class RooflineTimes:
    """Op-time model of the ``roofline`` source: op i at batch b takes its roofline on ``device``."""

    device: Device
    precision: Precision
    shapes: ShapeCosts
    name: str = "roofline"
    gpu: GpuTiming | None = None  # what the outputs say about the run's GPU (set by time_on_device)
    fp8: Fp8Plan | None = None  # FP8 training: the linears' GEMMs in fp8 and their cast kernels
    _times: dict[int, list[float]] = field(default_factory=dict, repr=False)
    _casts: dict[int, list[float]] = field(default_factory=dict, repr=False)

    @property
    def batch(self) -> int:
        return self.shapes.batch

    def times(self, batch: int) -> list[float]:
        hit = self._times.get(batch)
        if hit is None:
            costs = self.shapes.at(batch)
            if self.fp8 is None:
                hit = [roofline_seconds(c, self.device, self.precision) for c in costs]
            else:
                hit, self._casts[batch] = self.fp8.seconds(costs, self.device, self.precision)
            self._times[batch] = hit
        return hit

    def cast_seconds(self, batch: int) -> list[float]:
        """Per op, the part of its time in FP8 cast kernels (all 0 without FP8 training)."""
        if self.fp8 is None:
            return [0.0] * len(self.shapes.costs)
        self.times(batch)
        return self._casts[batch]

    def seconds(self, index: int, batch: int) -> float:
        return self.times(batch)[index]

    def describe(self) -> dict:
        out = {"name": "roofline", "source": "roofline", "gpu": self.device.name, "traced_batch": self.batch}
        if self.fp8 is not None:
            out["fp8"] = {**self.fp8.fp8.to_dict(), "linear_ops": len(self.fp8.linears.forward) + len(self.fp8.linears.backward)}
        return out

    def summary(self) -> str:
        line = f"op time: roofline on {self.device.display_name} from the ops' shapes at each batch"
        if self.fp8 is not None:
            line += (f"; FP8 training ({self.fp8.fp8.label}): {len(self.fp8.linears.forward)} linear layers' GEMMs "
                     "at the fp8 peak plus their cast kernels")
        return line


@dataclass
class RetargetTimes:
    """Op-time model of the ``retarget`` source: the measured model's time × roofline(target) /
    roofline(source), per op, at each batch."""

    measured: Any  # the trace's own op-time model (OpTimeModel)
    source: RooflineTimes
    target: RooflineTimes
    name: str = "retarget"
    gpu: GpuTiming | None = None
    _times: dict[int, list[float]] = field(default_factory=dict, repr=False)

    @property
    def batch(self) -> int:
        return self.measured.batch

    def times(self, batch: int) -> list[float]:
        hit = self._times.get(batch)
        if hit is None:
            src, dst = self.source.times(batch), self.target.times(batch)
            hit = self._times[batch] = [self.measured.seconds(i, batch) * (dst[i] / src[i]) for i in range(len(src))]
        return hit

    def seconds(self, index: int, batch: int) -> float:
        return self.times(batch)[index]

    def describe(self) -> dict:
        return {**self.measured.describe(), "source": "retarget", "gpu": self.target.device.name,
                "trace_gpu": self.source.device.name}

    def summary(self) -> str:
        return (f"{self.measured.summary()}; retargeted from {self.source.device.display_name} to "
                f"{self.target.device.display_name} per op by the ratio of their rooflines")


@dataclass
class MeasuredTimes:
    """Op-time model of the ``trace`` source on a named GPU: the trace's own model, labelled."""

    measured: Any
    device: Device
    name: str = "trace"
    gpu: GpuTiming | None = None

    @property
    def batch(self) -> int:
        return self.measured.batch

    def seconds(self, index: int, batch: int) -> float:
        return self.measured.seconds(index, batch)

    def describe(self) -> dict:
        return {**self.measured.describe(), "source": "trace", "gpu": self.device.name}

    def summary(self) -> str:
        return f"{self.measured.summary()} (measured times, taken as {self.device.display_name}'s)"


def with_op_times(trace: Trace, model: Any, times: Sequence[float], source: str) -> Trace:
    """``trace`` with its ops taking ``times`` (at its recorded batch) and ``model`` as its op-time model."""
    ops = [op._replace(duration_s=t, span_s=op.span_s * t / op.duration_s if op.duration_s > 0 else t)
           for op, t in zip(trace.ops, times)]
    return replace(trace, ops=ops, op_time=model, info={**trace.info, "time_source": source})


# ----------------------------------------------------------------------------- the sources


class OpTimeSource:
    """One way of timing a trace's ops on a device: :meth:`apply` returns the trace with its op
    times (at its recorded batch) and its op-time model (at any other) replaced."""

    name = ""

    def apply(self, trace: Trace) -> Trace:
        raise NotImplementedError


@dataclass(frozen=True)
class MeasuredSource(OpTimeSource):
    device: Device
    name = "trace"

    def apply(self, trace: Trace) -> Trace:
        if trace.op_time is None:
            return trace
        return replace(trace, op_time=MeasuredTimes(trace.op_time, self.device))


@dataclass(frozen=True)
class RooflineSource(OpTimeSource):
    device: Device
    precision: Precision = Precision()
    name = "roofline"

    def apply(self, trace: Trace, shapes: ShapeCosts | None = None) -> Trace:
        model = RooflineTimes(self.device, self.precision, shapes or ShapeCosts.of(trace))
        return with_op_times(trace, model, model.times(trace.batch_size), "roofline")


@dataclass(frozen=True)
class RetargetSource(OpTimeSource):
    source: Device
    target: Device
    precision: Precision = Precision()
    name = "retarget"

    def apply(self, trace: Trace) -> Trace:
        if self.target == self.source:  # exactly the measurement: nothing to move
            return MeasuredSource(self.target).apply(trace)
        if trace.op_time is None:
            from .op_time import attach_op_time_model

            trace = attach_op_time_model(trace)
        shapes = ShapeCosts.of(trace)
        model = RetargetTimes(trace.op_time, RooflineTimes(self.source, self.precision, shapes),
                              RooflineTimes(self.target, self.precision, shapes))
        return with_op_times(trace, model, model.times(trace.batch_size), "retarget")


# ----------------------------------------------------------------------------- what the outputs say


@dataclass(frozen=True)
class GpuTiming:
    """The GPU of a run and how its op times were found: what the summary header, the JSON
    ``gpu`` block and the sweep columns say."""

    device: Device
    source: str  # trace, roofline or retarget
    dtype: str  # the math dtype(s) of the matrix-unit ops, e.g. "bf16" or "tf32/fp32"
    bytes_only_ops: int = 0
    trace_device: Device | None = None

    def header(self) -> str:
        """``H100-SXM, op times: roofline from shapes, bf16``."""
        what = SOURCE_WORDS[self.source]
        if self.source == "retarget" and self.trace_device is not None:
            what = f"retargeted from {self.trace_device.display_name}"
        elif self.source == "trace" and self.trace_device is not None and self.trace_device != self.device:
            what = f"measured on {self.trace_device.display_name}"
        line = f"{self.device.display_name}, op times: {what}"
        if self.source != "trace":
            line += f", {self.dtype}"
        return line

    def notes(self) -> list[str]:
        if self.source == "trace" or not self.bytes_only_ops:
            return []
        return [f"{self.bytes_only_ops} op{'s' if self.bytes_only_ops != 1 else ''} costed by bytes only "
                "(no FLOP formula for their kind)"]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.device.name, "display_name": self.device.display_name, "op_time_source": self.source,
                "dtype": self.dtype, "ops_costed_by_bytes_only": self.bytes_only_ops if self.source != "trace" else 0,
                "trace_gpu": self.trace_device.name if self.trace_device is not None else None,
                "memory_bytes": int(self.device.memory_bytes)}


def dtype_label(costs: Sequence[OpCost], device: Device, precision: Precision) -> str:
    """The math dtypes of the matrix-unit ops, the one doing most FLOPs first."""
    flops: dict[str, float] = {}
    for c in costs:
        if c.on_matrix_units and c.flops > 0:
            d = math_dtype(c, device, precision)
            flops[d] = flops.get(d, 0.0) + c.flops
    if not flops:
        return precision.dtype or "fp32"
    return "/".join(sorted(flops, key=lambda d: -flops[d]))


def check_dtype(device: Device, dtype: str) -> None:
    """``--dtype`` must name a matrix-unit peak the device has (fp8 on a V100 does not)."""
    if dtype not in DTYPE_CHOICES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, got {dtype!r}")
    if dtype != "auto" and dtype not in device.matrix_flops:
        have = ", ".join(d for d in ("fp32", "tf32", "bf16", "fp16", "fp8") if d in device.matrix_flops)
        raise ConfigError(f"--dtype {dtype}: {device.display_name} ({device.name}) has no {dtype} matrix peak "
                          f"(it has {have})")


def time_on_device(trace: Trace, device: Device, requested: str = "auto", trace_gpu: str | None = None,
                   dtype: str = "auto") -> tuple[Trace, GpuTiming]:
    """``trace`` (at its recorded batch, with its op-time model) timed on ``device`` by the
    source ``requested`` (``auto``: see :func:`choose_source`), and what to say about it."""
    check_dtype(device, dtype)
    precision = Precision(None if dtype == "auto" else FP8_BASE_DTYPE if dtype == "fp8" else dtype)
    name = choose_source(requested, device, trace, trace_gpu)
    if dtype == "fp8" and name != "roofline":
        raise ConfigError(f"--dtype fp8 trains in FP8: the linear layers' GEMMs at the fp8 peak plus their cast kernels, "
                          f"timed by the GPU model, and this trace's op times would be {SOURCE_WORDS[name]}; give "
                          "--op-time-source roofline")
    src = source_device(trace, trace_gpu) if name != "roofline" or trace_gpu is not None else None
    if name == "trace":
        timed, shapes = MeasuredSource(device).apply(trace), None
    elif name == "roofline":
        shapes = ShapeCosts.of(trace)
        timed = RooflineSource(device, precision).apply(trace, shapes)
    else:
        assert src is not None  # choose_source checked it
        timed = RetargetSource(src, device, precision).apply(trace)
        model = timed.op_time
        shapes = model.target.shapes if isinstance(model, RetargetTimes) else None
    costs = shapes.costs if shapes is not None else trace_op_costs(trace)
    label = dtype_label(costs, device, precision)
    bytes_only = shapes.bytes_only if shapes is not None else sum(1 for c in costs if not c.known)
    timing = GpuTiming(device, name, label, bytes_only, src)
    if timed.op_time is not None:
        timed.op_time.gpu = timing
    return timed, timing


def gpu_timing(trace: Trace) -> GpuTiming | None:
    """What :func:`time_on_device` said about ``trace``'s GPU (None: a run without ``--gpu``)."""
    return getattr(trace.op_time, "gpu", None)


__all__ = ["DTYPE_CHOICES", "SOURCES", "GpuTiming", "MeasuredSource", "OpTimeSource", "RetargetSource",
           "RooflineSource", "ShapeCosts", "check_dtype", "check_trace_gpu", "choose_source", "device_from_name",
           "gpu_timing", "lookup_gpu", "source_device", "time_on_device", "trace_origin", "with_op_times"]
