"""Where one iteration's time goes on each GPU.

Every GPU's iteration splits, without overlap or gap, into:

- compute by phase: ``forward``, ``backward``, ``recompute`` (a forward re-run before its
  backward under activation recomputation) and ``optimizer``;
- communication the GPU waits for, by purpose: ``tp`` (tensor-parallel collectives), ``pp``
  (pipeline sends), ``dp`` (gradient synchronisation and ZeRO gathers), ``memory`` (copies to and
  from remote memory) and ``other``. Communication that runs while the GPU computes is hidden and
  counted nowhere; where two purposes overlap, the first in that order is charged;
- ``idle``: the rest of the iteration (the pipeline bubble, waits on other GPUs).

The sum of the parts is the makespan on every GPU, so the mean over GPUs sums to it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule.tasks import COMM_KINDS
from .intervals import length as _length
from .intervals import subtract as _subtract
from .intervals import union as _union

COMPUTE_PARTS = ("forward", "backward", "recompute", "optimizer")
COMM_PARTS = ("tp", "pp", "dp", "memory", "other")
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
    if group in ("tp", "pp", "dp"):
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
    stages = graph.meta.get("op_stages", ())
    recomputed = graph.meta.get("recompute_ops", frozenset())
    preset = getattr(result.strategy, "preset", None)
    axis = getattr(preset, "axis", None) if not getattr(result.strategy, "hybrid", False) else None
    default = axis if axis in ("tp", "pp", "dp") else "other"
    compute: dict[int, dict[str, float]] = {}
    busy: dict[int, list[tuple[float, float]]] = {}
    comm: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for i, kind in enumerate(graph.kind):
        s, e = sched.start[i], sched.end[i]
        if kind == "compute":
            attrs = graph.attrs[i] or {}
            op = attrs.get("op")
            stage = stages[op] if isinstance(op, int) and 0 <= op < len(stages) else "forward"
            phase = compute_phase(stage, op in recomputed)
            for d in graph.devices[i]:
                parts = compute.setdefault(d, dict.fromkeys(COMPUTE_PARTS, 0.0))
                parts[phase] += e - s
                busy.setdefault(d, []).append((s, e))
        elif kind in COMM_KINDS:
            purpose = comm_purpose(kind, graph.attrs[i], default)
            for d in graph.devices[i]:
                comm.setdefault(d, {}).setdefault(purpose, []).append((s, e))
    makespan = sched.makespan
    rows = []
    for d in sorted(compute):
        parts = dict(compute[d])
        covered = _union(busy.get(d, []))
        for purpose in COMM_PARTS:
            spans = _union(comm.get(d, {}).get(purpose, []))
            exposed = _subtract(spans, covered)
            parts[f"exposed_{purpose}"] = _length(exposed)
            covered = _union(covered + exposed)
        parts["idle"] = max(0.0, makespan - _length(covered))
        rows.append(Breakdown(gpu=d, parts={k: parts[k] for k in PARTS}))
    return rows


def mean_breakdown(rows: list[Breakdown]) -> Breakdown:
    n = max(1, len(rows))
    return Breakdown(gpu=None, parts={k: sum(r.parts[k] for r in rows) / n for k in PARTS}, gpus=len(rows))


def breakdown_dict(result) -> dict:
    """JSON block: the mean over the built GPUs, and the GPU with the least idle time."""
    rows = breakdown(result)
    if not rows:
        return {}
    busiest = min(rows, key=lambda r: (r.parts["idle"], r.gpu))
    return {"gpus_averaged": len(rows), "mean": mean_breakdown(rows).to_dict(),
            "busiest_gpu": busiest.gpu, "busiest": busiest.to_dict()}
