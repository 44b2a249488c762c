"""Why a plan found nothing: the rule that left no mesh, or the candidates closest to fitting."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .candidates import SearchSpace, divisors, mesh_shapes
from .search import Row


def explain_empty(space: SearchSpace, layer_unit: str) -> str:
    """One line: why no (tp, pp, dp) passes the rules (the global batch, or the pinned axes)."""
    if space.pinned and mesh_shapes(replace(space, pinned=())):
        pins = " ".join(f"--{a} {v}" for a, v in space.pinned)
        heads = f"tp dividing the {space.heads} attention heads, " if space.heads else ""
        return (f"{pins}: no mesh on {space.gpus} GPUs keeps them ({heads}pp dividing the {space.layers} "
                f"{layer_unit}, dp = GPUs / (tp × pp × cp) dividing --global-batch {space.global_batch}); "
                "pin other degrees or leave them out")
    cap = space.max_tp if space.max_tp is not None else space.gpus_per_node
    dps = sorted({space.gpus // (tp * pp) for tp in divisors(space.gpus)
                  if tp <= cap and (space.heads is None or space.heads % tp == 0)
                  for pp in divisors(space.gpus // tp) if space.layers % pp == 0})
    heads = f"dividing the {space.heads} attention heads" if space.heads else "any"
    return (f"--global-batch {space.global_batch} is not divisible by any data-parallel degree the mesh allows: "
            f"on {space.gpus} GPUs with tp {heads} (at most {cap}) and pp dividing the {space.layers} {layer_unit}, "
            f"dp is one of {', '.join(map(str, dps))}; give a global batch one of them divides")


def explain_infeasible(rows: Sequence[Row], show: int = 3) -> list[str]:
    """Lines saying that nothing fits and why, for the ``show`` candidates closest to fitting."""
    over = [r for r in rows if r.estimate is not None and not r.estimate.fits]
    over.sort(key=lambda r: r.estimate.peak_bytes)
    lines = [f"no configuration fits ({len(over):,} of {len(rows):,} need more memory than a GPU has"
             + (f", {sum(1 for r in rows if r.error):,} refused" if any(r.error for r in rows) else "")
             + "); the closest:"]
    for r in over[:show]:
        c = r.candidate
        lines.append(f"  {c.mesh} micro-batch {c.micro_batch} {c.schedule_label} ZeRO-{c.zero} "
                     f"{'' if c.offload else 'recompute '}{c.recompute_label}: {r.reason}")
    for r in [r for r in rows if r.error][:show if not over else 0]:
        lines.append(f"  {r.candidate.mesh}: {r.error}")
    dag = [r for r in rows if r.dag is not None and r.reason]
    for r in dag[:show]:
        lines.append(f"  {r.candidate.mesh} (DAG-timed): {r.reason}")
    return lines


__all__ = ["explain_empty", "explain_infeasible"]
