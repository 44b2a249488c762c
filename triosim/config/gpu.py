"""The GPU flags of a run: which device (``--gpu``/``--gpu-file``), how op times are found on it
(``--op-time-source``, ``--trace-gpu``, ``--dtype``) and what a memory peak over its capacity
means (``--memory-overflow``, ``--require-fit``).

Without ``--gpu`` (and ``--gpu-file``) nothing changes: the trace's own times, ``-capacity``'s
2^N bytes and the remote-memory spill, as before. With it, op times come from the chosen source
(:mod:`triosim.compute.op_time_source`), capacity is the device's memory unless ``-capacity`` is
given, and a peak over it is a verdict (``fits: false``) rather than a spill.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from functools import lru_cache

from ..compute.op_time_source import (
    DTYPE_CHOICES,
    SOURCES,
    GpuTiming,
    check_dtype,
    lookup_gpu,
    time_on_device,
)
from ..errors import ConfigError
from ..hardware.device_db import Device, read_device_file
from ..trace import Trace
from ..trace.precision import TRAINING_DTYPES

OVERFLOW_MODES = ("auto", "verdict", "spill")
DEFAULT_CAPACITY_LOG2 = 40.0  # -capacity's default: 2^40 B, "not given"
# Planning under a verdict: no spill, whatever the peak (the verdict compares it afterwards).
UNBOUNDED_BYTES = 2**62

# dest -> default of the GPU flags: a run's configuration block records them only when set, so
# a run without them writes the block it always wrote.
GPU_FLAG_DEFAULTS = {"gpu": None, "gpu_file": None, "op_time_source": "auto", "trace_gpu": None, "dtype": "auto",
                     "memory_overflow": "auto", "require_fit": False}


def add_gpu_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("gpu")
    g.add_argument("--gpu", default=None, metavar="NAME",
                   help="the GPU to predict for (`triosim gpus` lists them): op times from its roofline or "
                        "retargeted to it, memory checked against its capacity")
    g.add_argument("--gpu-file", default=None, metavar="FILE.yaml",
                   help="a device file of your own (the schema of the database's, see docs/gpus.md) instead of --gpu")
    g.add_argument("--op-time-source", default="auto", choices=SOURCES,
                   help="with --gpu: trace (measured), roofline (from shapes), retarget (measured × "
                        "roofline ratio) or auto (roofline for CPU/synthetic traces, trace on the trace's own GPU, "
                        "else retarget)")
    g.add_argument("--trace-gpu", default=None, metavar="NAME",
                   help="the GPU the trace was timed on, when meta.json does not say")
    g.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="bf16, fp16 or fp32: the training dtype (weights, activations and gradients resized "
                        "from the trace's, fp32 master weights and Adam moments; see docs/precision.md) and, with "
                        "--gpu, the math dtype of the matrix-unit ops; fp8: FP8 training as Transformer Engine runs "
                        "it (bf16, the linear layers' GEMMs in fp8 with their cast kernels; --fp8-recipe); tf32: "
                        "the math dtype only; auto: the trace's sizes and dtypes")
    g.add_argument("--memory-overflow", default="auto", choices=OVERFLOW_MODES,
                   help="a peak over capacity: verdict (fits: false, no spill; default with --gpu) or spill "
                        "(remote-memory traffic; default without)")
    g.add_argument("--require-fit", action="store_true",
                   help="exit with code 3 when a GPU's memory peak exceeds its capacity (implies a verdict)")


@dataclass(frozen=True)
class GpuOptions:
    """The GPU flags of one run, hashable (a sweep keys its loaded traces by them)."""

    gpu: str | None = None
    gpu_file: str | None = None
    source: str = "auto"
    trace_gpu: str | None = None
    dtype: str = "auto"
    overflow: str = "auto"
    require_fit: bool = False

    @classmethod
    def of(cls, args: argparse.Namespace) -> GpuOptions:
        return cls(getattr(args, "gpu", None), getattr(args, "gpu_file", None),
                   getattr(args, "op_time_source", "auto") or "auto", getattr(args, "trace_gpu", None),
                   getattr(args, "dtype", "auto") or "auto", getattr(args, "memory_overflow", "auto") or "auto",
                   bool(getattr(args, "require_fit", False)))

    @property
    def given(self) -> bool:
        return self.gpu is not None or self.gpu_file is not None

    def device(self) -> Device | None:
        """The device of ``--gpu`` or ``--gpu-file`` (None without either)."""
        return _device(self.gpu, self.gpu_file)

    @property
    def verdict(self) -> bool:
        """Whether a peak over capacity is a verdict (no spill) rather than remote-memory traffic."""
        if self.overflow == "auto":
            return self.given or self.require_fit
        return self.overflow == "verdict"

    def check(self, reference_compat: bool = False) -> None:
        """Flag values wrong on their own, before any file is read."""
        for flag, value in (("--gpu", self.gpu), ("--gpu-file", self.gpu_file), ("--trace-gpu", self.trace_gpu)):
            if value is not None and not str(value).strip():
                raise ConfigError(f"{flag} is empty; give a name or leave the flag out")
        if self.gpu is not None and self.gpu_file is not None:
            raise ConfigError("--gpu and --gpu-file exclude each other: name a shipped GPU or give your own file")
        if self.overflow not in OVERFLOW_MODES:
            raise ConfigError(f"--memory-overflow must be one of {', '.join(OVERFLOW_MODES)}, got {self.overflow!r}")
        if self.require_fit and self.overflow == "spill":
            raise ConfigError("--require-fit needs a verdict, not --memory-overflow spill")
        if not self.given:
            # a training dtype (bf16, fp16, fp32) sizes the buffers without a GPU; a math-only one does not
            math_only = "auto" if self.dtype in TRAINING_DTYPES else self.dtype
            for flag, value, default in (("--op-time-source", self.source, "auto"), ("--trace-gpu", self.trace_gpu, None),
                                         ("--dtype", math_only, "auto")):
                if value != default:
                    raise ConfigError(f"{flag} {value} needs the GPU to time the ops on: give --gpu NAME "
                                      "(`triosim gpus` lists them) or --gpu-file FILE")
            return
        if reference_compat:
            raise ConfigError("--gpu cannot be combined with --reference-compat (the original times ops as traced)")
        device = self.device()
        assert device is not None
        check_dtype(device, self.dtype)
        if self.trace_gpu is not None:
            lookup_gpu(self.trace_gpu, "--trace-gpu")


def _device(gpu: str | None, gpu_file: str | None) -> Device | None:
    if gpu_file is not None:
        return _device_file(gpu_file, *_stamp(gpu_file))
    if gpu is not None:
        return _database_device(gpu)
    return None


def _stamp(path: str) -> tuple[int, int]:
    """(mtime, size) of a device file: a file edited between two runs of one process (a sweep,
    the Python API) is read again, not taken from the cache."""
    try:
        st = os.stat(path)
    except OSError:  # the reader words the problem
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=16)
def _device_file(path: str, mtime_ns: int, size: int) -> Device:
    try:
        return read_device_file(path)
    except ConfigError as exc:  # the file's own message, said to be --gpu-file's
        raise ConfigError(f"--gpu-file {exc}") from None


@lru_cache(maxsize=16)
def _database_device(gpu: str) -> Device:
    return lookup_gpu(gpu, "--gpu")


def time_trace_on_gpu(trace: Trace, options: GpuOptions) -> tuple[Trace, GpuTiming | None]:
    """``trace`` (at its recorded batch) with its op times from the GPU flags' source, and what
    to say about it; unchanged, and None, without ``--gpu``."""
    device = options.device()
    if device is None:
        return trace, None
    return time_on_device(trace, device, options.source, options.trace_gpu, options.dtype)


def capacity_given(args: argparse.Namespace) -> bool:
    """Whether ``-capacity`` differs from its default (2^40 B stands for "not given")."""
    return float(getattr(args, "capacity", DEFAULT_CAPACITY_LOG2)) != DEFAULT_CAPACITY_LOG2


def memory_capacity(args: argparse.Namespace) -> int:
    """A GPU's memory capacity in bytes: the device's with ``--gpu`` unless ``-capacity`` is given,
    else 2^capacity."""
    device = GpuOptions.of(args).device()
    if device is not None and not capacity_given(args):
        return int(device.memory_bytes)
    return int(2 ** float(args.capacity))


def planning_capacity(args: argparse.Namespace) -> int | None:
    """The capacity the memory plan spills at (None: ``-capacity``'s, as before): unbounded under a
    verdict, the device's memory with ``--gpu`` and spill."""
    options = GpuOptions.of(args)
    if options.verdict:
        return UNBOUNDED_BYTES
    if options.given and not capacity_given(args):
        return memory_capacity(args)
    return None


def capacity_label(args: argparse.Namespace) -> str:
    """Whose capacity the verdict compares with: the device's name, or ``-capacity N``."""
    device = GpuOptions.of(args).device()
    if device is not None and not capacity_given(args):
        return device.display_name
    return f"-capacity {float(args.capacity):g}"


def verdict_capacity(args: argparse.Namespace) -> tuple[int, str] | None:
    """(capacity in bytes, whose) a run's memory peaks are judged against; None when a peak over
    capacity spills to remote memory instead (no verdict)."""
    if not GpuOptions.of(args).verdict:
        return None
    return memory_capacity(args), capacity_label(args)


__all__ = ["GPU_FLAG_DEFAULTS", "OVERFLOW_MODES", "UNBOUNDED_BYTES", "GpuOptions", "add_gpu_flags", "capacity_label",
           "memory_capacity", "planning_capacity", "time_trace_on_gpu", "verdict_capacity"]
