"""The op-time model: how long an op takes at another batch size than the one it was traced at.

An op traced at batch b₀ took t₀. At batch b it takes ``max(floor, a + c·b)``, with the
measured t₀ returned unchanged at b = b₀ (so every number at the traced batch stays the
measured one). The models:

- ``linear`` — ``t₀·b/b₀`` for every op, no floor: the original TrioSim's scaling
  (always used under ``--reference-compat``).
- ``linear-floor`` — two kinds of op. The optimizer's ops (which read and write parameters,
  gradients and optimizer state) and ops on scalars only (such as the loss's ``ones_like``)
  take t₀ at any batch (a = t₀, c = 0); every other op scales linearly (a = 0, c = t₀/b₀). Either way it never takes less than a kernel floor
  (``--kernel-floor-us``, default 2 µs: about the shortest kernel an H100 runs, launch and
  tail included), nor, for an op measured below the floor, less than its measured time.
- ``fit`` — when the trace directory also holds the same model traced at other batch sizes
  (``triosim trace collect --batch-sizes 8,16,32`` writes them as ``batch-<N>/`` sub-directories,
  each a complete trace directory), a and c are fitted per op by least squares over all the
  batch sizes (c ≥ 0), with the same floor.
- ``auto`` (default) — ``fit`` when the directory holds traces at other batch sizes, else
  ``linear-floor``.

Why a floor: scaling 2 µs kernels to a batch of 1 gives 15 ns ops, so the smallest micro-batch
would always look fastest in a pipeline; real kernels do not get shorter than a few µs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from ..checks import non_negative
from ..errors import ConfigError, TraceError
from ..trace import Tensor, Trace, load_trace
from ..trace.tensor_table import TensorTable, column_or_none

MODELS = ("auto", "fit", "linear-floor", "linear")
DEFAULT_FLOOR_US = 2.0
BATCH_DIR = re.compile(r"^batch-(\d+)$")


@dataclass(frozen=True)
class OpTimeModel:
    """Per-op coefficients: op i takes ``measured[i]`` at ``batch``, else
    ``max(floor[i], fixed[i] + per_sample[i]·b)``."""

    name: str  # linear, linear-floor or fit
    batch: int
    measured: tuple[float, ...]
    fixed: tuple[float, ...]
    per_sample: tuple[float, ...]
    floor: tuple[float, ...]
    floor_us: float = 0.0
    batches: tuple[int, ...] = ()  # the batch sizes the coefficients come from

    def seconds(self, index: int, batch: int) -> float:
        if batch == self.batch:
            return self.measured[index]
        return max(self.floor[index], self.fixed[index] + self.per_sample[index] * batch)

    def describe(self) -> dict:
        """JSON-ready summary for results."""
        return {"name": self.name, "traced_batch": self.batch, "floor_us": self.floor_us,
                "fitted_batches": list(self.batches)}

    def summary(self) -> str:
        """One line for the terminal summary."""
        if self.name == "linear":
            return "op time: linear in the batch (the original's scaling)"
        if self.name == "fit":
            sizes = ", ".join(str(b) for b in self.batches)
            return f"op time: fit, a + c·batch per op from batches {sizes}, at least {self.floor_us:g} µs"
        return (f"op time: linear-floor, optimizer and scalar ops fixed, others linear in the batch, "
                f"at least {self.floor_us:g} µs")


def op_seconds(trace: Trace, index: int, batch: int) -> float:
    """Time of op ``index`` of ``trace`` at ``batch`` samples: its own time at the trace's batch,
    else the trace's op-time model (linear when it has none)."""
    op = trace.ops[index]
    if batch == trace.batch_size:
        return op.duration_s
    model = trace.op_time
    if model is None:
        return op.duration_s * batch / trace.batch_size
    return model.seconds(index, batch)


def batch_dependent(trace: Trace, buffer: str, tensor: Tensor | None = None) -> bool:
    """Whether a buffer's size follows the batch (as :func:`triosim.compute.scale.scale_trace` scales it);
    ``tensor``: the buffer's Tensor when at hand."""
    if buffer in trace.batch_invariant:
        return False
    shape = (tensor or trace.tensors[buffer]).shape
    return shape is None or (len(shape) > 0 and shape[0] == trace.batch_size)


def batch_independent_ops(trace: Trace) -> tuple[bool, ...]:
    """Per op: True for the optimizer's ops and for ops on scalars only (such as the loss's
    ``ones_like``). An op whose listed tensors merely look batch-free (a linear layer's backward
    row lists only its weight's transpose) still does batch-sized work: it scales."""
    # The buffers of such ops: scalars whose size does not follow the batch (few in any trace).
    # Column by column, on the trace's coded buffers (a 200k-op trace has half a million).
    cols = trace.buffer_columns
    tensors = trace.tensors
    numel = column_or_none(tensors, "numel")
    if numel is None:
        numel = np.fromiter(map(attrgetter("numel"), tensors.values()), dtype=np.int64, count=len(cols.ids))
    tensor_at = tensors.at if isinstance(tensors, TensorTable) else lambda c: tensors[cols.ids[c]]
    free = np.zeros(len(cols.ids), dtype=bool)
    scalars = np.flatnonzero(numel <= 1).tolist()
    free[[c for c in scalars if not batch_dependent(trace, cols.ids[c], tensor_at(c))]] = True
    n = len(trace.ops)
    busy = np.bincount(cols.read_op[~free[cols.read_code]], minlength=n)
    busy += np.bincount(cols.write_op[~free[cols.write_code]], minlength=n)
    optimizer = np.fromiter(map("optimizer".__eq__, map(attrgetter("stage"), trace.ops)), dtype=bool, count=n)
    return tuple((optimizer | (busy == 0)).tolist())


def _floors(measured: tuple[float, ...], floor_s: float) -> tuple[float, ...]:
    # An op measured below the floor keeps its measured time as its floor, so that a smaller
    # batch never makes it slower than it was measured.
    return tuple(min(floor_s, t) for t in measured)


def linear_model(trace: Trace) -> OpTimeModel:
    measured = tuple(op.duration_s for op in trace.ops)
    b0 = trace.batch_size
    return OpTimeModel("linear", b0, measured, (0.0,) * len(measured), tuple(t / b0 for t in measured),
                       (0.0,) * len(measured), 0.0, (b0,))


def linear_floor_model(trace: Trace, floor_us: float = DEFAULT_FLOOR_US) -> OpTimeModel:
    # Column by column (a 200k-op trace): numpy's float64 division and minimum are Python's.
    measured = np.fromiter(map(attrgetter("duration_s"), trace.ops), dtype=np.float64, count=len(trace.ops))
    b0 = trace.batch_size
    fixed_op = np.fromiter(batch_independent_ops(trace), dtype=bool, count=len(trace.ops))
    fixed = np.where(fixed_op, measured, 0.0)
    slope = np.where(fixed_op, 0.0, measured / b0)
    floor = np.minimum(floor_us * 1e-6, measured)
    return OpTimeModel("linear-floor", b0, tuple(measured.tolist()), tuple(fixed.tolist()), tuple(slope.tolist()),
                       tuple(floor.tolist()), floor_us, (b0,))


def _least_squares(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, c) minimising Σ (a + c·b − t)², with c ≥ 0 (a time never shrinks with the batch)."""
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mt = sum(t for _, t in points) / n
    sbb = sum((b - mb) ** 2 for b, _ in points)
    c = sum((b - mb) * (t - mt) for b, t in points) / sbb if sbb > 0 else 0.0
    if c < 0:
        return mt, 0.0
    return mt - c * mb, c


def fit_model(trace: Trace, others: list[Trace], floor_us: float = DEFAULT_FLOOR_US) -> OpTimeModel:
    """Per-op least-squares fit over ``trace`` and the same model traced at other batches."""
    for other in others:
        _check_same_ops(trace, other)
    traces = [trace, *others]
    fixed, slope = [], []
    for i in range(len(trace.ops)):
        a, c = _least_squares([(t.batch_size, t.ops[i].duration_s) for t in traces])
        fixed.append(a)
        slope.append(c)
    measured = tuple(op.duration_s for op in trace.ops)
    batches = tuple(sorted(t.batch_size for t in traces))
    return OpTimeModel("fit", trace.batch_size, measured, tuple(fixed), tuple(slope),
                       _floors(measured, floor_us * 1e-6), floor_us, batches)


def _check_same_ops(trace: Trace, other: Trace) -> None:
    where = os.path.join(other.path, "trace.csv")
    if len(other.ops) != len(trace.ops):
        raise TraceError(where, f"has {len(other.ops)} ops but {os.path.join(trace.path, 'trace.csv')} has "
                                f"{len(trace.ops)}: the traces at other batch sizes must be of the same model")
    for a, b in zip(trace.ops, other.ops):
        if a.name != b.name:
            raise TraceError(where, f"row {b.line}: op {b.name!r} where the batch-{trace.batch_size} trace has "
                                    f"{a.name!r}: the traces at other batch sizes must be of the same model")


def other_batch_dirs(trace_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(batch, directory) of the ``batch-<N>/`` trace directories inside ``trace_dir``."""
    root = Path(trace_dir)
    out = []
    if root.is_dir():
        for child in sorted(root.iterdir()):
            m = BATCH_DIR.match(child.name)
            if m and (child / "trace.csv").is_file():
                out.append((int(m.group(1)), child))
    return sorted(out)


def attach_op_time_model(trace: Trace, model: str = "auto", floor_us: float = DEFAULT_FLOOR_US,
                         time_column: str = "nooverlap") -> Trace:
    """``trace`` with its op-time model (see the module docstring), read from its directory."""
    if model not in MODELS:
        raise ConfigError(f"--op-time-model must be one of {', '.join(MODELS)}, got {model!r}")
    non_negative(floor_us, "--kernel-floor-us")  # finite: an infinite floor would make every op infinite
    if model == "linear":
        return replace(trace, op_time=linear_model(trace))
    others_at = [(b, d) for b, d in other_batch_dirs(trace.path) if b != trace.batch_size]
    if model == "fit" and not others_at:
        raise ConfigError(
            f"--op-time-model fit needs traces at other batch sizes in {trace.path}/batch-<N>/ "
            "(`triosim trace collect --batch-sizes 8,16,32` writes them)"
        )
    if model == "linear-floor" or not others_at:
        return replace(trace, op_time=linear_floor_model(trace, floor_us))
    others = [load_trace(d, batch_size=b, time_column=time_column) for b, d in others_at]
    return replace(trace, op_time=fit_model(trace, others, floor_us))


@dataclass
class ReindexedTimes:
    """An op-time model seen through a rewrite of the trace: op ``i`` of the new trace takes the
    time of op ``origin[i]`` of the old one (a re-run forward op costs what its original costs)."""

    base: Any
    origin: tuple[int, ...]

    @property
    def batch(self) -> int:
        return self.base.batch

    def seconds(self, index: int, batch: int) -> float:
        return self.base.seconds(self.origin[index], batch)

    def times(self, batch: int) -> list[float]:
        base = self.base.times(batch)
        return [base[o] for o in self.origin]

    def __getattr__(self, name: str) -> Any:  # name, gpu, describe, summary: the base model's
        if name in ("base", "origin"):
            raise AttributeError(name)
        return getattr(self.base, name)


def reindex_op_time(model: Any, origin: tuple[int, ...]) -> Any:
    """``model`` for a trace whose op ``i`` repeats op ``origin[i]`` of the model's trace."""
    if model is None:
        return None
    if isinstance(model, OpTimeModel):
        pick = lambda xs: tuple(xs[o] for o in origin)  # noqa: E731
        return replace(model, measured=pick(model.measured), fixed=pick(model.fixed),
                       per_sample=pick(model.per_sample), floor=pick(model.floor))
    return ReindexedTimes(model, tuple(origin))
