"""The JSON blocks a ``-case`` preset of the composition writes, those of the original's cases:
``gradient_bytes`` and ``buckets`` (cases 1 and 2), ``tensor_parallel`` (case 3), ``pipeline``
with the partition candidates timed (case 4), and case 4's stage names for the DOT export. A
run typed as ``--dp/--tp/--pp`` writes the composition's ``hybrid`` block instead."""

from __future__ import annotations

from collections.abc import Sequence

from ..schedule.tasks import TaskGraph
from ..trace import Trace
from .data.data_parallel import MIB, Bucket, buckets_block, make_buckets, whole_gradient
from .pipeline.stages import PipelinePlan
from .pipeline.summary import summary
from .strategy import Preset, Strategy
from .tensor.per_op import tensor_parallel_block


def preset_buckets(trace: Trace, strategy: Strategy, preset: Preset) -> list[Bucket]:
    """The gradient buckets of a data-parallel preset: DDP's, or under ``whole`` (case 1) one
    bucket of every gradient after the last backward op."""
    if preset.gradient_sync == "whole":
        return whole_gradient(trace)
    return make_buckets(trace, strategy.bucket_mb * MIB)


def record(graph: TaskGraph, trace: Trace, strategy: Strategy, preset: Preset, plan: PipelinePlan, tpp,
           sizes: Sequence[int], candidates: list[dict] | None) -> None:
    """Store the preset's blocks in ``graph.meta``: those of its axis (none for one GPU)."""
    if preset.axis == "dp":
        buckets = preset_buckets(trace, strategy, preset)
        graph.meta["buckets"] = buckets_block(trace, buckets)
        graph.meta["gradient_bytes"] = sum(b.nbytes for b in buckets)
    elif preset.axis == "tp":
        graph.meta["tensor_parallel"] = tensor_parallel_block(trace, tpp)
    elif preset.axis == "pp":
        graph.meta["cluster_names"] = {
            g: f"stage{'s' if plan.virtual > 1 else ''} {', '.join(str(s) for s in range(p, plan.num_stages, plan.ranks))} "
               f"(GPU {g})"
            for p, g in enumerate(plan.gpus)
        }
        graph.meta["pipeline"] = summary(trace, graph, plan, strategy, sizes)
        if candidates is not None:
            graph.meta["pipeline"]["candidates"] = candidates


__all__ = ["preset_buckets", "record"]
