"""Where one iteration's time goes on each GPU.

Every GPU's iteration splits, without overlap or gap, into:

- compute by phase: ``forward``, ``backward``, ``recompute`` (a forward re-run before its
  backward under activation recomputation) and ``optimizer``;
- communication the GPU waits for, by purpose: ``tp`` (tensor-parallel collectives), ``cp``
  (context parallelism's key/value exchanges), ``pp`` (pipeline sends), ``dp`` (gradient
  synchronisation and ZeRO gathers), ``memory`` (copies to and from remote memory) and ``other``. Communication that runs while the GPU computes is hidden and
  counted nowhere; where two purposes overlap, the first in that order is charged;
- ``idle``: the rest of the iteration (the pipeline bubble, waits on other GPUs).

The sum of the parts is the makespan on every GPU, so the mean over GPUs sums to it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from itertools import chain
from operator import add

import numpy as np

from ..graph.composition import MIRRORS_META
from ..schedule.tasks import COMM_KINDS
from .compute_kinds import compute_kinds
from .intervals import length as _length
from .intervals import subtract as _subtract
from .intervals import union as _union
from .intervals import union_of_columns

COMPUTE_PARTS = ("forward", "backward", "recompute", "optimizer")
COMM_PARTS = ("tp", "cp", "ep", "pp", "dp", "memory", "other")
PARTS = (*COMPUTE_PARTS, *(f"exposed_{c}" for c in COMM_PARTS), "idle")


@dataclass(frozen=True)
class Breakdown:
    """Seconds per part for one GPU (``gpu`` None: the mean over ``gpus`` GPUs)."""

    gpu: int | None
    parts: dict[str, float]
    gpus: int = 1

    def to_dict(self) -> dict[str, float]:
        return {f"{k}_ms": round(v * 1e3, 9) for k, v in self.parts.items()}


def comm_purpose(kind: str, attrs: dict | None, default: str) -> str:
    """The purpose of one communication task, from what its builder recorded on it."""
    if kind == "memcpy":
        return "memory"
    attrs = attrs or {}
    group = attrs.get("group_kind")
    if group in ("tp", "cp", "ep", "pp", "dp"):
        return group
    if "direction" in attrs:  # a pipeline send of activations or their gradients
        return "pp"
    return default


def compute_phase(stage: str, recomputed: bool) -> str:
    if recomputed:
        return "recompute"
    return stage if stage in ("forward", "backward", "optimizer") else "forward"


def breakdown(result) -> list[Breakdown]:
    """One :class:`Breakdown` per built GPU, in GPU order, from the schedule of ``result``."""
    graph, sched = result.graph, result.schedule
    preset = getattr(result.strategy, "preset", None)
    axis = getattr(preset, "axis", None) if not getattr(result.strategy, "hybrid", False) else None
    default = axis if axis in ("tp", "pp", "dp") else "other"
    compute, busy = _compute_parts(graph, sched)
    # Spans by the GPUs their task names and purpose (a collective names its whole group); a
    # GPU's spans of a purpose are those of the tuples naming it (a union sorts them), found
    # once for GPUs named by the same tuples.
    comm_of: dict[tuple[int, ...], dict[str, list[tuple[float, float]]]] = {}
    kinds, attrs, devices, start, end = graph.kind, graph.attr_rows, graph.devices, sched.start, sched.end
    for i in graph.tasks_of_kind(*sorted(COMM_KINDS)).tolist():
        purpose = comm_purpose(kinds[i], attrs[i], default)
        comm_of.setdefault(devices[i], {}).setdefault(purpose, []).append((start[i], end[i]))
    tuples = list(comm_of.values())
    named_by: dict[int, list[int]] = {}
    for k, devs in enumerate(comm_of):
        for d in devs:
            named_by.setdefault(d, []).append(k)
    unions: dict[tuple[tuple[int, ...], str], list[tuple[float, float]]] = {}
    exposed_of: dict[tuple[tuple[int, ...], int], dict[str, float]] = {}
    makespan = sched.makespan
    rows = []
    for d in sorted(compute):
        key = tuple(named_by.get(d, ()))
        covered = busy[d]
        hit = exposed_of.get((key, id(covered)))  # a folded build's mirrors: the built GPU's, once
        if hit is None:
            hit = exposed_of[(key, id(covered))] = {}
            for purpose in COMM_PARTS:
                spans = unions.get((key, purpose))
                if spans is None:
                    spans = unions[(key, purpose)] = _union([iv for k in key for iv in tuples[k].get(purpose, ())])
                exposed = _subtract(spans, covered)
                hit[f"exposed_{purpose}"] = _length(exposed)
                covered = _union(covered + exposed)
            hit["idle"] = max(0.0, makespan - _length(covered))
        parts = {**compute[d], **hit}
        rows.append(Breakdown(gpu=d, parts={k: parts[k] for k in PARTS}))
    return rows


def _compute_parts(graph, sched) -> tuple[dict[int, dict[str, float]], dict[int, list[tuple[float, float]]]]:
    """Per GPU: seconds of compute by phase, and the union of its compute spans.

    A large mesh has 10^6 compute tasks, so they are grouped with numpy; each phase's seconds are
    still the sum of its tasks' ``end - start`` in task order (the floats of a running sum)."""
    stages = graph.meta.get("op_stages", ())
    recomputed = graph.meta.get("recompute_ops", frozenset())
    at = graph.compute_tasks()[0]
    at_list = at.tolist()
    devs = list(map(graph.devices.__getitem__, at_list))
    counts = np.fromiter(map(len, devs), dtype=np.int64, count=len(devs))
    task = np.repeat(at, counts)  # one row per (compute task, GPU), tasks in order
    gpu = np.fromiter(chain.from_iterable(devs), dtype=np.int64, count=int(counts.sum()))
    phase_of: dict = {}  # op -> index in COMPUTE_PARTS
    codes = []
    for a in map(graph.attr_rows.__getitem__, at_list):
        op = a.get("op") if a else None
        code = phase_of.get(op)
        if code is None:
            stage = stages[op] if isinstance(op, int) and 0 <= op < len(stages) else "forward"
            code = phase_of[op] = COMPUTE_PARTS.index(compute_phase(stage, op in recomputed))
        codes.append(code)
    phase = np.repeat(np.asarray(codes, dtype=np.int64), counts)
    starts = np.asarray(sched.start, dtype=np.float64)[task]
    ends = np.asarray(sched.end, dtype=np.float64)[task]
    took = ends - starts
    compute: dict[int, dict[str, float]] = {}
    busy: dict[int, list[tuple[float, float]]] = {}
    by_gpu = np.argsort(gpu, kind="stable")
    cuts = np.flatnonzero(np.diff(gpu[by_gpu])) + 1
    for rows in np.split(by_gpu, cuts) if len(by_gpu) else []:
        d = int(gpu[rows[0]])
        busy[d] = union_of_columns(starts[rows], ends[rows])
        parts = compute[d] = dict.fromkeys(COMPUTE_PARTS, 0.0)
        for k, name in enumerate(COMPUTE_PARTS):
            mine = took[rows[phase[rows] == k]]
            if len(mine):
                parts[name] = reduce(add, mine.tolist(), 0.0)  # left to right, as += added them
    for d, built in graph.meta.get(MIRRORS_META, {}).items():  # a folded build: GPU d runs as the built GPU
        compute[d], busy[d] = dict(compute[built]), busy[built]
    return compute, busy


def mean_breakdown(rows: list[Breakdown]) -> Breakdown:
    n = max(1, len(rows))
    return Breakdown(gpu=None, parts={k: sum(r.parts[k] for r in rows) / n for k in PARTS}, gpus=len(rows))


def breakdown_dict(result) -> dict:
    """JSON block: the mean over the built GPUs, and the GPU with the least idle time."""
    rows = breakdown(result)
    if not rows:
        return {}
    busiest = min(rows, key=lambda r: (r.parts["idle"], r.gpu))
    out = {"gpus_averaged": len(rows), "mean": mean_breakdown(rows).to_dict(),
           "busiest_gpu": busiest.gpu, "busiest": busiest.to_dict()}
    kinds = compute_kinds(result)
    if kinds:  # the mean GPU's compute by kind of kernel (GEMM, FP8 casts, attention, other)
        out["compute_by_kind"] = kinds
    return out
