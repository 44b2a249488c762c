"""The pipeline block of the JSON result: stages, micro-batches and the bytes over each stage
boundary of a built pipeline graph (the default builder's and the original's replay alike)."""

from __future__ import annotations

from collections.abc import Sequence

from ...schedule.tasks import TaskGraph
from ...trace import Trace
from ..strategy import Strategy
from .layer_layout import layout_text
from .stages import BACKWARD, FORWARD, PipelinePlan


def layer_facts(plan: PipelinePlan) -> dict:
    """JSON-ready: a plan cut at layers, its decoder layers per (virtual) stage in stage order,
    the same as a Megatron layout string, and how the split was chosen; {} for other partitions."""
    if not plan.layer_counts:
        return {}
    # Megatron's count: a card's decoder layers before its repeated ones are on the first stage
    decoder = [k + (plan.leading_layers if c == 0 else 0) for c, k in enumerate(plan.layer_counts)]
    return {"layers_per_stage": decoder,
            "layout": layout_text(plan.layer_counts, plan.leading_layers, plan.mtp_layers),
            "layer_split": plan.layer_split}


def summary(trace: Trace, graph: TaskGraph, plan: PipelinePlan, strategy: Strategy, sizes: Sequence[int]) -> dict:
    """JSON-ready facts for the report: stages, micro-batches, bytes over each stage boundary."""
    n = plan.num_stages
    fwd = [0] * max(n - 1, 0)
    bwd = [0] * max(n - 1, 0)
    rows = graph.attr_rows
    for t in graph.tasks_of_kind("transfer").tolist():
        attrs = rows[t] or {}
        if "dst_stage" in attrs:
            a, b = attrs["stage_index"], attrs["dst_stage"]
            if b == a + 1:
                fwd[a] += graph.nbytes[t]
            elif b == a - 1:
                bwd[b] += graph.nbytes[t]
    stages = []
    for s in range(n):
        f_ops = plan.ops_on(s, FORWARD)
        b_ops = plan.ops_on(s, BACKWARD)
        stages.append({
            "stage": s,
            "gpu": plan.gpu_of(s),
            "forward_ops": len(f_ops),
            "backward_ops": len(b_ops),
            "first_op": trace.ops[f_ops[0]].op_id if f_ops else None,
            "last_op": trace.ops[f_ops[-1]].op_id if f_ops else None,
            "compute_ms": round(sum(trace.ops[i].duration_s for i in f_ops + b_ops) * 1e3, 9),
            "optimizer_share": round(plan.optimizer_share[s], 9),
        })
    return {
        "schedule": strategy.schedule,
        "virtual_stages": plan.virtual,
        "partition": "count (reference_compat)" if strategy.reference_compat else plan.partition,
        **layer_facts(plan),
        "micro_batches": list(sizes),
        "stages": stages,
        "boundaries": [{"from": j, "to": j + 1, "forward_bytes": fwd[j], "backward_bytes": bwd[j]} for j in range(n - 1)],
        "warnings": list(plan.warnings),
    }


__all__ = ["layer_facts", "summary"]
