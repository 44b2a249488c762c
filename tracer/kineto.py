"""The torch.profiler Chrome trace: host operator spans, runtime launches and device kernels.

What the tracer takes from it:

* operator events (``cat`` ``cpu_op`` / ``user_annotation``, ``ph`` ``X``): name, thread, start
  and duration in µs, and the identity fields ``Record function id`` (PyTorch >= 2.2; equals the
  execution trace's ``rf_id``), ``External id``, ``Sequence number``;
* runtime events (``cuda_runtime`` / ``cuda_driver``): a launch on a host thread at a time, with
  the ``correlation`` id that links it to the device work it started;
* device events (``kernel``; ``gpu_memcpy`` / ``gpu_memset`` are kept apart): start, duration and
  ``correlation``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .errors import TracerError
from .etrace import load_json

OP_CATS = frozenset({"cpu_op", "user_annotation", "operator"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime"})
KERNEL_CATS = frozenset({"kernel"})
MEMOP_CATS = frozenset({"gpu_memcpy", "gpu_memset"})


@dataclass(frozen=True)
class OpEvent:
    """A host-side operator span."""

    name: str
    tid: int | str
    ts: float
    dur: float
    rf_id: int | None
    external_id: int | None
    seq: int | None
    index: int  # position in the file, to keep sorting deterministic


@dataclass(frozen=True)
class RuntimeEvent:
    """A runtime/driver call on a host thread (e.g. cudaLaunchKernel)."""

    tid: int | str
    ts: float
    correlation: int


@dataclass(frozen=True)
class DeviceEvent:
    """Work on the device: a kernel, memcpy or memset."""

    name: str
    ts: float
    dur: float
    correlation: int
    is_kernel: bool


@dataclass
class ProfilerTrace:
    """The parts of a profiler trace the converter needs."""

    path: str
    ops: list[OpEvent]
    runtime: list[RuntimeEvent]
    device: list[DeviceEvent]

    @property
    def has_kernels(self) -> bool:
        return any(d.is_kernel for d in self.device)

    @property
    def has_record_function_ids(self) -> bool:
        return bool(self.ops) and all(o.rf_id is not None for o in self.ops)


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def parse_profiler_trace(data: Any, path: str = "<profiler>") -> ProfilerTrace:
    """Extract operator, runtime and device events from a decoded Chrome trace."""
    if not isinstance(data, dict):
        raise TracerError(f"{path}: not a profiler trace (expected a JSON object)")
    if "traceEvents" not in data:
        hint = " (this looks like an execution trace; swap --graph and --profiler?)" \
            if "nodes" in data else ""
        raise TracerError(f"{path}: not a profiler trace: missing field 'traceEvents'{hint}")
    events = data["traceEvents"]
    if not isinstance(events, list):
        raise TracerError(f"{path}: field 'traceEvents' must be a list")
    ops: list[OpEvent] = []
    runtime: list[RuntimeEvent] = []
    device: list[DeviceEvent] = []
    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or str(ev.get("ph", "")).upper() != "X":
            continue
        cat = ev.get("cat")
        if cat not in OP_CATS and cat not in RUNTIME_CATS and cat not in KERNEL_CATS \
                and cat not in MEMOP_CATS:
            continue
        args = ev.get("args") or {}
        try:
            ts = float(ev["ts"])
            dur = float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            raise TracerError(f"{path}: traceEvents[{i}]: missing or bad 'ts'/'dur'") from None
        if cat in OP_CATS:
            seq = _int_or_none(args.get("Sequence number"))
            ops.append(OpEvent(name=str(ev.get("name", "")), tid=ev.get("tid", 0), ts=ts, dur=dur,
                               rf_id=_int_or_none(args.get("Record function id")),
                               external_id=_int_or_none(args.get("External id")),
                               seq=seq, index=i))
        elif cat in RUNTIME_CATS:
            corr = _int_or_none(args.get("correlation"))
            if corr is not None:
                runtime.append(RuntimeEvent(tid=ev.get("tid", 0), ts=ts, correlation=corr))
        else:
            corr = _int_or_none(args.get("correlation"))
            if corr is not None:
                device.append(DeviceEvent(name=str(ev.get("name", "")), ts=ts, dur=dur,
                                          correlation=corr, is_kernel=cat in KERNEL_CATS))
    return ProfilerTrace(path=path, ops=ops, runtime=runtime, device=device)


def load_profiler_trace(path: str | os.PathLike[str]) -> ProfilerTrace:
    """Read and parse a torch.profiler Chrome-trace JSON file."""
    return parse_profiler_trace(load_json(path, "profiler"), os.fspath(path))
