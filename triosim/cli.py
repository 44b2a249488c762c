"""Command line: ``triosim run``, ``triosim dag``, ``triosim trace …`` and ``triosim sweep``.

Every seed flag of the original works with one or two dashes (``-trace-dir`` or
``--trace-dir``); ``triosim -case 1 …`` without a sub-command means ``triosim run``. Errors the
user can fix print one line on stderr and exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from . import __version__
from .compute_model import attach_op_time_model
from .errors import ConfigError, TriosimError
from .output import atomic_write_text
from .platform import build_platform
from .strategy import Strategy
from .trace import Trace, load_trace, read_trace_info, scale_trace

SUBCOMMANDS = ("run", "dag", "trace", "sweep")
_SINGLE_DASH = re.compile(r"^-[A-Za-z][A-Za-z0-9_-]+(=.*)?$")


def default_trace_dir() -> Path:
    """The embedded sample trace (shipped in the wheel as ``triosim.sample_trace``)."""
    from .sample_trace import trace_dir

    return trace_dir()


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """``-trace-dir x`` → ``--trace-dir x``; negative numbers and ``-h`` stay as they are."""
    out = []
    for tok in argv:
        out.append("-" + tok if _SINGLE_DASH.match(tok) else tok)
    return out


def add_sim_flags(p: argparse.ArgumentParser) -> None:
    """The flags shared by ``run``, ``dag`` and ``sweep`` (DESIGN §2.2)."""
    g = p.add_argument_group("trace")
    g.add_argument("--trace-dir", help="trace directory with trace.csv + tensor.csv (default: the embedded sample)")
    g.add_argument("--batch-size", type=int, default=None,
                   help="batch the trace was recorded at (default: from meta.json, else 128)")
    g.add_argument("--batch-size-sim", type=int, default=-1, help="per-GPU simulated batch (default: = batch-size)")
    g.add_argument("--time-column", choices=("nooverlap", "span"), default="nooverlap",
                   help="op time: kernel-time sum (default, as the original) or first-to-last kernel span")
    g.add_argument("--op-time-model", default="auto",
                   help="op time at another batch: auto (fit if the trace dir has batch-<N>/ traces, else "
                        "linear-floor), fit, linear-floor or linear (the original's; always under --reference-compat)")
    g.add_argument("--kernel-floor-us", type=float, default=2.0,
                   help="shortest op time in µs when scaling to a smaller batch (2)")
    g = p.add_argument_group("platform")
    g.add_argument("--GPUnumber", "--gpus", dest="gpus", type=int, default=8, help="number of GPUs (8)")
    g.add_argument("--bandwidth", type=float, default=696.0, help="GPU↔remote-memory link, GB/s (696)")
    g.add_argument("--ptp-bandwidth", type=float, default=65.0, help="GPU↔GPU link, GB/s (65)")
    g.add_argument("--capacity", type=float, default=40.0, help="GPU memory = 2^capacity bytes (40)")
    g.add_argument("--interconnects", type=int, default=0, help="0 electrical, 1 optical mesh")
    g.add_argument("--numRows", dest="num_rows", type=int, default=1, help="optical mesh rows (1)")
    g.add_argument("--numCols", dest="num_cols", type=int, default=None, help="optical mesh columns (= GPUnumber)")
    g.add_argument("--topology", default="ring",
                   help="electrical topology: ring, fully-connected, switch, nvlink-cluster")
    g.add_argument("--gpus-per-node", type=int, default=8, help="nvlink-cluster: GPUs per NVSwitch node (8)")
    g.add_argument("--node-bandwidth", type=float, default=50.0,
                   help="nvlink-cluster: each GPU's NIC to the cluster network, GB/s (50 = 400 Gb/s)")
    g.add_argument("--link-latency-us", type=float, default=None, help="per-link latency in µs (0; optical hop 0.02)")
    g = p.add_argument_group("strategy")
    g.add_argument("--case", type=int, default=0,
                   help="0 single GPU, 1 data parallel, 2 DDP, 3 tensor parallel, 4 pipeline parallel")
    g.add_argument("--micro-batch-size", type=int, default=-1, help="pipeline micro-batch (default: the batch)")
    g.add_argument("--bucket-mb", type=float, default=25.0, help="DDP gradient bucket size in MB (25)")
    g.add_argument("--schedule", default="gpipe", help="pipeline schedule: gpipe, 1f1b or interleaved")
    g.add_argument("--virtual-stages", type=int, default=1,
                   help="interleaved schedule: pipeline stages per GPU (V >= 2; needs --schedule interleaved)")
    g.add_argument("--partition", default="optimal",
                   help="pipeline stage cuts: optimal (searched, then re-timed), time (balanced) or count (equal ops)")
    g.add_argument("--initial-placement", default="gpu",
                   help="where parameters/optimizer state/inputs start: gpu (if they fit) or remote")
    g.add_argument("--collective-detail", default="auto", help="collectives: auto, expanded or macro")
    g.add_argument("--reference-compat", action="store_true",
                   help="reproduce the original TrioSim's conventions (DESIGN §5.1)")


def add_output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="write the result as JSON ('-' for stdout)")
    p.add_argument("--timeline", metavar="FILE", help="write a Chrome/Perfetto trace of the schedule")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the iteration time in ms")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triosim",
        description="Predict one DNN training iteration on many GPUs from a single-GPU trace.",
    )
    parser.add_argument("--version", action="version", version=f"triosim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="simulate one iteration and print a summary")
    add_sim_flags(run)
    add_output_flags(run)
    run.set_defaults(func=cmd_run)
    dag = sub.add_parser("dag", help="export the task DAG as Graphviz DOT")
    add_sim_flags(dag)
    dag.add_argument("--export", metavar="FILE", default="dag.dot", help="DOT file to write (dag.dot)")
    dag.add_argument("--render", choices=("svg", "png", "pdf"), help="also render with Graphviz's dot")
    dag.add_argument("--max-tasks", type=int, default=50_000,
                     help="refuse graphs larger than this (a DOT of 10^5+ nodes is unreadable; 0 = no limit)")
    dag.set_defaults(func=cmd_dag)
    try:
        from .tracer import cli as tracer_cli
    except ImportError:  # a source tree without the tracer package
        tracer_cli = None
    if tracer_cli is not None:
        tracer_cli.register(sub)
    try:
        from . import sweep
    except ImportError:
        sweep = None
    if sweep is not None:
        sweep.register(sub)
    return parser


# ----------------------------------------------------------------------------- configuration


def load_scaled_trace(args: argparse.Namespace) -> Trace:
    trace_dir = Path(args.trace_dir) if args.trace_dir else default_trace_dir()
    batch = args.batch_size
    if batch is None:
        batch = int(read_trace_info(trace_dir).get("batch_size", 128))
    if batch <= 0:
        raise ConfigError(f"-batch-size must be a positive integer, got {batch}")
    sim = args.batch_size_sim if args.batch_size_sim not in (None, -1) else batch
    if sim <= 0:
        raise ConfigError(f"-batch-size-sim must be a positive integer (or -1 for the trace's batch), got {sim}")
    trace = load_trace(trace_dir, batch_size=batch, time_column=args.time_column)
    model = "linear" if args.reference_compat else getattr(args, "op_time_model", "auto")
    trace = attach_op_time_model(trace, model, getattr(args, "kernel_floor_us", 2.0), args.time_column)
    return scale_trace(trace, sim, reference_compat=args.reference_compat)


def strategy_from_args(args: argparse.Namespace, sim_batch: int) -> Strategy:
    mb = args.micro_batch_size if args.micro_batch_size not in (None, -1) else None
    if mb is not None and mb <= 0:
        raise ConfigError(f"-micro-batch-size must be a positive integer, got {mb}")
    if mb is not None and mb > sim_batch:
        raise ConfigError(f"-micro-batch-size {mb} is larger than the simulated batch {sim_batch}")
    strategy = Strategy(
        case=args.case,
        micro_batch_size=mb,
        bucket_mb=args.bucket_mb,
        schedule=args.schedule,
        partition=args.partition,
        initial_placement=args.initial_placement,
        reference_compat=args.reference_compat,
        collective_detail=args.collective_detail,
        virtual_stages=getattr(args, "virtual_stages", 1),
    )
    strategy.validate()
    return strategy


def platform_from_args(args: argparse.Namespace):
    gpus = args.gpus
    if gpus < 1:
        raise ConfigError(f"-GPUnumber must be >= 1, got {gpus}")
    single = args.case == 0  # case 0 runs on one GPU whatever -GPUnumber says
    return build_platform(
        num_gpus=1 if single else gpus,
        capacity_log2=args.capacity,
        bandwidth_gbps=args.bandwidth,
        ptp_bandwidth_gbps=args.ptp_bandwidth,
        interconnects=0 if single else args.interconnects,
        num_rows=args.num_rows,
        num_cols=args.num_cols,
        topology="ring" if single else args.topology,
        link_latency_us=args.link_latency_us,
        reference_compat=args.reference_compat,
        gpus_per_node=args.gpus_per_node,
        node_bandwidth_gbps=args.node_bandwidth,
    )


def configure(args: argparse.Namespace):
    """(trace, platform, strategy) from parsed flags; flags are checked before the trace is read."""
    if args.case not in range(5):
        raise ConfigError(f"-case must be one of 0..4, got {args.case}")
    platform = platform_from_args(args)
    trace = load_scaled_trace(args)
    strategy = strategy_from_args(args, trace.batch_size)
    return trace, platform, strategy


# ----------------------------------------------------------------------------- commands


def _progress_callback(total: int, quiet: bool):
    """A rich progress bar on stderr for big graphs (never with --quiet)."""
    if quiet or total < 200_000:
        return None, None
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("scheduling"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} tasks"),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = prog.add_task("schedule", total=total)
    return prog, (lambda done: prog.update(task, completed=done))


def cmd_run(args: argparse.Namespace) -> int:
    from .graph import build_graph
    from .result import Result, summarize
    from .scheduler import schedule
    from .timeline import timeline_json

    status = None if args.quiet else Console(stderr=True).status("loading trace…")
    if status is not None:
        status.start()
    try:
        trace, platform, strategy = configure(args)
        if status is not None:
            status.update(f"building the task graph ({strategy.name}, {platform.num_gpus} GPUs)…")
        graph = build_graph(trace, platform, strategy)
    finally:
        if status is not None:
            status.stop()
    prog, cb = _progress_callback(len(graph), args.quiet)
    if prog is not None:
        with prog:
            sched = schedule(graph, progress=cb)
    else:
        sched = schedule(graph)
    per_gpu, per_link = summarize(graph, sched, platform)
    result = Result(sched.makespan, strategy, platform, graph, sched, per_gpu, per_link,
                    extra={"trace": Path(trace.path).name, "batch_size_sim": trace.batch_size,
                           **({"op_time_model": trace.op_time.describe()} if trace.op_time else {})})
    protect = (Path(trace.path) / "trace.csv", Path(trace.path) / "tensor.csv")
    if args.json:
        text = json.dumps(result.to_dict(), indent=2, sort_keys=False) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            atomic_write_text(args.json, text, protect=protect)
    if args.timeline:
        atomic_write_text(args.timeline, timeline_json(graph, sched), protect=protect)
    if args.quiet:
        if args.json != "-":
            print(f"{result.makespan_ms:.4f}")
    elif args.json != "-":
        print_to = Console(highlight=False)
        from .report import print_summary

        print_summary(result, print_to, title=f"{Path(trace.path).name} · batch {trace.batch_size}")
        if trace.op_time is not None and (trace.op_time.batch != trace.batch_size or strategy.case == 4):
            print_to.print(trace.op_time.summary())
        for flag, path in (("JSON", args.json), ("timeline", args.timeline)):
            if path:
                print_to.print(f"{flag} written to {path}")
    return 0


def cmd_dag(args: argparse.Namespace) -> int:
    from .graph import build_graph
    from .graph.export import to_dot

    trace, platform, strategy = configure(args)
    graph = build_graph(trace, platform, strategy)
    if args.max_tasks and len(graph) > args.max_tasks:
        raise ConfigError(
            f"the task graph has {len(graph):,} tasks, more than --max-tasks {args.max_tasks:,}: use fewer GPUs "
            "or micro-batches, --collective-detail macro, or --max-tasks 0 to write it anyway"
        )
    dot = to_dot(graph)
    protect = (Path(trace.path) / "trace.csv", Path(trace.path) / "tensor.csv")
    atomic_write_text(args.export, dot.source, protect=protect)
    print(f"wrote {args.export}: {len(graph):,} tasks, {graph.num_edges:,} edges")
    if args.render:
        exe = shutil.which("dot")
        if exe is None:
            raise ConfigError("--render needs Graphviz's `dot` program (e.g. apt-get install graphviz)")
        out = str(Path(args.export).with_suffix("." + args.render))
        proc = subprocess.run([exe, f"-T{args.render}", args.export, "-o", out], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ConfigError(f"dot failed on {args.export}: {proc.stderr.strip().splitlines()[-1:]}")
        print(f"rendered {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = normalize_argv(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TriosimError as exc:
        print(f"triosim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("triosim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
