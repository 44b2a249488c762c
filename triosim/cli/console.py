"""Command line: ``triosim run``, ``triosim dag``, ``triosim trace …`` and ``triosim sweep``.

Every seed flag of the original works with one or two dashes (``-trace-dir`` or
``--trace-dir``); ``triosim -case 1 …`` without a sub-command means ``triosim run``. Errors the
user can fix print one line on stderr and exit with code 2. The simulation flags and what they
turn into live in :mod:`triosim.config`; this module only parses and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from ..config import (
    add_sim_flags,
    check_config_facts,
    config_block,
    configure,
    read_config_file,
    resolve_batches,
)
from ..config.defaults import applied_defaults
from ..config.gpu import verdict_capacity
from ..config.inputs import refuse_outputs_over_inputs
from ..config.megatron_args import translate_argv
from ..config.notes import unused_flag_note
from ..errors import ConfigError, TriosimError
from ..output import atomic_write_text, check_output_path
from ..report.memory_verdict import verdict_line
from ..trace.load import collector_paused
from ..version import __version__
from .argparsing import OneLineParser, add_config_flag, typed_spelling
from .notices import built_notice, run_notices
from .progress import RunProgress

SUBCOMMANDS = ("run", "dag", "trace", "sweep", "gpus", "models", "plan")
MEGATRON_COMMANDS = ("run", "dag", "plan")  # the commands whose flags have Megatron-LM names
_SINGLE_DASH = re.compile(r"^-[A-Za-z][A-Za-z0-9_-]+(=.*)?$")


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """``-trace-dir x`` → ``--trace-dir x``; negative numbers and ``-h`` stay as they are."""
    out = []
    for tok in argv:
        out.append("-" + tok if _SINGLE_DASH.match(tok) else tok)
    return out


def add_output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="write the result as JSON ('-' for stdout)")
    p.add_argument("--timeline", metavar="FILE",
                   help="write a Chrome/Perfetto trace of the schedule ('-' for stdout)")
    p.add_argument("--timeline-gpus", metavar="LIST",
                   help="the timeline keeps these GPUs' tracks and links (e.g. 0,1,8; 'all'); default all, or "
                        "for a large run the first pipeline (says so)")
    p.add_argument("--timeline-micro-batches", metavar="N",
                   help="the timeline keeps the first N micro-batches and the work outside them ('all'); "
                        "default all, or for a large run max(8, 2 x pp)")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the iteration time in ms")


def add_megatron_flag(p: argparse.ArgumentParser) -> None:
    """``--megatron-args``: translated before parsing (:mod:`triosim.config.megatron_args`);
    listed here so ``--help`` shows it and the Megatron names."""
    p.add_argument("--megatron-args", metavar='"LINE"',
                   help="a Megatron-LM argument line, read as the native flags (--tensor-model-parallel-size, "
                        "--pipeline-model-parallel-size, --virtual-pipeline-model-parallel-size, "
                        "--num-layers-per-virtual-pipeline-stage, --global-batch-size, --micro-batch-size, "
                        "--seq-length, --num-layers, --hidden-size, --num-attention-heads, --ffn-hidden-size, "
                        "--num-query-groups, --swiglu, --sequence-parallel, --recompute-granularity, "
                        "--use-distributed-optimizer, --bf16, --fp16, --fp8-format, ...; each of them works as a "
                        "flag too); the world size is -GPUnumber, dp is derived from it")


def config_file_arg(argv: Sequence[str]) -> str | None:
    """The ``--config FILE`` of a (normalized) run/dag/plan command line, read before parsing
    because the file's values become the parser's defaults."""
    if not argv or argv[0] not in ("run", "dag", "plan"):
        return None
    found = None
    for i, tok in enumerate(argv):
        if tok == "--":
            break
        if tok == "--config" and i + 1 < len(argv):
            found = argv[i + 1]
        elif tok.startswith("--config="):
            found = tok.split("=", 1)[1]
    return found


def build_parser(defaults: dict | None = None, run_only: bool = False) -> argparse.ArgumentParser:
    """The whole ``triosim`` parser; ``defaults`` (flag dest → value, from ``--config``) replace
    the simulation flags' defaults of ``run``, ``dag`` and ``plan``. ``run_only``: just ``run`` (a run
    then does not import the tracer and sweep modules)."""
    parser = OneLineParser(
        prog="triosim",
        description="Predict one DNN training iteration on many GPUs from a single-GPU trace.",
    )
    parser.add_argument("--version", action="version", version=f"triosim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="simulate one iteration and print a summary")
    add_sim_flags(run)
    add_config_flag(run)
    add_megatron_flag(run)
    add_output_flags(run)
    run.set_defaults(func=cmd_run, **(defaults or {}))
    if run_only:
        return parser
    dag = sub.add_parser("dag", help="export the task DAG as Graphviz DOT")
    add_sim_flags(dag)
    add_config_flag(dag)
    add_megatron_flag(dag)
    dag.add_argument("--export", metavar="FILE", default="dag.dot", help="DOT file to write (dag.dot)")
    dag.add_argument("--render", choices=("svg", "png", "pdf"),
                     help="also render with Graphviz's dot, labels >= 10 px at 100 %% zoom (an SVG when a PNG "
                          "would be too large to view; docs/dag.md)")
    dag.add_argument("--max-tasks", type=int, default=50_000,
                     help="refuse to draw more than this many nodes (with --expand: tasks), a DOT file "
                          "too large for dot (0 = no limit)")
    dag.add_argument("--collapse", choices=("auto", "none", "layer", "stage", "repeat"), default="auto",
                     help="one node per task (none), per layer of each GPU's pass, per GPU pass and "
                          "micro-batch (stage), or per run of repeats (repeat: identical layers, micro-batches "
                          "and collectives as one node, the first and last drawn); collectives are one node "
                          "each when collapsed. auto (default): the first that fits in --max-nodes, else repeat")
    dag.add_argument("--expand", action="store_true",
                     help="draw every task (--collapse none), however many (up to --max-tasks)")
    dag.add_argument("--max-nodes", type=int, default=150,
                     help="--collapse auto collapses beyond this many nodes, and says so (150)")
    dag.add_argument("--show-gpus", metavar="G,G", default=None,
                     help="draw only the tasks of these GPUs (e.g. 0,1) and the communication touching them")
    dag.add_argument("--layout", choices=("tb", "lr"), default="tb",
                     help="top to bottom (default) or left to right")
    dag.set_defaults(func=cmd_dag, **(defaults or {}))
    try:
        from ..tracer import cli as tracer_cli
    except ImportError:  # a source tree without the tracer package
        tracer_cli = None
    if tracer_cli is not None:
        tracer_cli.register(sub)
    try:
        from .. import sweep
    except ImportError:
        sweep = None
    if sweep is not None:
        sweep.register(sub)
    from . import gpus, models, plan

    gpus.register(sub)
    models.register(sub)
    plan.register(sub, defaults)
    return parser


# ----------------------------------------------------------------------------- commands


def check_run_outputs(args: argparse.Namespace) -> None:
    """Refuse unusable output paths before simulating (a directory, a missing directory, the
    same file for two outputs)."""
    if args.json == "-" and args.timeline == "-":
        raise ConfigError("--json - and --timeline - both write to stdout, which would hold two JSON "
                          "documents; send one of them to a file")
    from ..report.timeline_filter import parse_timeline_gpus, parse_timeline_micro_batches

    for flag, raw in (("--timeline-gpus", args.timeline_gpus), ("--timeline-micro-batches", args.timeline_micro_batches)):
        if raw is not None and args.timeline is None:
            raise ConfigError(f"{flag} chooses what the --timeline file keeps; give --timeline FILE or leave it out")
    parse_timeline_gpus(args.timeline_gpus)
    parse_timeline_micro_batches(args.timeline_micro_batches)
    outputs = [(flag, path) for flag, path in (("--json", args.json), ("--timeline", args.timeline))
               if path is not None and path != "-"]
    for flag, path in outputs:
        check_output_path(path, flag)
    if len(outputs) == 2 and Path(outputs[0][1]).resolve() == Path(outputs[1][1]).resolve():
        raise ConfigError(f"--json and --timeline both name {args.json}; give them different files")
    # No output may replace a file the run reads (by path or, through a hard link, by inode).
    refuse_outputs_over_inputs(outputs, args)


def check_file_flags_not_empty(args: argparse.Namespace) -> None:
    """``--config ""`` or ``--topology-file ""`` would silently mean "not given"."""
    for flag, dest in (("--config", "config"), ("--topology-file", "topology_file")):
        value = getattr(args, dest, None)
        if value is not None and not str(value).strip():
            raise ConfigError(f"{flag} is empty; give a file or leave the flag out")


def note_unused_flags(args: argparse.Namespace) -> None:
    note = unused_flag_note(args)
    if note:
        print(note, file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from ..compute.model_flops import model_flops_per_sample
    from ..compute.op_time_source import gpu_timing
    from ..graph import build_graph
    from ..report.result import Result, summarize
    from ..report.throughput import throughput_of
    from ..report.timeline import timeline_events, timeline_text
    from ..report.timeline_filter import (
        parse_timeline_gpus,
        parse_timeline_micro_batches,
        select_timeline,
    )
    from ..schedule.list_scheduler import schedule

    check_file_flags_not_empty(args)
    check_run_outputs(args)
    # The trace, the platform and the task graph are 10^5 long-lived objects, none of them
    # cyclic garbage: the cyclic collector would only walk them again and again (about 7 %
    # of a large run).
    from ..schedule.tasks import tasks_in_newest_graph

    with RunProgress(args.quiet, building=tasks_in_newest_graph) as progress, collector_paused():
        trace, platform, strategy = configure(args)
        timeline_gpus = parse_timeline_gpus(args.timeline_gpus, platform.num_gpus)
        note_unused_flags(args)
        for line in run_notices(args, trace, platform, strategy):
            print(line, file=sys.stderr)
        progress.phase("building the task graph")
        # A data-parallel preset is built folded (GPU 0 and its mirrors) unless a timeline needs every GPU's tasks.
        graph = build_graph(trace, platform, strategy, fold=not args.timeline)
        note = built_notice(graph, strategy)
        if note:
            print(note, file=sys.stderr)
        progress.phase("scheduling", total=len(graph))
        sched = schedule(graph, progress=progress.scheduled if progress.enabled else None)
        progress.phase("writing the report")
        per_gpu, per_link = summarize(graph, sched, platform)
    batches = resolve_batches(args)
    block = config_block(args)
    for warning in check_config_facts(getattr(args, "config_facts", None) or {}, block):
        print(f"triosim: warning: --config {args.config}: {warning}", file=sys.stderr)
    verdict = gpu_outputs(args, trace, graph, strategy)
    # Only when shown: counting a 200,000-op trace's FLOPs is a tenth of its whole -q run.
    rates = throughput_of(trace, strategy, platform.num_gpus, sched.makespan,
                          model_flops_per_sample(trace, batches.batch), gpu_timing(trace)) \
        if args.json or not args.quiet else None
    result = Result(sched.makespan, strategy, platform, graph, sched, per_gpu, per_link,
                    extra={"trace": Path(trace.path).name, "batch_size": batches.batch,
                           "batch_source": batches.source, "batch_size_sim": trace.batch_size,
                           "time_source": trace.time_source,
                           **({"defaults": [d.to_dict() for d in applied_defaults(args)]}
                              if applied_defaults(args) else {}),
                           **({"op_time_model": trace.op_time.describe()} if trace.op_time else {}),
                           **verdict,
                           **({"throughput": rates.to_dict()} if rates is not None else {}),
                           "config": block})
    protect = (Path(trace.path) / "trace.csv", Path(trace.path) / "tensor.csv")
    if args.json:
        text = json.dumps(result.to_dict(), indent=2, sort_keys=False) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            atomic_write_text(args.json, text, protect=protect, flag="--json")
    if args.timeline:
        chosen = select_timeline(graph, sched, strategy, platform.num_gpus, timeline_gpus,
                                 parse_timeline_micro_batches(args.timeline_micro_batches))
        events = timeline_events(graph, sched, keep=chosen.keep, gpus=chosen.gpus)
        text = timeline_text(events)
        if args.timeline == "-":
            sys.stdout.write(text)
        else:
            atomic_write_text(args.timeline, text, protect=protect, flag="--timeline")
        print(chosen.summary("stdout" if args.timeline == "-" else args.timeline, len(text.encode()), events),
              file=sys.stderr)
        del events, text
    to_stdout = "-" in (args.json, args.timeline)  # stdout holds one JSON document and nothing else
    if args.quiet:
        if not to_stdout:
            print(f"{result.makespan_ms:.4f}")
    elif not to_stdout:
        from rich.console import Console  # here: a quiet run prints no table and skips rich

        from ..report.summary import print_summary

        print_to = Console(highlight=False)

        print_summary(result, print_to, title=f"{Path(trace.path).name} · batch {trace.batch_size}")
        if trace.op_time is not None and (trace.op_time.batch != trace.batch_size or strategy.case == 4):
            print_to.print(trace.op_time.summary())
        for flag, path in (("JSON", args.json), ("timeline", args.timeline)):
            if path:
                print_to.print(f"{flag} written to {path}", soft_wrap=True)
    # Left on the arguments: when console_main holds them, the process ends without freeing the
    # run's million objects one by one (a fifth of a second on a 200k-op trace).
    args.run_objects = (trace, graph, sched, result)
    if args.require_fit and not verdict["memory"]["fits"]:
        print(f"triosim: {verdict_line(verdict['memory'])} (--require-fit)", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return 0


EXIT_DOES_NOT_FIT = 3  # --require-fit: a GPU's memory peak exceeds its capacity (outputs are written)


def gpu_outputs(args: argparse.Namespace, trace, graph, strategy) -> dict:
    """The result's ``gpu`` block (with --gpu) and ``memory`` verdict (under a verdict); {} for
    a run without either, whose result stays as it always was."""
    from ..compute.op_time_source import gpu_timing
    from ..report.memory_verdict import memory_verdict

    out: dict = {}
    timing = gpu_timing(trace)
    if timing is not None:
        out["gpu"] = {**timing.to_dict(), "header": timing.header(), "notes": timing.notes()}
    judged = verdict_capacity(args)
    if judged is not None:
        out["memory"] = memory_verdict(graph, trace, strategy, *judged).to_dict()
    return out


def cmd_dag(args: argparse.Namespace) -> int:
    from ..graph import build_graph
    from ..report.dot_export import dag_picture
    from ..report.render import check_render_target, render_dag, render_target

    check_file_flags_not_empty(args)
    check_output_path(args.export, "--export")
    if args.render:
        check_render_target(args.export, args.render)
    if args.max_nodes < 1:
        raise ConfigError(f"--max-nodes must be >= 1, got {args.max_nodes}")
    mode = dag_mode(args)
    # --render's picture too, and the SVG a PNG too large to view falls back to
    pictures = {"png": ("png", "svg")}.get(args.render, (args.render,)) if args.render else ()
    rendered = [render_target(args.export, fmt) for fmt in pictures]
    refuse_outputs_over_inputs([("--export", args.export), *(("--render", p) for p in rendered)], args)
    trace, platform, strategy = configure(args)
    note_unused_flags(args)
    graph = build_graph(trace, platform, strategy)
    if mode == "none" and args.max_tasks and len(graph) > args.max_tasks:
        raise ConfigError(
            f"the task graph has {len(graph):,} tasks, more than --max-tasks {args.max_tasks:,}: draw it collapsed "
            "(leave out --expand), use fewer GPUs or micro-batches, --collective-detail macro, or --max-tasks 0 "
            "to write it anyway"
        )
    picture = dag_picture(graph, trace, mode, gpus=show_gpus(args.show_gpus, platform.num_gpus),
                          max_nodes=args.max_nodes, rankdir="LR" if args.layout == "lr" else "TB")
    if args.max_tasks and picture.nodes > args.max_tasks:
        raise ConfigError(f"the picture has {picture.nodes:,} nodes, more than --max-tasks {args.max_tasks:,}: "
                          "use --collapse repeat, --show-gpus, or --max-tasks 0 to write it anyway")
    protect = (Path(trace.path) / "trace.csv", Path(trace.path) / "tensor.csv")
    atomic_write_text(args.export, picture.dot.source, protect=protect, flag="--export")
    if picture.note:
        print(f"note: {picture.note}")
    how = "one node per task" if picture.mode == "none" else f"--collapse {picture.mode}"
    source = (f"{len(graph):,} tasks and {graph.num_edges:,} edges" if picture.tasks == len(graph)
              else f"{picture.tasks:,} of the DAG's {len(graph):,} tasks")
    print(f"wrote {args.export}: {picture.nodes:,} nodes, {picture.edges:,} edges from {source} ({how})")
    if args.render:
        drawn = render_dag(picture.dot.source, args.export, args.render)
        if drawn.plan.note:
            print(f"note: {drawn.plan.note}; wrote {drawn.path} instead" if drawn.plan.fmt != args.render
                  else f"note: {drawn.plan.note}", file=sys.stderr)
        print(f"rendered {drawn.path}: {drawn.plan.width_px:,} x {drawn.plan.height_px:,} px at 100 % zoom, "
              f"labels {drawn.plan.label_px:.1f} px")
    return 0


def dag_mode(args: argparse.Namespace) -> str:
    """The collapse mode: ``--expand`` is ``--collapse none``, and refuses any other grouping."""
    if not getattr(args, "expand", False):
        return args.collapse
    if args.collapse not in ("auto", "none"):
        raise ConfigError(f"--expand draws every task; --collapse {args.collapse} groups them: give one of the two")
    return "none"


def show_gpus(raw: str | None, num_gpus: int) -> frozenset[int] | None:
    """``--show-gpus 0,1`` as a set of GPU indices, checked against the platform."""
    from ..report.timeline_filter import parse_gpu_indices

    return None if raw is None else parse_gpu_indices(raw, "--show-gpus", num_gpus, "a comma list of GPU indices")


def command_argv(typed: Sequence[str]) -> list[str]:
    """The arguments as the parser reads them: long flags, and ``run`` when no command is named."""
    argv = normalize_argv(typed)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]
    return argv


def main(argv: Sequence[str] | None = None, keep: list | None = None) -> int:
    """Run a command line; ``keep``: a list that receives the parsed arguments (with what the
    command left on them), for a caller that frees them itself, or never (:func:`console_main`)."""
    typed = list(sys.argv[1:] if argv is None else argv)
    argv = command_argv(typed)
    config = config_file_arg(argv)
    facts: dict = {}
    try:
        if argv[0] in MEGATRON_COMMANDS:
            translation = translate_argv(argv)
            if translation.argv != argv:
                typed = argv = translation.argv  # the parser's messages then name the native flags
            note = translation.note()
            if note:
                print(note, file=sys.stderr)
        defaults = {**read_config_file(config, facts), "config_facts": facts} if config else None
    except TriosimError as exc:
        print(f"triosim: error: {exc}", file=sys.stderr)
        return 2
    parser = build_parser(defaults, run_only=argv[0] == "run")
    parser.typed = typed_spelling(typed, normalize_argv(typed))
    parser.command = argv[0] if argv[0] in SUBCOMMANDS else ""
    args = parser.parse_args(argv)
    if keep is not None:
        keep.append(args)
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
    except MemoryError:
        # The last resort behind the estimate before building (triosim.graph.build_size): the
        # frames holding the half-built graph are gone by now, so there is memory to say so.
        print(f"triosim: error: {argv[0]} ran out of memory ({_memory_note()}): use fewer GPUs, "
              "--representatives or a shorter trace", file=sys.stderr)
        return 2


def _memory_note() -> str:
    from ..limits import available_memory_bytes

    available = available_memory_bytes()
    return "the machine's memory" if available is None else f"{available / 1e9:.1f} GB available now"


def console_main() -> None:
    """The ``triosim`` command: :func:`main`, then, after ``run``, an immediate exit.

    A run of a large trace ends holding millions of objects (trace, task graph, schedule), and
    freeing them one by one at exit took a few percent of the run. By then its outputs are
    written (atomically) and closed, and a run leaves no process or thread behind, so the
    process flushes its streams and ends at once. Other commands exit the usual way.
    """
    kept: list = []
    code = main(keep=kept)
    if command_argv(sys.argv[1:])[0] != "run":
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe: let the usual exit deal with it
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    console_main()
