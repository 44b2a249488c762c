"""What a plan shows and writes: the ranked table, the ``triosim run`` line reproducing each
configuration, a CSV of every candidate (infeasible ones with the reason), the Pareto
set of time against memory and a plot of them.

Throughput is tokens per second (global batch × sequence length / iteration time; samples per
second when the sequence length is unknown). MFU is model FLOPs utilisation, as ``triosim run``
reports it: model FLOPs of the iteration (3 × the forward's matrix-unit FLOPs per sample × the
global batch, recomputation not counted: :mod:`triosim.compute.model_flops`) over the GPUs'
dense matrix peak × the time.
"""

from __future__ import annotations

import csv
import io
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..output import atomic_write, atomic_write_text
from ..sweep.execute import OK
from .estimate import fmt_bytes
from .pareto import pareto_set, time_and_memory
from .search import Row


@dataclass(frozen=True)
class Figures:
    """What turns a time into throughput and MFU."""

    gpus: int
    global_batch: int
    seq_len: int | None
    model_flops: float | None  # per iteration
    peak_flops: float | None
    global_flag: bool = True  # `triosim run` has --global-batch (else the run lines give -batch-size-sim)

    def tokens_per_s(self, seconds: float) -> float | None:
        if not seconds > 0:
            return None
        return self.global_batch * (self.seq_len or 1) / seconds

    def mfu(self, seconds: float) -> float | None:
        if not seconds > 0 or self.peak_flops is None or not self.model_flops:
            return None
        return self.model_flops / (self.gpus * self.peak_flops * seconds)

    @property
    def throughput_unit(self) -> str:
        return "tokens/s" if self.seq_len else "samples/s"


def run_line(base_flags: Sequence[str], row: Row, figures: Figures) -> str:
    """``triosim run …`` reproducing ``row``'s configuration."""
    flags = row.candidate.run_flags(figures.global_batch, figures.global_flag)
    return shlex.join(["triosim", "run", *base_flags, *flags])


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:,.2f}"


def _gb(nbytes: float | None) -> str:
    return "—" if nbytes is None else fmt_bytes(nbytes)


def _schedule(c) -> str:
    """The schedule with its pipeline layout where that is not the equal split."""
    return c.schedule_label + (f" ({c.layout_label})" if c.split.given else "")


def dag_seconds(row: Row) -> float | None:
    d = row.dag
    return d.makespan_ms / 1e3 if d is not None and d.status == OK and d.makespan_ms is not None else None


def print_table(console: Console, ranked: Sequence[Row], figures: Figures, base_flags: Sequence[str],
                limit: int, title: str) -> None:
    """The best ``limit`` rows with both times, then the command line of each."""
    table = Table(title=title, title_justify="left")
    for name in ("#", "mesh", "micro-batch", "schedule", "ZeRO", "recompute", "SP", "estimate ms", "DAG ms",
                 "est. error", figures.throughput_unit, "MFU", "est. memory", "DAG memory"):
        table.add_column(name, justify="right" if name not in ("mesh", "schedule", "recompute") else "left")
    shown = list(ranked[:limit])
    for k, row in enumerate(shown, 1):
        c, e = row.candidate, row.estimate
        dag = dag_seconds(row)
        t = dag if dag is not None else e.time_s
        err = f"{(e.time_s / dag - 1) * 100:+.1f} %" if dag else "—"
        tps = figures.tokens_per_s(t)
        mfu = figures.mfu(t)
        dag_peak = row.dag.max_peak_memory_bytes if dag is not None and row.dag.max_peak_memory_bytes else None
        m = (figures.global_batch // c.dp) // c.micro_batch
        table.add_row(str(k), c.mesh, f"{c.micro_batch} × {m}", _schedule(c), str(c.zero), c.recompute_label,
                      "on" if c.sequence_parallel else "off", _ms(e.time_s), _ms(dag), err,
                      "—" if tps is None else f"{tps:,.0f}", "—" if mfu is None else f"{mfu * 100:.1f} %",
                      _gb(e.peak_bytes), _gb(dag_peak))
    console.print(table)
    for k, row in enumerate(shown, 1):
        console.print(f"{k:>3}  {run_line(base_flags, row, figures)}", soft_wrap=True)


def print_pareto(console: Console, ranked: Sequence[Row], limit: int) -> None:
    """The Pareto set of time against peak memory (the DAG's figures where timed), fastest first."""
    front = pareto_set(ranked)
    rank_of = {id(r): k for k, r in enumerate(ranked, 1)}
    table = Table(title=f"Pareto set, time against peak memory per GPU: {len(front)} configuration"
                        + ("s" if len(front) != 1 else "") + (f" (the {limit} fastest shown)" if len(front) > limit else ""),
                  title_justify="left")
    for name in ("#", "mesh", "micro-batch", "schedule", "ZeRO", "recompute", "SP", "ms", "peak memory", "from"):
        table.add_column(name, justify="right" if name not in ("mesh", "schedule", "recompute", "from") else "left")
    for row in front[:limit]:
        c = row.candidate
        t, mem = time_and_memory(row)
        table.add_row(str(rank_of[id(row)]), c.mesh, str(c.micro_batch), _schedule(c), str(c.zero),
                      c.recompute_label,
                      "on" if c.sequence_parallel else "off", _ms(t), _gb(mem),
                      "DAG" if dag_seconds(row) is not None else "estimate")
    console.print(table)


CSV_COLUMNS = ("rank", "status", "reason", "dp", "tp", "pp", "cp", "ep", "etp", "dispatcher", "overlaps", "fp8_recipe", "micro_batch", "micro_batches", "schedule",
               "virtual_stages", "layout", "zero", "recompute", "recompute_method", "recompute_num_layers", "recompute_modules",
               "offload", "sequence_parallel", "estimate_ms", "pipeline_ms", "bubble_ms",
               "dp_exposed_ms", "optimizer_ms", "estimate_peak_memory_bytes", "dag_ms", "dag_peak_memory_bytes",
               "throughput", "mfu", "command", "pareto")


def _recompute_detail(c) -> list:
    """The CSV's recompute_method, recompute_num_layers (full), recompute_modules (selective, joined
    by +) and offload cells; empty where they do not apply."""
    full, selective = c.recompute == "full", c.recompute == "selective"
    return [c.recompute_method if full else "", c.recompute_num_layers if full else "",
            "+".join(c.recompute_modules) if selective else "", c.offload or ""]


def _overlaps(c) -> str:
    """The CSV's overlaps cell: the data-parallel overlaps the plan tried (empty: the run's own)."""
    if not c.overlaps:
        return ""
    return "grad-reduce+param-gather" if c.gathers_overlapped else "grad-reduce"


def _status(row: Row) -> str:
    if row.error is not None:
        return "error"
    if row.estimate is None:
        return "not estimated"
    if row.dag is None:
        return "estimated" if row.estimate.fits else "infeasible"
    if row.dag.status != OK:
        return f"dag {row.dag.status}"
    return "dag" if row.dag.fits is not False else "dag: does not fit"


def csv_text(rows: Sequence[Row], ranked: Sequence[Row], figures: Figures, base_flags: Sequence[str]) -> str:
    """One line per candidate, in rank order, then the unranked (infeasible, failed) ones."""
    position = {id(r): k for k, r in enumerate(ranked, 1)}
    front = {id(r) for r in pareto_set(ranked)}
    order = list(ranked) + [r for r in rows if id(r) not in position]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)

    def num(x: float | None, scale: float = 1.0, digits: int = 6) -> str:
        return "" if x is None else f"{x * scale:.{digits}f}"

    for row in order:
        c, e = row.candidate, row.estimate
        dag = dag_seconds(row)
        t = dag if dag is not None else (e.time_s if e is not None and e.fits else None)
        w.writerow([
            position.get(id(row), ""), _status(row), row.reason or "", c.dp, c.tp, c.pp, c.cp, c.ep, c.etp,
            c.dispatcher or "", _overlaps(c), c.fp8_recipe or "", c.micro_batch,
            (figures.global_batch // c.dp) // c.micro_batch, c.schedule, c.virtual,
            c.layout_label if c.split.given else "", c.zero, c.recompute,
            *_recompute_detail(c), str(c.sequence_parallel).lower(),
            num(e.time_s if e else None, 1e3), num(e.pipeline_s if e else None, 1e3),
            num(e.bubble_s if e else None, 1e3), num(e.dp_exposed_s if e else None, 1e3),
            num(e.optimizer_s if e else None, 1e3), e.peak_bytes if e else "",
            num(dag, 1e3), row.dag.max_peak_memory_bytes if dag is not None else "",
            num(figures.tokens_per_s(t) if t else None, 1.0, 1), num(figures.mfu(t) if t else None, 1.0, 4),
            run_line(base_flags, row, figures), "true" if id(row) in front else "false",
        ])
    return buf.getvalue()


def write_csv(path: str, rows: Sequence[Row], ranked: Sequence[Row], figures: Figures, base_flags: Sequence[str],
              protect: Sequence[Path] = ()) -> None:
    atomic_write_text(path, csv_text(rows, ranked, figures, base_flags), protect=protect, flag="--out")


def write_plot(path: str, rows: Sequence[Row], ranked: Sequence[Row], figures: Figures,
               protect: Sequence[Path] = ()) -> None:
    """Iteration time against peak memory per GPU: every candidate that fits by its estimate,
    the DAG-timed ones marked, the Pareto set joined by a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    est = [(r.estimate.peak_bytes / 1e9, r.estimate.time_s * 1e3) for r in rows
           if r.feasible and dag_seconds(r) is None]
    timed = [(m / 1e9, t * 1e3) for m, t in ((time_and_memory(r)[1], time_and_memory(r)[0]) for r in ranked
                                            if dag_seconds(r) is not None)]
    front = [(time_and_memory(r)[1] / 1e9, time_and_memory(r)[0] * 1e3) for r in pareto_set(ranked)]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    if est:
        ax.scatter(*zip(*est), s=6, alpha=0.35, label="estimated")
    if timed:
        ax.scatter(*zip(*timed), s=28, marker="x", color="C3", label="DAG-timed")
    if front:
        ax.plot(*zip(*sorted(front)), color="C2", marker="o", ms=4, lw=1.2, drawstyle="steps-post",
                label="Pareto set")
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel("iteration time (ms)")
    ax.set_title(f"triosim plan: {figures.gpus} GPUs, global batch {figures.global_batch}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    suffix = Path(path).suffix.lstrip(".").lower() or "png"
    atomic_write(path, lambda fh: fig.savefig(fh, format=suffix), protect=protect, flag="--plot", binary=True)
    plt.close(fig)


__all__ = ["CSV_COLUMNS", "Figures", "csv_text", "dag_seconds", "print_pareto", "print_table", "run_line", "write_csv",
           "write_plot"]
