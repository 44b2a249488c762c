"""``triosim sweep``: many configurations of one training iteration, simulated and ranked.

A sweep answers "which of these configurations is fastest for my model on this interconnect?":
it expands a grid of ``triosim run`` flags (comma lists on the command line, or a YAML/JSON grid
file) into their cartesian product (a flag that does not apply to a configuration is collapsed),
settles the combinations ``run`` would refuse as *invalid* (with the reason), simulates the
others in-process, on a local process pool or on a Dask cluster, and reports every
configuration's throughput, iteration time, speed-up and summary figures as a table ranked by
throughput (``--rank-by``), CSV/JSON files kept valid while it runs, and a plot.

Python use::

    from triosim.sweep import FlagTable, build_grid, run_sweep
    grid = build_grid(FlagTable.from_cli(), cli_entries=[("case", [0, 1]), ("gpus", [2, 4])])
    result = run_sweep(grid, jobs=2)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from ..checks import positive
from ..config.inputs import input_files, refuse_outputs_over_inputs
from ..errors import ConfigError, TriosimError
from ..output import sigterm_as_interrupt
from .execute import (
    FAILED,
    INVALID,
    OK,
    Outcome,
    Prepared,
    check_dask_address,
    default_jobs,
    prepare,
    require_distributed,
    run_dask,
    run_inprocess,
    run_pool,
)
from .grid import (
    FlagTable,
    Grid,
    Point,
    build_grid,
    check_grid_size,
    format_value,
    read_grid_file,
    split_list,
)
from .results import (
    RANK_COLUMNS,
    ResultFiles,
    Row,
    check_outputs,
    extra_columns,
    partial_path,
    print_table,
    ranked,
    result_columns,
    shown_values,
    with_speedups,
)
from .resume import read_resumable

__all__ = [
    "FAILED",
    "INVALID",
    "OK",
    "FlagTable",
    "Grid",
    "Point",
    "Row",
    "SweepResult",
    "build_grid",
    "read_grid_file",
    "register",
    "run_sweep",
]

INPROCESS_MAX = 2  # a pool's start-up costs more than simulating this many configurations
PROGRESS_EVERY_S = 5.0  # progress lines on a stderr that is not a terminal (a log, CI)


@dataclass(frozen=True)
class SweepResult:
    """Every configuration's row in grid order; ``complete`` is False after an interrupt, and
    then ``rows`` holds only what had finished (plus the invalid ones)."""

    grid: Grid
    rows: tuple[Row, ...]
    complete: bool
    backend: str
    traces: tuple[str, ...]


@dataclass(frozen=True)
class Backend:
    kind: str  # "in-process", "pool" or "dask"
    jobs: int = 1
    address: str = ""
    timeout_s: float = 20.0

    def describe(self) -> str:
        if self.kind == "pool":
            return f"a local pool of {self.jobs} processes"
        if self.kind == "dask":
            return f"the Dask cluster at {self.address}"
        return "this process"


def choose_backend(n_tasks: int, jobs: int | None, dask: str | None, dask_timeout_s: float = 20.0) -> Backend:
    if dask:
        return Backend("dask", address=dask, timeout_s=dask_timeout_s)
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    if jobs == 1 or n_tasks <= INPROCESS_MAX:
        return Backend("in-process")
    return Backend("pool", jobs=min(jobs, n_tasks))


def run_sweep(
    grid: Grid,
    *,
    jobs: int | None = None,
    dask: str | None = None,
    dask_timeout_s: float = 20.0,
    on_row: Callable[[Row], None] | None = None,
    prepared: Prepared | None = None,
    on_start: Callable[[Prepared, Backend], None] | None = None,
    finished: Mapping[int, Outcome] | None = None,
) -> SweepResult:
    """Simulate every point of ``grid``; Ctrl-C stops early and returns what had finished.

    ``on_row`` sees each row as it is settled (invalid ones first, then in completion order);
    ``on_start`` is called once the backend is up and every configuration is submitted.
    ``finished`` (point index → outcome, from an interrupted sweep's rows: ``--resume``) are
    taken as they are and not simulated again.
    """
    check_grid_size(grid)
    points = grid.points()
    prepared = prepared if prepared is not None else prepare(points)
    finished = {i: o for i, o in (finished or {}).items() if i not in {s.index for s in prepared.settled}}
    if finished:
        prepared = replace(prepared, tasks=[t for t in prepared.tasks if t.index not in finished],
                           settled=sorted([*prepared.settled, *finished.values()], key=lambda o: o.index))
    backend = choose_backend(len(prepared.tasks), jobs, dask, dask_timeout_s)
    rows: dict[int, Row] = {}

    def take(outcome: Outcome) -> None:
        row = Row(points[outcome.index], outcome)
        rows[outcome.index] = row
        if on_row is not None:
            on_row(row)

    for outcome in prepared.settled:
        take(outcome)

    def ready() -> None:
        if on_start is not None:
            on_start(prepared, backend)

    complete = True
    try:
        if not prepared.tasks:
            ready()
        elif backend.kind == "dask":
            run_dask(backend.address, prepared.traces, prepared.tasks, take, backend.timeout_s, ready)
        elif backend.kind == "pool":
            run_pool(prepared.traces, prepared.tasks, backend.jobs, take, ready)
        else:
            run_inprocess(prepared.traces, prepared.tasks, take, ready)
    except KeyboardInterrupt:
        complete = False
    ordered = with_speedups([rows[i] for i in sorted(rows)])
    return SweepResult(grid, tuple(ordered), complete, backend.describe(), tuple(prepared.trace_dirs))


# ----------------------------------------------------------------------------- command line


class _AxisAction(argparse.Action):
    """Collects ``(dest, raw comma list)`` in command-line order: the grid's axis order."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        entries = list(getattr(namespace, "sweep_axes", ()) or ())
        entries.append((self.dest, values))
        namespace.sweep_axes = tuple(entries)


def register(sub: Any) -> None:
    """Add ``triosim sweep`` to the CLI's sub-parsers."""
    p = sub.add_parser(
        "sweep",
        help="simulate a grid of configurations and rank them by training throughput",
        description=(
            "Simulate the cartesian product of run flags given as comma lists (--case 1,2 "
            "--gpus 2,4,8) and/or a --grid YAML/JSON file; rank by samples/s (--rank-by)."
        ),
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in FlagTable.from_cli().specs:
        group = groups.get(spec.group)
        if group is None:
            group = groups[spec.group] = p.add_argument_group(f"{spec.group} (each flag takes a comma list)")
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if spec.is_bool else {}
        group.add_argument(*spec.options, dest=spec.dest, action=_AxisAction, default=argparse.SUPPRESS,
                           metavar="V[,V…]", help=spec.help, **extra)
    s = p.add_argument_group("sweep")
    s.add_argument("--grid", metavar="FILE", help="YAML/JSON mapping flag → list of values (or one fixed value)")
    s.add_argument("--jobs", "-j", type=int, default=None,
                   help="local worker processes (default: CPU count; 1 = in this process)")
    s.add_argument("--dask", metavar="ADDRESS",
                   help="run on a Dask cluster: scheduler address tcp://HOST:PORT or a scheduler file")
    s.add_argument("--dask-timeout", type=float, default=20.0, metavar="SECONDS",
                   help="how long to wait for the Dask scheduler to answer (20)")
    s.add_argument("--out", metavar="FILE", action="append", default=[],
                   help="results file, .csv or .json, kept valid while running (repeatable)")
    s.add_argument("--resume", action="store_true",
                   help="keep the finished rows an interrupted sweep left in each --out's NAME.partial file and "
                        "simulate only the configurations missing (without it, such a file is moved aside to "
                        "NAME.partial.1)")
    s.add_argument("--plot", metavar="FILE",
                   help="plot (.png/.svg/.pdf): --plot-y versus --plot-x, one line per other swept combination")
    s.add_argument("--plot-x", metavar="FLAG", default=None,
                   help="swept flag on the plot's x axis (default: gpus when swept, else the first swept flag)")
    s.add_argument("--plot-y", metavar="COLUMN[,COLUMN]", default="samples_per_s,speedup",
                   help="one panel per result column: samples_per_s, speedup, makespan_ms, mean_compute_ms, "
                        "mean_exposed_comm_ms, max_peak_memory_bytes (default: samples_per_s,speedup)")
    s.add_argument("--rank-by", default="samples_per_s", choices=tuple(RANK_COLUMNS),
                   help="table order: samples_per_s (training throughput, the default; highest first), "
                        "makespan_ms, max_peak_memory_bytes or mean_exposed_comm_ms (lowest first)")
    s.add_argument("--every-combination", action="store_true",
                   help="simulate the whole product, even flags that do not apply to a configuration "
                        "(--micro-batch-size for data parallelism, --gpus for case 0, …)")
    s.add_argument("--top", type=int, default=20, help="rows of the terminal table (20)")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress bar or table; one summary line")
    p.set_defaults(func=cmd_sweep, sweep_axes=())


def grid_from_args(args: argparse.Namespace) -> Grid:
    table = FlagTable.from_cli()
    file_entries = read_grid_file(args.grid) if args.grid else []
    cli_entries: list[tuple[str, Sequence[Any]]] = [(dest, split_list(raw)) for dest, raw in args.sweep_axes]
    return build_grid(table, file_entries, cli_entries, every_combination=args.every_combination)


def _title(traces: Sequence[str], rows: Sequence[Row] = ()) -> str:
    """The traces' names, and a warning when op times measured on a CPU were used (not when
    every configuration timed its ops on a --gpu by roofline or retarget)."""
    from ..trace import read_trace_info

    def cpu(t: str) -> bool:
        try:
            return read_trace_info(t).get("time_source") == "cpu"
        except TriosimError:
            return False

    names = ", ".join(Path(t).name for t in traces) or "sweep"
    ran = [r for r in rows if r.ok]
    measured = not ran or any(r.outcome.op_time_source in (None, "trace") for r in ran)
    return names + (" · op times measured on CPU" if measured and any(cpu(t) for t in traces) else "")


def cmd_sweep(args: argparse.Namespace) -> int:
    for flag, value in (("--grid", args.grid), ("--dask", args.dask), ("--plot", args.plot), ("--plot-x", args.plot_x),
                        ("--plot-y", args.plot_y)):
        if value is not None and not value.strip():  # "" would silently mean "not given"
            raise ConfigError(f"{flag} is empty; give a value or leave the flag out")
    grid = grid_from_args(args)
    if args.top < 1:
        raise ConfigError(f"--top must be >= 1, got {args.top}")
    if args.plot:
        from .plot import check_plot_axes, require_matplotlib

        require_matplotlib(args.plot)
        plot_x, plot_y = check_plot_axes(grid, args.plot_x, args.plot_y)
    positive(args.dask_timeout, "--dask-timeout", "seconds")  # NaN would wait forever
    if args.dask:
        require_distributed()
        check_dask_address(args.dask)  # before NAME.partial is created
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    err = Console(stderr=True, highlight=False, soft_wrap=True)  # status lines name paths: never broken
    out = Console(highlight=False)
    if not out.is_terminal:  # a pipe or file: room for the whole table rather than 80 columns
        out = Console(highlight=False, width=max(out.width, 132))
    args.out = list(dict.fromkeys(args.out))  # the same file named twice is written once
    if args.resume and not args.out:
        raise ConfigError("--resume needs --out FILE: it keeps the rows of FILE.partial")
    # every file the grid's configurations read, spared by the outputs before any work
    settings = {"grid": args.grid, **{a.spec.dest: a.values for a in grid.axes}}
    protect = input_files(settings)
    check_outputs(args.out)
    refuse_outputs_over_inputs(
        [*(("--out", o) for o in args.out), *(("--out", partial_path(o)) for o in args.out), ("--plot", args.plot)],
        settings)
    points = grid.points()
    prepared = prepare(points)
    columns = result_columns(grid.columns, extra_columns(points))
    resumed = read_resumable(args.out, columns, grid.columns, points) if args.resume else None
    if resumed is not None:
        settled = {o.index for o in prepared.settled}
        resumed.outcomes = {i: o for i, o in resumed.outcomes.items() if i not in settled}
        prepared.tasks = [t for t in prepared.tasks if t.index not in resumed.outcomes]
        print(f"triosim: note: {resumed.describe()}", file=sys.stderr)
    meta = {"traces": list(prepared.trace_dirs), "grid": grid.to_dict(), "configurations": len(points)}

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[bad]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True,
        disable=args.quiet or not err.is_terminal,
    )
    bar = progress.add_task("sweep", total=len(prepared.tasks), bad="")
    n_bad = {"invalid": 0, "failed": 0}  # the rows not ok so far, by status, as the closing count says them
    n_done = 0
    log_progress = not args.quiet and not err.is_terminal  # a log file gets a line every few seconds
    clock = {"start": time.monotonic(), "last": time.monotonic()}

    def progress_line(final: bool = False) -> None:
        now = time.monotonic()
        if not log_progress or (not final and now - clock["last"] < PROGRESS_EVERY_S):
            return
        clock["last"] = now
        err.print(f"sweep: {n_done}/{len(prepared.tasks)} simulated"
                  + "".join(f", {n} {status}" for status, n in n_bad.items() if n) + f", {now - clock['start']:.1f} s")

    def started(prep: Prepared, backend: Backend) -> None:
        if not args.quiet:
            settled = len(prep.settled) - (len(resumed.outcomes) if resumed else 0)  # resumed rows: not settled
            collapsed = (f" ({len(grid)} combinations; flags that do not apply to a configuration collapsed)"
                         if len(points) < len(grid) else "")
            err.print(f"sweep: {len(points)} configurations{collapsed}"
                      + (f", {settled} not simulated (invalid or not implemented)" if settled else "")
                      + f"; {len(prep.tasks)} to simulate on {backend.describe()}")
        progress.start()

    kept = [Row(points[i], o) for i, o in (resumed.outcomes if resumed else {}).items()]
    with ResultFiles(args.out, grid.columns, meta, protect, extra=extra_columns(points), resumed=resumed,
                     kept=kept) as files:
        for old, new in files.moved:
            print(f"triosim: note: {old} (rows of an earlier, interrupted sweep) moved to {new}; "
                  "--resume keeps such rows", file=sys.stderr)

        def on_row(row: Row) -> None:
            nonlocal n_done
            files.add(row)
            if row.point.index in task_ids:  # settled rows are not part of the bar
                if not row.ok:
                    n_bad[row.outcome.status] = n_bad.get(row.outcome.status, 0) + 1
                n_done += 1
                progress.update(bar, advance=1, bad=", ".join(f"{n} {status}" for status, n in n_bad.items() if n))
                progress_line()

        task_ids = {t.index for t in prepared.tasks}
        try:
            with sigterm_as_interrupt():  # a killed sweep keeps its rows like Ctrl-C does
                result = run_sweep(grid, jobs=args.jobs, dask=args.dask, dask_timeout_s=args.dask_timeout,
                                   on_row=on_row, prepared=prepared, on_start=started,
                                   finished=resumed.outcomes if resumed else None)
        finally:
            progress.stop()
        if prepared.tasks:
            progress_line(final=True)
        files.finish(result.rows, result.complete)
    title = _title(result.traces, result.rows)
    if args.plot:
        from .plot import write_plot

        write_plot(args.plot, result.rows, title, protect, x=plot_x, ys=plot_y,
                   swept=[a.spec.name for a in grid.swept])
    ok = [r for r in result.rows if r.ok]
    if args.quiet:
        if ok:
            best = ranked(ok, args.rank_by)[0]
            swept = {a.spec.name for a in grid.swept}
            label = " ".join(f"{k}={format_value(v)}" for k, v in shown_values(best.point).items() if k in swept)
            print(f"{best.outcome.makespan_ms:.4f} {label}".rstrip())
    else:
        print_table(out, grid, result.rows, args.top, title=title, rank_by=args.rank_by)
        written = [str(p) for p in files.written(result.complete)]
        for what, path in [*(("results", p) for p in written), ("plot", args.plot)]:
            if path:
                out.print(f"{what} written to {path}", soft_wrap=True)
    if not result.complete:
        kept = ", ".join(str(p) for p in files.written(False))
        err.print(f"sweep interrupted: {len(result.rows)} of {len(points)} configurations kept"
                  + (f" in {kept} (earlier results files left as they were)" if kept else ""))
        raise KeyboardInterrupt
    if not ok:
        raise ConfigError(no_success_message(result.rows, args.quiet))
    return 0


def no_success_message(rows: Sequence[Row], quiet: bool) -> str:
    """Why a sweep has no result: the table above gives every reason; under ``-q`` nothing is
    above, so the line counts them and gives the first configuration's."""
    if not quiet or not rows:
        return "no configuration of the sweep ran successfully (see the reasons above)"
    counts = {s: sum(1 for r in rows if r.outcome.status == s) for s in (INVALID, FAILED)}
    shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    first = rows[0]
    label = first.point.label() or "the configuration"
    return (f"no configuration of the sweep ran successfully ({shown}); {label}: {first.outcome.reason} "
            "(without -q the table gives every reason)")
