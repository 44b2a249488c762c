"""Memory verdicts: does every GPU's peak fit its capacity?

Under a verdict (``--gpu``, ``--memory-overflow verdict`` or ``--require-fit``) the memory plan
never spills: it is made with unbounded capacity, and each GPU's peak (each pipeline stage's) is
compared here with the device's memory (or ``-capacity``'s 2^N bytes). The breakdown (weights,
gradients, optimizer state, the rest: activations and temporaries) comes from the hybrid
builder's per-stage memory report where there is one, else, when every GPU holds the whole
model (cases 0–2), from the trace's buffer roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..graph.data.zero import buffer_roles
from ..graph.strategy import Strategy
from ..schedule.tasks import TaskGraph
from ..trace import Trace
from .dot_export import human_bytes

ROLE_KEYS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes")


@dataclass(frozen=True)
class MemoryVerdict:
    """Each GPU's peak against the capacity."""

    capacity_bytes: int
    capacity_of: str  # the device's name, or "-capacity N"
    per_gpu: tuple[dict[str, Any], ...]

    @property
    def fits(self) -> bool:
        return all(g["fits"] for g in self.per_gpu)

    @property
    def worst(self) -> dict[str, Any] | None:
        return max(self.per_gpu, key=lambda g: (g["peak_bytes"], -g["gpu"]), default=None)

    def to_dict(self) -> dict[str, Any]:
        return {"fits": self.fits, "capacity_bytes": self.capacity_bytes, "capacity_of": self.capacity_of,
                "worst": self.worst, "per_gpu": list(self.per_gpu)}


def _stages(graph: TaskGraph) -> dict[int, int]:
    """GPU → pipeline stage, where the graph has stages."""
    meta = graph.meta
    out = {}
    for st in meta.get("pipeline", {}).get("stages", []):
        out[int(st["gpu"])] = int(st["stage"])
    for m in meta.get("hybrid", {}).get("memory", []):
        out[int(m["gpu"])] = int(m["stage"])
    return out


def _whole_model_roles(trace: Trace) -> dict[str, int]:
    roles = buffer_roles(trace)
    sizes = {role: sum(trace.tensors[k].bytes for k in keys)
             for role, keys in (("weights_bytes", roles.weights), ("gradients_bytes", roles.gradients),
                                ("optimizer_bytes", roles.optimizer))}
    return sizes


def memory_verdict(graph: TaskGraph, trace: Trace, strategy: Strategy, capacity_bytes: int,
                   capacity_of: str) -> MemoryVerdict:
    """The verdict of a built graph (its memory plan is in ``graph.meta["memory"]``)."""
    mem = graph.meta.get("memory", {})
    stages = _stages(graph)
    hybrid = {int(m["gpu"]): m for m in graph.meta.get("hybrid", {}).get("memory", [])}
    whole = _whole_model_roles(trace) if not hybrid and not strategy.hybrid and strategy.case in (0, 1, 2) else None
    rows = []
    for gpu in sorted(mem):
        peak = int(mem[gpu].get("peak_bytes", 0))
        row: dict[str, Any] = {"gpu": int(gpu), "stage": stages.get(int(gpu)), "peak_bytes": peak,
                               "fits": peak <= capacity_bytes}
        roles = None
        if int(gpu) in hybrid:
            m = hybrid[int(gpu)]
            roles = {"weights_bytes": m["weights_bytes"], "gradients_bytes": m["gradients_bytes"],
                     "optimizer_bytes": m["optimizer_bytes"]}
        elif whole is not None:
            roles = dict(whole)
        if roles is not None:
            roles["activations_bytes"] = max(0, peak - sum(roles.values()))
            row.update(roles)
        rows.append(row)
    return MemoryVerdict(int(capacity_bytes), capacity_of, tuple(rows))


def verdict_line(verdict: dict[str, Any]) -> str | None:
    """The summary's line for a run that does not fit (None when it fits)."""
    if verdict.get("fits", True):
        return None
    w = verdict["worst"]
    over = sum(1 for g in verdict["per_gpu"] if not g["fits"])
    where = f"GPU {w['gpu']}" + (f" (stage {w['stage']})" if w.get("stage") is not None else "")
    parts = [f"{name} {human_bytes(w[key])}" for name, key in
             zip(("weights", "gradients", "optimizer state", "activations and temporaries"), ROLE_KEYS) if key in w]
    return (f"does not fit: {where} peaks at {human_bytes(w['peak_bytes'])}, over {verdict['capacity_of']}'s "
            f"{human_bytes(verdict['capacity_bytes'])}" + (f" ({', '.join(parts)})" if parts else "")
            + (f"; {over} of {len(verdict['per_gpu'])} GPUs over" if len(verdict["per_gpu"]) > 1 else ""))


__all__ = ["MemoryVerdict", "memory_verdict", "verdict_line"]
