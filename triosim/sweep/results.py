"""Sweep results: one row per configuration, speed-ups, result files kept current, the table.

Speed-up of a configuration = its training throughput (samples/s) / its baseline's, where the
baseline, shared by every case of one workload (trace and batch), is the fastest configuration
on the fewest GPUs: case 0 whenever it ran. Throughput, not iteration time: with data
parallelism the batch is per GPU, so N GPUs also process N times the samples.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..errors import ConfigError
from ..output import atomic_write_text, open_append_no_follow
from .execute import OK, Outcome
from .grid import NOT_APPLICABLE, Grid, Point, display_value, format_value
from .resume import Resumed, move_aside, partial_path

METRIC_COLUMNS = (
    "status",
    "reason",
    "makespan_ms",
    "speedup",
    "speedup_vs",
    "mean_compute_ms",
    "mean_exposed_comm_ms",
    "max_peak_memory_bytes",
    "tasks",
    "samples_per_s",
    "global_batch",
    "micro_batch",
    "micro_batches",
    "tokens_per_s",
    "tflops_per_gpu",
)
OUTPUT_SUFFIXES = (".csv", ".json")
# Columns only a sweep with --gpu (GPU_COLUMNS) or a memory verdict (MEMORY_COLUMNS) has: a sweep
# without them writes the files it always wrote.
GPU_COLUMNS = ("gpu", "op_time_source", "mfu")
MEMORY_COLUMNS = ("memory",)
INFEASIBLE = "infeasible"


def extra_columns(points: Iterable[Any]) -> tuple[str, ...]:
    """The GPU and memory columns the grid's points call for."""
    from ..config.gpu import GpuOptions

    options = [GpuOptions.of(p.namespace()) for p in points]
    return ((GPU_COLUMNS if any(o.given for o in options) else ())
            + (MEMORY_COLUMNS if any(o.verdict for o in options) else ()))


@dataclass(frozen=True)
class Row:
    point: Point
    outcome: Outcome
    speedup: float | None = None
    speedup_vs: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome.status == OK

    def record(self) -> dict[str, Any]:
        """Column → value (JSON-ready; axis values as parsed, metrics rounded)."""
        o = self.outcome
        return {
            **shown_values(self.point),
            "status": o.status,
            "reason": o.reason,
            "makespan_ms": o.makespan_ms,
            "speedup": self.speedup,
            "speedup_vs": self.speedup_vs,
            "mean_compute_ms": o.mean_compute_ms,
            "mean_exposed_comm_ms": o.mean_exposed_comm_ms,
            "max_peak_memory_bytes": o.max_peak_memory_bytes,
            "tasks": o.tasks,
            "samples_per_s": o.samples_per_s,
            "global_batch": o.global_batch,
            "micro_batch": o.micro_batch,
            "micro_batches": o.micro_batches,
            "tokens_per_s": o.tokens_per_s,
            "tflops_per_gpu": o.tflops_per_gpu,
            **({"gpu": o.gpu, "op_time_source": o.op_time_source, "mfu": o.mfu} if o.gpu is not None else {}),
            **({"memory": "fits" if o.fits else INFEASIBLE} if o.fits is not None else {}),
        }


def shown_values(point: Point) -> dict[str, Any]:
    """A point's columns as tables and result files show them: a hybrid point's ``case`` (n/a:
    -case does not apply to it) is the preset its composition equals, or the composition's name
    (``hybrid dp2×tp2``), as ``triosim run``'s JSON and summary label it."""
    values = dict(point.values)
    if "case" in values:
        label = _composition_label(point)
        if label is not None:
            values["case"] = label
    return values


def _composition_label(point: Point) -> int | str | None:
    from ..config.parallel_flags import degrees_given, parallel_options
    from ..errors import TriosimError
    from ..graph.strategy import Strategy
    from ..report.result import case_of

    ns = _run_namespace(point)
    if not degrees_given(ns):
        return None
    mb = getattr(ns, "micro_batch_size", None)
    try:
        strategy = Strategy(micro_batch_size=None if mb in (None, -1) else mb, **parallel_options(ns))
    except TriosimError:  # an invalid point: its row says why
        return None
    case = case_of(strategy)
    return strategy.name if case is None else case


# The flags that define the workload (model, batch, timing model): speed-ups compare
# configurations of one workload only.
WORKLOAD_FLAGS = ("trace_dir", "batch_size", "batch_size_sim", "global_batch", "time_column", "reference_compat")


def _gpus_used(row: Row) -> int:
    """GPUs the configuration ran on (case 0: one; a hybrid run: dp × tp × pp × cp)."""
    from ..config.parallel_flags import degrees_given, resolve_gpus

    ns = _run_namespace(row.point)
    if not degrees_given(ns) and row.point.get("case") == 0:
        return 1
    return resolve_gpus(ns)


def _run_namespace(point: Point) -> argparse.Namespace:
    """The point's flags with the data-parallel size ``run`` derives (``-GPUnumber 8 --tp 2``
    without ``--dp`` is dp 4, as Megatron derives it) and the recomputation its details imply,
    so a row is counted and labelled as it ran."""
    from ..config.defaults import default_recompute, derive_data_parallel
    from ..errors import TriosimError

    ns = point.namespace()
    try:
        derive_data_parallel(ns)
        default_recompute(ns)
    except TriosimError:  # the row's own check names it; nothing derived
        pass
    return ns


def _baseline_label(row: Row) -> str:
    from ..config.parallel_flags import degrees_given

    ns = _run_namespace(row.point)
    if degrees_given(ns):
        degrees = " × ".join(f"{k}{getattr(ns, k)}" for k in ("dp", "tp", "pp", "cp", "ep")
                             if getattr(ns, k, None) is not None)
        return f"{degrees}, {_gpus_text(_gpus_used(row))}"
    case = row.point.get("case")
    return "case 0" if case == 0 else f"case {case}, {_gpus_text(_gpus_used(row))}"


def _gpus_text(n: int) -> str:
    return "1 GPU" if n == 1 else f"{n} GPUs"


def with_speedups(rows: Sequence[Row]) -> list[Row]:
    """Rows (grid order kept) with ``speedup``/``speedup_vs`` filled in where a baseline ran.

    One baseline per workload, shared by every case: the fastest configuration on the fewest
    GPUs (case 0 counts as one GPU, so it is the baseline whenever it ran). Speed-up = samples/s
    over the baseline's samples/s.
    """
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        if row.ok and row.outcome.samples_per_s:
            groups.setdefault(_workload(row), []).append(row)
    bases = {key: min(group, key=lambda r: (_gpus_used(r), -r.outcome.samples_per_s, r.point.index))
             for key, group in groups.items()}
    out = []
    for row in rows:
        base = bases.get(_workload(row)) if row.ok and row.outcome.samples_per_s else None
        if base is None:
            out.append(replace(row, speedup=None, speedup_vs=""))
            continue
        # Throughput, not iteration time: N data-parallel replicas train N batches per iteration.
        speedup = round(row.outcome.samples_per_s / base.outcome.samples_per_s, 6)
        out.append(replace(row, speedup=speedup, speedup_vs=_baseline_label(base)))
    return out


def _workload(row: Row) -> tuple:
    config = dict(row.point.config)
    return tuple(config.get(d) for d in WORKLOAD_FLAGS)


# ----------------------------------------------------------------------------- files


def _cell(value: Any) -> str:
    return format_value(value)


def _csv_line(values: Iterable[Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_cell(v) for v in values])
    return buf.getvalue()


def check_outputs(paths: Sequence[str], protect: Sequence[Path] = ()) -> None:
    """Fail before running anything if an output could not be written."""
    for p in paths:
        path = Path(p)
        if path.suffix.lower() not in OUTPUT_SUFFIXES:
            raise ConfigError(f"--out {p}: the name must end in .csv or .json")
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise ConfigError(f"--out {p}: output directory {parent} does not exist")
        if path.is_dir():
            raise ConfigError(f"--out {p}: is a directory; give a file name")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"--out {p}: cannot write into {parent} (permission denied)")
        for q in (path, partial_path(path)):
            if q.exists() and any(q.resolve() == Path(r).resolve() for r in protect):
                raise ConfigError(f"--out {p}: refusing to overwrite an input file with an output")


def result_columns(columns: Sequence[str], extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The columns of the result files: the grid's, the metrics, then the GPU/memory ones."""
    return tuple(dict.fromkeys((*columns, *METRIC_COLUMNS, *extra)))


class ResultFiles:
    """``--out`` files: the target is replaced only by a complete sweep, atomically.

    While the sweep runs, its rows go to ``NAME.partial`` beside each target: CSV with the
    header first, then each row appended and flushed as it arrives (completion order); JSON
    rewritten atomically (temp file + rename) at most every ``json_every_s``. ``finish``
    writes every row in grid order with the speed-ups: over the target (atomically, then the
    partial file is removed) when the sweep completed, else into the partial file, leaving the
    target as it was. A killed sweep thus never damages an earlier results file.

    A partial file already there (an interrupted sweep's) is moved aside to ``NAME.partial.N``
    (``moved`` lists them), unless ``resumed`` says its rows were read back for this sweep: then
    the new partial file starts with those rows (``kept``). The CSV partial file is created
    atomically (``O_EXCL | O_NOFOLLOW`` temp file, renamed into place) and appended to with
    ``O_NOFOLLOW``: a symlink planted under its name is never followed.
    """

    def __init__(self, paths: Sequence[str], columns: Sequence[str], meta: dict[str, Any],
                 protect: Sequence[Path] = (), json_every_s: float = 1.0, extra: Sequence[str] = (),
                 resumed: Resumed | None = None, kept: Sequence[Row] = ()) -> None:
        self.columns = result_columns(columns, extra)
        self.meta = meta
        self.protect = tuple(protect)
        self.csv_paths = [p for p in paths if Path(p).suffix.lower() == ".csv"]
        self.json_paths = [p for p in paths if Path(p).suffix.lower() == ".json"]
        self.json_every_s = json_every_s
        self._rows: dict[int, Row] = {r.point.index: r for r in kept}
        self._handles: list[io.TextIOBase] = []
        self._last_json = 0.0
        self.resumed = resumed
        self.moved: list[tuple[Path, Path]] = []

    def __enter__(self) -> ResultFiles:
        # Rows an interrupted sweep left are never truncated: read back (--resume) or set aside.
        replace_old = self.resumed is not None and not self.resumed.foreign
        for p in (*self.csv_paths, *self.json_paths):
            part = partial_path(p)
            if os.path.lexists(part) and not (replace_old and part in self.resumed.read):
                self.moved.append((part, move_aside(part)))
        kept = [self._rows[i] for i in sorted(self._rows)]
        text = _csv_line(self.columns) + "".join(_csv_line(r.record().get(c) for c in self.columns) for r in kept)
        for p in self.csv_paths:
            try:
                atomic_write_text(partial_path(p), text, protect=self.protect, flag="--out")
                fh = open_append_no_follow(partial_path(p))
            except OSError as exc:
                self.close()
                raise ConfigError(f"--out {p}: cannot write {partial_path(p)} ({exc.strerror})") from None
            except BaseException:
                self.close()
                raise
            self._handles.append(fh)
        self._write_json(complete=False)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fh in self._handles:
            fh.close()
        self._handles = []

    def add(self, row: Row) -> None:
        if row.point.index in self._rows:  # a resumed row: already in the partial file
            self._rows[row.point.index] = row
            return
        self._rows[row.point.index] = row
        line = _csv_line(row.record().get(c) for c in self.columns)
        for fh in self._handles:
            fh.write(line)
            fh.flush()
        if self.json_paths and time.monotonic() - self._last_json >= self.json_every_s:
            self._write_json(complete=False)

    def _json_text(self, rows: Sequence[Row], complete: bool) -> str:
        doc = {**self.meta, "complete": complete, "columns": list(self.columns),
               "rows": [r.record() for r in rows]}
        return json.dumps(doc, indent=1) + "\n"

    def _write_json(self, complete: bool, rows: Sequence[Row] | None = None, final: bool = False) -> None:
        if not self.json_paths:
            return
        if rows is None:
            rows = [self._rows[i] for i in sorted(self._rows)]
        text = self._json_text(rows, complete)
        for p in self.json_paths:
            atomic_write_text(p if final else partial_path(p), text, protect=self.protect)
        self._last_json = time.monotonic()

    def finish(self, rows: Sequence[Row], complete: bool) -> None:
        """Final files: every row given, in grid order, written atomically; over the targets
        when ``complete``, else into the partial files."""
        self.close()
        ordered = sorted(rows, key=lambda r: r.point.index)
        text = _csv_line(self.columns) + "".join(
            _csv_line(r.record().get(c) for c in self.columns) for r in ordered
        )
        for p in self.csv_paths:
            atomic_write_text(p if complete else partial_path(p), text, protect=self.protect)
        self._write_json(complete, ordered, final=complete)
        if complete:
            for p in (*self.csv_paths, *self.json_paths):
                partial_path(p).unlink(missing_ok=True)

    def written(self, complete: bool) -> list[Path]:
        """The files ``finish`` wrote (targets, or partial files after an interrupt)."""
        paths = [*self.csv_paths, *self.json_paths]
        return [Path(p) if complete else partial_path(p) for p in paths]


# ----------------------------------------------------------------------------- terminal


def _num(x: float | None, fmt: str = "{:.4f}") -> str:
    return "" if x is None else fmt.format(x)


def _bytes(n: int | None) -> str:
    if n is None:
        return ""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


# What the sweep can rank by: column -> True when larger is better.
RANK_COLUMNS = {
    "samples_per_s": True,
    "tokens_per_s": True,
    "tflops_per_gpu": True,
    "mfu": True,
    "makespan_ms": False,
    "max_peak_memory_bytes": False,
    "mean_exposed_comm_ms": False,
}


def ranked(rows: Sequence[Row], rank_by: str = "samples_per_s") -> list[Row]:
    """ok rows best first by ``rank_by`` (grid order breaks ties), then failed, then invalid.

    The default is training throughput: data parallelism trains a batch per GPU per iteration,
    tensor and pipeline parallelism one batch, so iteration times alone do not compare them.
    """
    if rank_by not in RANK_COLUMNS:
        raise ConfigError(f"--rank-by must be one of {', '.join(RANK_COLUMNS)}, got {rank_by!r}")
    sign = -1.0 if RANK_COLUMNS[rank_by] else 1.0
    status = {"ok": 0, "failed": 1, "invalid": 2}

    def key(r: Row) -> tuple:
        value = getattr(r.outcome, rank_by) if r.ok else None
        return (status.get(r.outcome.status, 3), value is None, sign * value if value is not None else 0.0,
                r.point.index)

    return sorted(rows, key=key)


def print_table(console: Console, grid: Grid, rows: Sequence[Row], top: int, title: str = "",
                rank_by: str = "samples_per_s") -> None:
    """The sweep's answer: configurations ranked by ``rank_by`` (throughput by default), the best
    highlighted."""
    shown_axes = grid.swept or grid.axes
    shown = [a.spec.name for a in shown_axes]
    order = ranked(rows, rank_by)
    ok = [r for r in order if r.ok]
    bad = [r for r in order if not r.ok]
    fixed = ", ".join(f"{a.spec.name}={_short(display_value(a.spec, a.values[0]))}" for a in grid.fixed
                      if grid.swept and a.spec.dest != "trace_dir")
    bases = sorted({r.speedup_vs for r in ok if r.speedup_vs})
    caption = (f"ranked by {rank_by}; speed-up: training throughput (samples/s) ÷ that of "
               f"{' / '.join(bases)}; data-parallel GPUs each train their own batch") if bases else None
    def ok_table(metrics: Sequence[str]) -> Table:
        table = Table(title=(title + (f" · {fixed}" if fixed else "")) or None, title_justify="left",
                      caption=caption, caption_justify="left", show_edge=False, pad_edge=False)
        table.add_column("#", justify="right", no_wrap=True)
        for name in shown:
            table.add_column(name, justify="right", min_width=min(len(name), 12))
        for col in metrics:
            table.add_column(col, justify="right", no_wrap=True)
        for rank, r in enumerate(ok[:top], start=1):
            vals = shown_values(r.point)
            cells = _metric_cells(r)
            infeasible = r.outcome.fits is False  # over a GPU's memory: a time, but no answer
            table.add_row(("★" if rank == 1 else "") + str(rank) + (" ✗" if infeasible else ""),
                          *(_short(vals[n]) for n in shown), *(cells[c] for c in metrics),
                          style="red" if infeasible else "bold green" if rank == 1 else None)
        if len(ok) > top:
            table.add_row("…", *([""] * len(shown)), f"+{len(ok) - top}", *([""] * (len(metrics) - 1)))
        return table

    # Drop the least important figures (they are all in the results file) until the table fits.
    metrics = list(_METRIC_HEADERS)
    while len(metrics) > 2 and _table_width(ok[:top], shown, metrics) > console.width:
        metrics.pop()
    table = ok_table(metrics)
    if ok:
        console.print(table)
    if bad:
        t2 = Table(title="Not simulated", title_justify="left", show_edge=False, pad_edge=False)
        for name in shown:
            t2.add_column(name, justify="right", min_width=min(len(name), 12))
        t2.add_column("status")
        t2.add_column("reason", overflow="fold")
        for r in bad[:top]:
            vals = shown_values(r.point)
            t2.add_row(*(_short(vals[n]) for n in shown), r.outcome.status, r.outcome.reason,
                       style="red" if r.outcome.status == "failed" else "yellow")
        if len(bad) > top:
            t2.add_row(*([""] * len(shown)), "…", f"{len(bad) - top} more in the results file")
        console.print(t2)
    over = sum(1 for r in ok if r.outcome.fits is False)
    if over:
        console.print(f"[red]✗ {over} configuration{'s' if over != 1 else ''} do{'es' if over == 1 else ''} not fit "
                      f"in GPU memory ({INFEASIBLE} in the results' memory column)[/red]")
    counts = {s: sum(1 for r in rows if r.outcome.status == s) for s in ("ok", "invalid", "failed")}
    line = f"{len(rows)} configurations: {counts['ok']} ok, {counts['invalid']} invalid, {counts['failed']} failed"
    if ok:
        best = " ".join(f"{n}={_short(shown_values(ok[0].point)[n])}" for n in shown) if grid.swept else "defaults"
        line += f"; best by {rank_by}: {best} → {best_figures(ok[0])}"
    console.print(line)


def best_figures(r: Row) -> str:
    o = r.outcome
    sps = f"{o.samples_per_s:,.1f} samples/s, " if o.samples_per_s else ""
    return f"{sps}{o.makespan_ms:.4f} ms"


_METRIC_HEADERS = ("samples/s", "iter ms", "speed-up", "exp.comm", "compute", "peak mem", "tasks")


def _metric_cells(r: Row) -> dict[str, str]:
    o = r.outcome
    return {
        "samples/s": _num(o.samples_per_s, "{:,.1f}"),
        "iter ms": _num(o.makespan_ms),
        "speed-up": _num(r.speedup, "{:.3f}"),
        "exp.comm": _num(o.mean_exposed_comm_ms, "{:.2f}"),
        "compute": _num(o.mean_compute_ms, "{:.2f}"),
        "peak mem": _bytes(o.max_peak_memory_bytes),
        "tasks": f"{o.tasks:,}" if o.tasks is not None else "",
    }


def _table_width(rows: Sequence[Row], axes: Sequence[str], metrics: Sequence[str]) -> int:
    """Characters the ranked table needs without wrapping a number (3 per column for rules)."""
    width = 3 + len(str(len(rows)))
    for name in axes:
        cells = [len(_short(shown_values(r.point)[name])) for r in rows]
        width += 3 + max([min(len(name), 12), *cells])
    for col in metrics:
        width += 3 + max([len(col), *(len(_metric_cells(r)[col]) for r in rows)])
    return width


def _short(value: Any) -> str:
    """Terminal spelling of a value: paths by their last component."""
    text = format_value(value)
    is_path = isinstance(value, str) and value != NOT_APPLICABLE and ("/" in text or os.sep in text)
    return Path(text).name if is_path else text
