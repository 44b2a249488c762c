"""The terminal summary of a simulation (rich): iteration time, per-GPU and per-link figures."""

from __future__ import annotations

import re

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from .dot_export import human_bytes
from .memory_verdict import verdict_line
from .result import GpuStats, Result, case_label
from .throughput import throughput_lines

MAX_GPU_ROWS = 16
FP8_WORDS = {"delayed": "delayed scaling", "current": "current scaling", "blockwise": "blockwise scaling",
             "mxfp8": "MXFP8"}


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


def breakdown_line(result: Result) -> str:
    """One line: where the mean GPU's iteration goes (the parts that are not zero)."""
    block = result.time_breakdown()
    mean = block.get("mean") if block else None
    if not mean:
        return ""
    names = {"exposed_tp_ms": "exposed TP", "exposed_cp_ms": "exposed CP", "exposed_ep_ms": "exposed EP (dispatch/combine)", "exposed_pp_ms": "exposed PP",
             "exposed_dp_ms": "exposed DP",
             "exposed_memory_ms": "exposed memory", "exposed_other_ms": "exposed other comm",
             "idle_ms": "idle/bubble"}
    parts = [f"{names.get(k, k[:-3])} {v:.4f}" for k, v in mean.items() if v > 0]
    line = "Time per GPU, mean (ms): " + " · ".join(parts)
    kinds = block.get("compute_by_kind")
    if kinds:  # the compute of those parts by kind of kernel
        words = {"gemm_ms": "GEMM", "fp8_casts_ms": "FP8 casts", "attention_ms": "attention", "other_ms": "other"}
        line += "\nCompute by kind, mean (ms): " + " · ".join(f"{words[k]} {v:.4f}" for k, v in kinds.items() if v > 0)
    return line


def overlaps_line(strategy, num_gpus: int) -> str | None:
    """What each parallel axis of a ``--dp/--tp/--pp`` run overlaps, as its switches say
    (Megatron-Core's defaults are off, which shapes the answer as much as any degree does)."""
    if not strategy.hybrid:
        return None
    dp, tp, pp = strategy.degrees(num_gpus)
    parts = []
    if dp * strategy.context_degree > 1:
        parts.append("gradient reduction " + ("per bucket during the backward" if strategy.overlap_grad_reduce
                                              else "after the backward (--overlap-grad-reduce off)"))
        if strategy.zero in (1, 2):
            parts.append("parameter all-gather " + ("during the next forward" if strategy.overlap_param_gather
                                                    else "after the optimizer (--overlap-param-gather off)"))
    if tp > 1 and strategy.sequence_parallel:
        table = getattr(strategy, "tp_comm_overlap_cfg", None)
        parts.append("TP communication " + ("chunked beside its GEMMs" if strategy.tp_comm_overlap
                                            else "exposed (--tp-comm-overlap off)")
                     + (f" as {table.source} sets it" if strategy.tp_comm_overlap and table is not None
                        and table.source else ""))
    if pp > 1:
        parts.append(f"pipeline sends {'blocking' if strategy.blocking_sends else 'overlapped'}"
                     + (" (--pipeline-send auto)" if strategy.pipeline_send == "auto" else ""))
    if getattr(strategy, "moe_a2a_overlap", False):
        parts.append("expert all-to-alls beside another micro-batch's compute (--moe-a2a-overlap)")
    return ("Overlaps: " + ", ".join(parts)) if parts else None


def defaults_line(defaults: list[dict]) -> str:
    """``defaults: -micro-batch-size 1 (…), --schedule 1f1b (…)``: the values a run filled in."""
    return "Megatron's defaults: " + ", ".join(f"{d['flag']} {d['value']} ({d['why']})" for d in defaults)


def print_summary(result: Result, console: Console, title: str = "") -> None:
    s, p = result.strategy, result.platform
    head = (
        f"[bold]{title}[/bold]\n" if title else ""
    ) + (
        f"{case_label(s)} · {p.num_gpus} GPU{'s' if p.num_gpus > 1 else ''} ({p.topology})"
        f"{' · reference-compat' if s.reference_compat else ''}\n"
        f"[bold green]Iteration time: {result.makespan_ms:.4f} ms[/bold green]"
        f"   ({len(result.graph):,} tasks, {result.graph.num_edges:,} edges)"
    )
    defaults = result.extra.get("defaults")
    if defaults:  # what the run chose for flags left out (Megatron's defaults), so no answer hides one
        head = head.replace("\n[bold green]", "\n" + defaults_line(defaults) + "\n[bold green]", 1)
    overlaps = overlaps_line(s, p.num_gpus)
    if overlaps:
        head = head.replace("\n[bold green]", "\n" + overlaps + "\n[bold green]", 1)
    precision = result.graph.meta.get("precision")
    if precision:  # only under a training dtype
        fp8 = precision.get("fp8")
        what = precision["dtype"] if not fp8 else (
            f"{precision['dtype']} with FP8 linear layers ({FP8_WORDS.get(fp8['recipe'], fp8['recipe'])}"
            f"{', FP8 parameter all-gather' if fp8['param_gather'] else ''})")
        opt = precision.get("optimizer")
        master = ", fp32 master weights" if precision["master_weights"] else ""
        if opt:  # the precision-aware optimizer
            kept = "fp32 master weights as 16-bit remainders" if opt["main_params_dtype"] == "fp32" else (
                f"{opt['main_params_dtype']} master weights")
            master = (f", {kept if opt['master_weight_bytes'] == 2 else 'fp32 master weights'}, Adam moments in "
                      f"{opt['exp_avg_dtype']}/{opt['exp_avg_sq_dtype']}, optimizer gradients in "
                      f"{opt['main_grads_dtype']}")
        head = head.replace("\n[bold green]", f"\ntraining in {what}, gradients reduced in "
                            f"{precision['grad_reduce_dtype']}{master}\n[bold green]", 1)
    gpu = result.extra.get("gpu")
    if gpu:  # only with --gpu: a run without it prints what it always printed
        head = head.replace("\n[bold green]", f"\n[bold]{gpu['header']}[/bold]\n[bold green]", 1)
    if result.extra.get("throughput"):
        head += "\n" + "\n".join(throughput_lines(result.extra["throughput"], gpu["display_name"] if gpu else None))
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
    line = breakdown_line(result)
    if line:
        console.print(line)
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
    rec = hybrid_tp.get("recompute") or {}
    if rec.get("mode", "none") != "none":
        console.print(f"Recomputation: {rec.get('label', rec['mode'])}, {rec['rerun_ops']} forward op(s) re-run in "
                      f"{rec['units']} unit(s), {rec['rerun_traced_s'] * 1e3:.2f} ms traced")
    off = hybrid_tp.get("offload")
    if off:
        per = off["bytes_per_layer"][0] if off["bytes_per_layer"] else 0
        console.print(f"Activation offload: {off['setting']} ({len(off['layers'])} layer(s)), {human_bytes(per)} a layer "
                      f"and micro-batch over the {off['host_link_gbps']:g} GB/s host link, host memory peak "
                      f"{human_bytes(off['host_peak_bytes'])}")
    if hybrid_tp:
        _print_hybrid(console, meta.get("parallel", {}), hybrid_tp, result.extra.get("batch_size_sim"))
    if "pipeline" in meta:
        _print_pipeline(console, result, meta["pipeline"])
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


def _print_hybrid(console: Console, parallel: dict, hybrid: dict, batch: int | None = None) -> None:
    """A hybrid run's mesh, its collectives per group kind and each stage's memory by role."""
    built = "one representative pipeline" if hybrid.get("representatives") else "every GPU"
    cp = parallel.get("cp") or 1
    with_cp = f" × cp {cp}" if cp > 1 else ""
    console.print(f"Hybrid: dp {parallel.get('dp')} × tp {parallel.get('tp')} × pp {parallel.get('pp')}{with_cp} = "
                  f"{hybrid.get('gpus')} GPUs (ranks {hybrid.get('rank_order')}), ZeRO-{parallel.get('zero', 0)}, "
                  f"built {built}")
    context = hybrid.get("context_parallel")
    if context:
        sent, held = context["exchange_bytes_per_layer"], context["exchange_buffers_per_layer"]
        console.print(f"  context parallel: cp {context['cp']} ({context['comm_type']}), sequence in "
                      f"{2 * context['cp']} chunks; per layer and rank: exchange {human_bytes(sent['forward'])} "
                      f"forward, {human_bytes(sent['backward'])} backward; buffers {human_bytes(held['forward'])} / "
                      f"{human_bytes(held['backward'])} while attention runs")
    experts = hybrid.get("expert_parallel")
    if experts:
        etp = f" × etp {experts['etp']}" if experts.get("etp", 1) > 1 else ""
        console.print(f"  expert parallel: ep {experts['ep']}{etp} × edp {experts['edp']} ({experts['dispatcher']}), "
                      f"{experts['local_experts']} of {experts['experts']} experts a GPU, top {experts['top_k']}; "
                      f"busiest rank {experts['busiest_rank_factor']:g}× the mean; per MoE layer and direction a "
                      f"rank exchanges {human_bytes(experts['routed_bytes_per_layer'])} of permuted tokens")
    for kind, c in hybrid.get("collectives_dp0_tp0", {}).items():
        console.print(f"  {kind.upper()} groups (one pipeline): {c['collectives']} collective(s), "
                      f"{human_bytes(c['payload_bytes'])} payload, {human_bytes(c['wire_bytes_per_gpu'])} sent per GPU")
    stages = parallel.get("pp") or 1
    if stages > 1 and hybrid.get("partition"):
        print_stage_cuts(console, hybrid)
    one = stages > 1 and hybrid.get("micro_batches") == 1
    if one:
        console.print(f"  [yellow]hint:[/yellow] {one_micro_batch_hint(stages, batch)}")
    for warning in fold_stage_warnings(hybrid.get("pipeline_warnings", []), drop_small=one):
        console.print(f"  [yellow]pipeline:[/yellow] {warning}")
    if hybrid.get("replica_warning"):
        console.print(f"  [yellow]representatives:[/yellow] {hybrid['replica_warning']}")
    if hybrid.get("representatives") and hybrid.get("collective_warning"):
        console.print(f"  [yellow]representatives:[/yellow] {hybrid['collective_warning']}")
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


def micro_batch_text(sizes: list[int], batch: int | None, compat: bool) -> str:
    """What the micro-batches are, adding up to the batch: ``4 micro-batches: 3 of 5 and 1 of 1
    (16 samples)``. Under --reference-compat, R = ⌊batch / micro-batch⌋ rounds, each 1/R of the
    batch, as the original runs them."""
    n = len(sizes)
    if compat and batch and sum(sizes) != batch:
        return (f"{n} micro-batches, each 1/{n} of the batch of {batch} (the original's ⌊{batch}/{sizes[0]}⌋ "
                "rounds)")
    counts: dict[int, int] = {}
    for m in sizes:
        counts[m] = counts.get(m, 0) + 1
    total = sum(sizes)
    if n == 1:
        return f"1 micro-batch of {total}"
    if len(counts) == 1:
        return f"{n} micro-batches of {sizes[0]} ({total} samples)"
    parts = " and ".join(f"{c} of {m}" for m, c in counts.items())
    return f"{n} micro-batches: {parts} ({total} samples)"


def one_micro_batch_hint(stages: int, batch: int | None) -> str:
    """The hint of a pipeline run in one micro-batch (-micro-batch-size not given)."""
    example = ""
    if batch and batch > 1:
        m = max(1, batch // stages)
        example = f" (e.g. -micro-batch-size {m}: {-(-batch // m)} micro-batches)"
    return ("one micro-batch, so the stages run one after another and no cut balances them: "
            f"set -micro-batch-size to pipeline them{example}")


_SMALL_STAGE = re.compile(r"^stage (\d+) holds ([\d.]+%) of the compute \(under ([\d.]+%)\): (.*)$")


def print_stage_cuts(console: Console, facts: dict) -> None:
    """How the pipeline stages were cut; cut at layers, the layers per stage as a Megatron layout
    string and, for a split other than the equal one, how it was chosen."""
    partition = facts["partition"]
    if partition != "layers":
        console.print(f"  stage cuts: {partition}")
        return
    split = facts.get("layer_split")
    rule = "Megatron-Core's layers per stage" if split else "Megatron-LM's: equal transformer layers per stage"
    console.print(f"  stage cuts: layers ({rule})")
    if facts.get("layout"):
        console.print(f"  layout: {facts['layout']} (E embedding, t transformer layer, L loss)")
    if split:
        console.print(f"  layer split: {split}")


def fold_stage_warnings(warnings: list[str], drop_small: bool = False) -> list[str]:
    """The plan's warnings with the small-stage ones (one per stage) folded into one line;
    ``drop_small``: leave them out (the one-micro-batch hint says why they are small)."""
    small = [m for m in map(_SMALL_STAGE.match, warnings) if m]
    out = [w for w in warnings if not _SMALL_STAGE.match(w)]
    if len(small) == 1 and not drop_small:
        out.insert(0, small[0].group(0))
    elif small and not drop_small:
        ids = ", ".join(m.group(1) for m in small)
        shares = ", ".join(m.group(2) for m in small)
        out.insert(0, f"stages {ids} hold {shares} of the compute (each under {small[0].group(3)}): "
                      f"{small[0].group(4)}")
    return out


def _stage_times(result: Result) -> dict[int, tuple[float, float]] | None:
    """Per pipeline stage, (forward + backward, optimizer) compute in ms as scheduled (every
    micro-batch at its own size); None where the graph does not mark its compute tasks' phase
    (the --reference-compat replay)."""
    graph = result.graph
    out: dict[int, list[float]] = {}
    for t, kind in enumerate(graph.kind):
        if kind != "compute":
            continue
        attrs = graph.attr_rows[t] or {}
        phase, stage = attrs.get("stage"), attrs.get("stage_index")
        if phase is None or stage is None:
            return None
        span = (result.schedule.end[t] - result.schedule.start[t]) * 1e3
        out.setdefault(stage, [0.0, 0.0])[1 if phase == "optimizer" else 0] += span
    return {s: (v[0], v[1]) for s, v in out.items()}


def _print_pipeline(console: Console, result: Result, pp: dict) -> None:
    """Case 4's section: the micro-batches as run, each stage's compute split into forward +
    backward and its share of the optimizer (the two add up to its GPU's compute in the Per-GPU
    table), and the plan's warnings folded."""
    mbs = list(pp.get("micro_batches", []))
    compat = result.strategy.reference_compat
    batch = result.extra.get("batch_size_sim") or (sum(mbs) if not compat else None)
    console.print(f"Pipeline: {pp.get('schedule')} schedule, {micro_batch_text(mbs, batch, compat)}, "
                  f"{pp.get('partition')} partition")
    if pp.get("layout"):
        console.print(f"  layout: {pp['layout']} (E embedding, t transformer layer, L loss)")
    if pp.get("layer_split"):
        console.print(f"  layer split: {pp['layer_split']}")
    stages = pp.get("stages", [])
    times = None if compat else _stage_times(result)
    for st in stages:
        head = f"  stage {st['stage']} · GPU {st['gpu']} · ops {st['first_op']}–{st['last_op']}"
        if times is None:
            console.print(head + f" ({st['forward_ops']} fwd + {st['backward_ops']} bwd) · "
                                 f"{st['compute_ms']:.3f} ms compute")
        else:
            fb, opt = times.get(st["stage"], (0.0, 0.0))
            console.print(head + f" · {st['forward_ops']} fwd + {st['backward_ops']} bwd: {fb:.3f} ms, "
                                 f"optimizer {opt:.3f} ms")
    if times is not None and stages:
        console.print("  fwd + bwd (every micro-batch) + optimizer share = the GPU's compute in Per GPU")
    one = len(mbs) == 1 and len(stages) > 1 and not compat
    if one:
        console.print(f"  [yellow]hint:[/yellow] {one_micro_batch_hint(len(stages), batch)}")
    for note in fold_stage_warnings(pp.get("warnings", []), drop_small=one):
        console.print(f"  [yellow]warning:[/yellow] {note}")
