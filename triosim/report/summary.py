"""The terminal summary of a simulation (rich): iteration time, per-GPU and per-link figures."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from .dot_export import human_bytes
from .memory_verdict import verdict_line
from .result import GpuStats, Result

MAX_GPU_ROWS = 16


def _gpu_table(rows: list[GpuStats]) -> Table:
    table = Table(title="Per GPU", title_justify="left", show_edge=False)
    for col in ("GPU", "compute ms", "comm ms", "exposed comm ms", "idle ms", "peak memory"):
        table.add_column(col, justify="right")
    shown = rows if len(rows) <= MAX_GPU_ROWS else rows[:4] + rows[-4:]
    for i, g in enumerate(shown):
        if len(rows) > MAX_GPU_ROWS and i == 4:
            table.add_row(f"… {len(rows) - 8} more", "", "", "", "", "")
        table.add_row(
            str(g.gpu), f"{g.compute_ms:.4f}", f"{g.comm_ms:.4f}", f"{g.exposed_comm_ms:.4f}",
            f"{g.idle_ms:.4f}", human_bytes(g.peak_memory_bytes),
        )
    if len(rows) > 1:
        n = len(rows)
        table.add_row(
            "mean", f"{sum(g.compute_ms for g in rows) / n:.4f}", f"{sum(g.comm_ms for g in rows) / n:.4f}",
            f"{sum(g.exposed_comm_ms for g in rows) / n:.4f}", f"{sum(g.idle_ms for g in rows) / n:.4f}",
            human_bytes(max(g.peak_memory_bytes for g in rows)) + " max", style="bold",
        )
    return table


def honesty_notes(result: Result) -> list[str]:
    """What a reader must know before trusting the number: CPU-measured op times, an assumed batch."""
    notes = []
    if result.extra.get("time_source") == "cpu":
        notes.append("op times measured on CPU, not on a GPU (meta.json: time_source cpu)")
    if result.extra.get("batch_source") == "assumed":
        notes.append(f"trace batch {result.extra.get('batch_size')} assumed: no meta.json and no --batch-size")
    return notes


def print_summary(result: Result, console: Console, title: str = "") -> None:
    s, p = result.strategy, result.platform
    head = (
        f"[bold]{title}[/bold]\n" if title else ""
    ) + (
        f"case {s.case} · {s.name} · {p.num_gpus} GPU{'s' if p.num_gpus > 1 else ''} ({p.topology})"
        f"{' · reference-compat' if s.reference_compat else ''}\n"
        f"[bold green]Iteration time: {result.makespan_ms:.4f} ms[/bold green]"
        f"   ({len(result.graph):,} tasks, {result.graph.num_edges:,} edges)"
    )
    gpu = result.extra.get("gpu")
    if gpu:  # only with --gpu: a run without it prints what it always printed
        head = head.replace("\n[bold green]", f"\n[bold]{gpu['header']}[/bold]\n[bold green]", 1)
    notes = honesty_notes(result) + (list(gpu.get("notes", [])) if gpu else [])
    if notes:
        head += "\n" + "\n".join(f"[bold yellow]{n}[/bold yellow]" for n in notes)
    memory = result.extra.get("memory")
    if memory:
        line = verdict_line(memory)
        head += "\n" + (f"[bold red]{line}[/bold red]" if line else
                        f"memory fits: peak {human_bytes(memory['worst']['peak_bytes'])} of "
                        f"{memory['capacity_of']}'s {human_bytes(memory['capacity_bytes'])}"
                        if memory.get("worst") else "memory fits")
    console.print(Panel(head, title="triosim", expand=False))
    console.print(_gpu_table(result.per_gpu))
    if result.per_link:
        busiest = sorted(result.per_link, key=lambda k: (-k.busy_ms, k.link))[:6]
        table = Table(title="Busiest links", title_justify="left", show_edge=False)
        for col in ("link", "bytes", "busy ms", "utilization"):
            table.add_column(col, justify="right")
        for k in busiest:
            table.add_row(k.link, human_bytes(k.bytes), f"{k.busy_ms:.4f}", f"{k.utilization * 100:.1f}%")
        console.print(table)
    meta = result.graph.meta
    if "buckets" in meta:
        sizes = [b["bytes"] for b in meta["buckets"]]
        console.print(f"DDP: {len(sizes)} gradient bucket(s), {human_bytes(sum(sizes))} in all, "
                      f"largest {human_bytes(max(sizes, default=0))}")
    if "tensor_parallel" in meta:
        tp = meta["tensor_parallel"]
        console.print(f"Tensor parallel: {tp.get('sharded_ops', 0)} sharded op(s), {tp.get('collectives', 0)} "
                      f"collective(s): all-gather {human_bytes(tp.get('all_gather_bytes', 0))}, "
                      f"all-reduce {human_bytes(tp.get('all_reduce_bytes', 0))}")
    hybrid_tp = meta.get("hybrid", {})
    if hybrid_tp.get("tp_style"):  # --tp > 1: which tensor-parallel scheme ran, and why
        if hybrid_tp.get("tp_fallback_reason"):
            console.print(f"Tensor parallel: per-op scheme ({hybrid_tp['tp_fallback_reason']})")
        elif hybrid_tp["tp_style"] == "megatron":
            console.print(f"Tensor parallel: megatron, {hybrid_tp.get('tp_blocks', 0)} transformer block(s) "
                          "split column-then-row")
        else:
            console.print("Tensor parallel: per-op scheme")
    if hybrid_tp:
        _print_hybrid(console, meta.get("parallel", {}), hybrid_tp)
    if "pipeline" in meta:
        pp = meta["pipeline"]
        mbs = pp.get("micro_batches", [])
        console.print(f"Pipeline: {pp.get('schedule')} schedule, {len(mbs)} micro-batch(es) of {mbs[:1] and mbs[0]}, "
                      f"{pp.get('partition')} partition")
        for st in pp.get("stages", []):
            console.print(f"  stage {st['stage']} · GPU {st['gpu']} · ops {st['first_op']}–{st['last_op']} "
                          f"({st['forward_ops']} fwd + {st['backward_ops']} bwd) · {st['compute_ms']:.3f} ms compute")
        for note in pp.get("warnings", []):
            console.print(f"  [yellow]warning:[/yellow] {note}")
    if meta.get("collectives"):
        parts = [f"{row['op'].replace('_', '-')} {row['algo']} ×{row['calls']}" for row in meta["collectives"].values()]
        console.print("Collectives: " + ", ".join(parts))
    mem = meta.get("memory", {})
    fetched = sum(m.get("fetched_bytes", 0) for m in mem.values())
    wb = sum(m.get("written_back_bytes", 0) for m in mem.values())
    ev = sum(m.get("evictions", 0) for m in mem.values())
    if fetched or wb or ev:
        console.print(
            f"Remote memory: fetched {human_bytes(fetched)}, written back {human_bytes(wb)}, {ev} eviction(s)"
        )


def _print_hybrid(console: Console, parallel: dict, hybrid: dict) -> None:
    """A hybrid run's mesh, its collectives per group kind and each stage's memory by role."""
    built = "one representative pipeline" if hybrid.get("representatives") else "every GPU"
    console.print(f"Hybrid: dp {parallel.get('dp')} × tp {parallel.get('tp')} × pp {parallel.get('pp')} = "
                  f"{hybrid.get('gpus')} GPUs (ranks {hybrid.get('rank_order')}), ZeRO-{parallel.get('zero', 0)}, "
                  f"built {built}")
    for kind, c in hybrid.get("collectives_dp0_tp0", {}).items():
        console.print(f"  {kind.upper()} groups (one pipeline): {c['collectives']} collective(s), "
                      f"{human_bytes(c['payload_bytes'])} payload, {human_bytes(c['wire_bytes_per_gpu'])} sent per GPU")
    for warning in hybrid.get("pipeline_warnings", []):
        console.print(f"  [yellow]pipeline:[/yellow] {warning}")
    if hybrid.get("replica_warning"):
        console.print(f"  [yellow]representatives:[/yellow] {hybrid['replica_warning']}")
    table = Table(title="Memory per GPU by role", title_justify="left", show_edge=False)
    # ZeRO-3's gathered (whole) parameters at the peak get a column when there are any
    gathered = any(m.get("gathered_params_bytes") for m in hybrid.get("memory", []))
    for col in ("stage", "GPU", "weights", "gradients", "optimizer", *(("gathered params",) if gathered else ()),
                "rest of peak", "peak"):
        table.add_column(col, justify="right")
    for m in hybrid.get("memory", []):
        extra = (human_bytes(m.get("gathered_params_bytes", 0)),) if gathered else ()
        table.add_row(str(m["stage"]), str(m["gpu"]), human_bytes(m["weights_bytes"]), human_bytes(m["gradients_bytes"]),
                      human_bytes(m["optimizer_bytes"]), *extra, human_bytes(m["activations_peak_bytes"]),
                      human_bytes(m["peak_bytes"]))
    console.print(table)
