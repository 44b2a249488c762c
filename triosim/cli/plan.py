"""``triosim plan``: the best way to train a model on N GPUs — every valid composition estimated
in closed form, the best ``--top`` timed with the task DAG, ranked (:mod:`triosim.plan`)."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from ..compute.model_flops import model_flops_per_sample
from ..config import add_sim_flags, resolve_batches, trace_dir_from_flag
from ..config.build import (
    gpu_timing_options,
    layers_to_repeat,
    load_recorded_trace,
    op_time_options,
    platform_from_args,
)
from ..config.flags import FlagTable
from ..config.gpu import GpuOptions, memory_capacity
from ..config.inputs import input_files, refuse_outputs_over_inputs
from ..config.layout_flags import DESTS as LAYOUT_DESTS
from ..config.model_flags import card_flag, check_model_flags
from ..config.precision import training_precision
from ..errors import ConfigError
from ..graph.pipeline.layer_layout import LayerSplit
from ..graph.strategy import parse_rank_order
from ..limits import check_batch_limit
from ..output import check_output_path
from .argparsing import add_config_flag
from .interrupts import FirstInterruptOnly
from .progress import ProgressLines, is_terminal

# Strategy flags the plan chooses itself: given to `plan`, they would be silently replaced.
CHOSEN = ("case", "dp", "tp", "pp", "micro_batch_size", "schedule", "virtual_stages", "zero", "sequence_parallel",
          "batch_size_sim", "gpus", "global_batch", "recompute", "cp", "recompute_method", "recompute_num_layers",
          "recompute_modules", "offload_activations", "ep", "etp", *LAYOUT_DESTS)
# Of them, the recomputation details and the offload a user may pin (every candidate then has them).
RECOMPUTE_DETAIL = ("recompute_method", "recompute_num_layers", "recompute_modules", "offload_activations")
# Of them, the parallel degrees a user may pin (the rest of the mesh is searched around them).
PINNABLE = ("tp", "pp", "dp", "cp")
# Expert parallelism folds over the GPUs of those axes (no GPUs of its own); pinned the same way.
EXPERT_PINS = ("ep", "etp")
EXIT_NOTHING_FITS = 3


def _has_option(p: argparse.ArgumentParser, option: str) -> bool:
    return option in p._option_string_actions  # a flag another part may add to the simulation flags


def register(sub: Any, defaults: dict | None = None) -> None:
    """Add ``triosim plan`` to the CLI's sub-parsers; ``defaults`` (flag dest → value, from
    ``--config``) replace the simulation flags' defaults, as for ``triosim run``."""
    p = sub.add_parser("plan", help="search every DP × TP × PP × CP × micro-batch × schedule × ZeRO × recomputation "
                                    "configuration for the fastest, DAG-timing the best few",
                       description="Search every DP × TP × PP × CP × micro-batch × schedule (1F1B, interleaved V 2-4) × "
                                   "ZeRO 0-3 × sequence parallel × recomputation (none, selective, full) configuration, "
                                   "and, where one does not fit and would be among the fastest, partial recomputation: "
                                   "block recomputation of the fewest layers a chunk that fit (--recompute-method block "
                                   "--recompute-num-layers N), selective core_attn,mlp and core_attn,layernorm,mlp, "
                                   "and activation offload of the fewest layers a chunk that fit (below ZeRO-3). "
                                   "--tp/--pp/--cp/--dp pin a degree; --recompute-num-layers N (with "
                                   "--recompute-method), --recompute-modules LIST or --offload-activations N|FRACTION "
                                   "(not under ZeRO-3) pin a setting for every candidate. The best few estimates are timed with the task DAG "
                                   "and ranked.")
    add_sim_flags(p)
    add_config_flag(p)
    g = p.add_argument_group("plan")
    if not _has_option(p, "--global-batch"):
        g.add_argument("--global-batch", type=int, default=None, metavar="B",
                       help="samples per iteration over all data-parallel replicas (required)")
    if not _has_option(p, "--seq-len"):
        g.add_argument("--seq-len", type=int, default=None, metavar="S",
                       help="tokens per sample, for tokens/s and MFU (default: the trace's meta.json)")
    g.add_argument("--top", type=int, default=20, metavar="K",
                   help="DAG-time at most the K best estimates, skipping those that cannot beat the best "
                        "DAG time, and rank them by the DAG (20; 0: estimates only)")
    g.add_argument("--max-tp", type=int, default=None, metavar="T",
                   help="largest tensor-parallel degree (default: the GPUs of a node, so a TP group stays on NVLink)")
    g.add_argument("--overlaps", choices=("search", "off"), default="search",
                   help="Megatron-Core's data-parallel overlaps: search (every candidate with data ranks that "
                        "could be the fastest with them is also tried with --overlap-grad-reduce, and "
                        "--overlap-param-gather under ZeRO 1/2) or off; --overlap-grad-reduce or "
                        "--overlap-param-gather pins them on")
    g.add_argument("--out", metavar="FILE.csv", help="every candidate, infeasible ones with the reason (CSV)")
    g.add_argument("--plot", metavar="FILE.png", help="iteration time against peak memory, the Pareto set joined "
                                                      "(needs matplotlib: the plot extra)")
    g.add_argument("--jobs", "-j", type=int, default=None,
                   help="processes for estimating a large search and for the DAG timing (default: the CPUs "
                        "this process may use; 1 = in this process)")
    g.add_argument("--dask", metavar="ADDRESS",
                   help="DAG-time on a Dask cluster: scheduler address tcp://HOST:PORT or a scheduler file")
    g.add_argument("--show", type=int, default=10, metavar="N", help="rows of the table (10)")
    g.add_argument("--quiet", "-q", action="store_true", help="print only the best configuration's run line")
    # The flags the --config file set, to name the file when one of them is the plan's own choice.
    p.set_defaults(func=cmd_plan, **(defaults or {}), config_dests=frozenset(defaults or ()))


def _check_flags(args: argparse.Namespace) -> None:
    table = FlagTable.from_cli()
    for dest in CHOSEN:
        if dest in ("gpus", "global_batch", *PINNABLE, *EXPERT_PINS, *LAYOUT_DESTS, *RECOMPUTE_DETAIL) \
                or not hasattr(args, dest):
            continue
        try:
            spec = table.by_dest(dest)
        except KeyError:
            continue
        if getattr(args, dest) != spec.default:
            where = f"; --config {args.config} sets it" if dest in getattr(args, "config_dests", ()) else ""
            raise ConfigError(f"plan chooses --{spec.name} itself; leave it out (give --gpus and --global-batch)"
                              + where)
    LayerSplit.of(args).check()  # a pinned layout: Megatron-Core's refused combinations, one line
    if getattr(args, "cp_comm_type", "p2p") != "p2p":  # its estimates know the ring only
        raise ConfigError(f"plan searches context parallelism as ring attention (--cp-comm-type p2p): leave "
                          f"--cp-comm-type {args.cp_comm_type} out (time it with run, or sweep it)")
    for axis in EXPERT_PINS:
        value = getattr(args, axis, None)
        if value is not None and value < 1:
            raise ConfigError(f"--{axis} must be a positive integer, got {value}")
    if getattr(args, "offload_activations", None) is not None and any(getattr(args, a, None) not in (None, 1)
                                                                        for a in EXPERT_PINS):
        raise ConfigError("--offload-activations with --ep/--etp: plan's estimate does not follow the host copies "
                          "beside the token exchanges; time it with run")
    if _recompute_pin(args) is not None and getattr(args, "offload_activations", None) is not None:
        raise ConfigError("--offload-activations with a recomputation setting: Megatron-Core does not offload "
                          "activations while it recomputes them; give one")
    if args.gpus is None or args.gpus < 1:
        raise ConfigError("plan needs --gpus N, the GPUs to train on")
    for axis in PINNABLE:
        value = getattr(args, axis, None)
        if value is None:
            continue
        if value < 1 or args.gpus % value:
            raise ConfigError(f"--{axis} {value} pins the {axis} degree: it must be 1 or more and divide --gpus "
                              f"{args.gpus}")
    pinned = math.prod(getattr(args, a, None) or 1 for a in PINNABLE)
    if pinned > args.gpus or args.gpus % pinned:
        raise ConfigError("--tp × --pp × --cp × --dp as pinned must divide --gpus " + str(args.gpus))
    if args.global_batch is None or args.global_batch < 1:
        raise ConfigError("plan needs --global-batch B, the samples per iteration over all replicas")
    check_batch_limit(args.global_batch, "--global-batch")
    if args.config is not None and not args.config.strip():
        raise ConfigError("--config is empty; give a file or leave the flag out")
    if args.show < 1:
        raise ConfigError(f"--show must be 1 or more, got {args.show}")
    if args.top < 0:
        raise ConfigError(f"--top must be 0 or more, got {args.top}")
    if args.dask is not None:
        if not args.dask.strip():
            raise ConfigError("--dask is empty; give tcp://HOST:PORT or a scheduler file, or leave it out")
        from ..sweep.execute import require_distributed

        require_distributed()
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs must be 1 or more, got {args.jobs}")
    if args.max_tp is not None and args.max_tp < 1:
        raise ConfigError(f"--max-tp must be 1 or more, got {args.max_tp}")
    pinned = [f for f in ("overlap_grad_reduce", "overlap_param_gather") if getattr(args, f, False)]
    if args.overlaps == "off" and pinned:
        where = f" (--config {args.config} sets it)" if pinned[0] in getattr(args, "config_dests", ()) else ""
        raise ConfigError(f"--overlaps off with --{pinned[0].replace('_', '-')}{where}: give one or the other")
    if args.out:
        check_output_path(args.out, "--out")
        if Path(args.out).suffix.lower() != ".csv":
            raise ConfigError(f"--out {args.out}: the name must end in .csv")
    if args.plot:
        from ..sweep.plot import require_matplotlib

        require_matplotlib(args.plot)


def _recompute_pin(args: argparse.Namespace) -> tuple[str, str, int, tuple[str, ...]] | None:
    """The recomputation setting the flags pin, as (granularity, method, layers, modules): full
    with ``--recompute-num-layers`` (and ``--recompute-method``, block by default as for run:
    the first N layers of each model chunk),
    selective with ``--recompute-modules``; None when they leave it to the search."""
    from ..config.parallel_flags import recompute_options
    from ..graph.recompute_spec import RecomputeSpec

    opts = recompute_options(argparse.Namespace(**{k: getattr(args, k, None) for k in (
        "recompute_method", "recompute_num_layers", "recompute_modules")}))
    if "recompute_modules" in opts and "recompute_num_layers" in opts:
        raise ConfigError("--recompute-num-layers (full recomputation) and --recompute-modules (selective) exclude "
                          "each other: give one")
    if "recompute_method" in opts and "recompute_num_layers" not in opts:
        raise ConfigError("--recompute-method pins a setting only with --recompute-num-layers N (plan searches block "
                          "recomputation's layer count itself): give both, or leave --recompute-method out")
    if "recompute_num_layers" in opts:
        spec = RecomputeSpec("full", opts.get("recompute_method", "block"), opts["recompute_num_layers"])
    elif "recompute_modules" in opts:
        spec = RecomputeSpec("selective", modules=opts["recompute_modules"])
    else:
        return None
    return spec.granularity, spec.method, spec.num_layers, spec.modules


def _offload_pin(args: argparse.Namespace, trace) -> str | None:
    """``--offload-activations`` as given (checked, and the GPU's host link there to copy over)."""
    text = getattr(args, "offload_activations", None)
    if text is None:
        return None
    from ..graph.offload import OffloadSpec, check_layer_count, host_link_rate

    check_layer_count(OffloadSpec.parse(text), str(text).strip(), trace)  # as run refuses it
    host_link_rate(trace)
    return str(text).strip()


def _rank_order(args: argparse.Namespace) -> tuple[str, ...]:
    """The run's ``--rank-order`` as the estimate numbers GPUs by it: tp innermost and cp, if named,
    right after it (Megatron-Core's orders; the estimate's TP and ring groups are consecutive)."""
    order = parse_rank_order(getattr(args, "rank_order", None) or "tp,pp,dp")
    if order[0] != "tp" or ("cp" in order and order[1] != "cp"):
        raise ConfigError(f"--rank-order {','.join(order)}: plan needs tp first (innermost) and cp, if named, right "
                          "after it, as Megatron-Core's orders have them (e.g. tp,cp,dp,pp); time other orders with "
                          "run or sweep")
    return order


def _routed_experts(args: argparse.Namespace, trace) -> int | None:
    """The routed experts of the trace's MoE layers (None: a dense model), with a pinned ``--ep``
    or ``--etp`` checked against them as ``run`` checks it."""
    from ..graph.expert.plan import check_ep, expert_ops, moe_shape

    ops, params = expert_ops(trace)
    ep, etp = getattr(args, "ep", None) or 1, getattr(args, "etp", None) or 1
    if not params:
        if ep > 1 or etp > 1:
            flag = f"--ep {ep}" if ep > 1 else f"--etp {etp}"
            raise ConfigError(f"{flag}: the model has no mixture-of-experts layer (no grouped expert GEMM)")
        return None
    experts = moe_shape(trace, ops, params)[0]
    check_ep(ep, experts, ep * etp, etp)  # divides the experts (the GPUs are the search's)
    if etp > 1 and getattr(args, "moe_token_dispatcher", "alltoall") != "alltoall":
        raise ConfigError(f"--etp {etp} with --moe-token-dispatcher {args.moe_token_dispatcher} is not modelled "
                          "(use alltoall)")
    return experts


def _layouts(args: argparse.Namespace, trace, unit: str) -> dict:
    """The search space's layout fields: a pinned layout (the layout flags), or on a model card
    cut by ``--partition auto`` the account-for splits searched beside the equal one."""
    split = LayerSplit.of(args)
    if split.given:
        if unit != "transformer layers":
            raise ConfigError(f"{split.flags()}: the trace has no repeated transformer layers to place")
        return {"split_pin": split}
    card = bool(trace.info.get("model_card"))
    return {"search_splits": card and unit == "transformer layers" and getattr(args, "partition", "auto") == "auto"}


def _card_layers(trace) -> dict:
    """The search space's count of a model card's decoder layers before its repeated ones and of
    its multi-token-prediction layers (the pipeline rules count the first)."""
    from ..graph.pipeline.stages import card_layer_extras

    leading, mtp = card_layer_extras(trace)
    return {"leading_layers": leading, "mtp_layers": mtp}


def _sliding_window_card(ns: argparse.Namespace) -> bool:
    """Whether the run's model card has sliding-window attention layers among its layers."""
    from ..config.model_flags import load_card, model_depth, model_given, sliding_window_layers

    if not model_given(ns):
        return False
    card = load_card(ns)
    return sliding_window_layers(card, model_depth(ns, card))


def _check_context(cp: int | None, sequence: int | None) -> None:
    """One line where a pinned ``--cp`` cannot run on the trace: no fused attention to split (or
    none whose sequence the trace shows), or a sequence that 2 · cp chunks do not divide."""
    if cp is None or cp == 1:
        return
    if sequence is None:
        raise ConfigError(f"--cp {cp} needs fused attention ops whose sequence the trace shows (scaled-dot-product "
                          "or flash attention); this trace has none: leave --cp out")
    if sequence % (2 * cp):
        raise ConfigError(f"--cp {cp} cuts each sequence into {2 * cp} chunks (causal load balancing): the sequence "
                          f"of {sequence} tokens is not a multiple of {2 * cp}")


def base_config(args: argparse.Namespace) -> tuple[dict, list[str]]:
    """The simulation flags every candidate shares (dest → value) and their command-line form:
    every simulation flag the user changed, the plan's own choices left out."""
    table = FlagTable.from_cli()
    config, flags = {}, []
    for spec in table.specs:
        value = getattr(args, spec.dest, spec.default)
        config[spec.dest] = value
        if spec.dest in CHOSEN or value == spec.default:
            continue
        option = f"--{spec.name}"
        if spec.is_bool:
            flags.append(option)
        else:
            flags += [option, str(value)]
    return config, flags


def _seq_len(args: argparse.Namespace, trace_dir: Path) -> int | None:
    """Tokens per sample: the trace's meta.json (a model card's trace writes its own), else
    ``--seq-len``."""
    try:
        meta = json.loads((trace_dir / "meta.json").read_text())
    except (OSError, ValueError):
        meta = None
    value = meta.get("seq_len") if isinstance(meta, dict) else None
    if isinstance(value, int) and value > 0:
        return value
    return getattr(args, "seq_len", None)


def _peak_flops(args: argparse.Namespace, trace) -> float | None:
    device = GpuOptions.of(args).device()
    if device is None:
        return None
    dtype = args.dtype if getattr(args, "dtype", "auto") != "auto" else None
    if dtype is None:
        sizes = [trace.tensors[k].each_byte for k in trace.parameters]
        dtype = "fp32" if not sizes or max(set(sizes), key=sizes.count) >= 4 else "bf16"
    try:
        return device.matrix_peak(dtype)
    except ConfigError:
        return None


def _progress(quiet: bool, stream=None):
    """(a rich display or None, the search's progress callback or None): a display on a
    terminal, plain lines every :data:`~triosim.cli.progress.LINE_EVERY_S` elsewhere, nothing
    with ``-q``."""
    stream = sys.stderr if stream is None else stream
    if quiet:
        return None, None
    if not is_terminal(stream):
        lines = ProgressLines(stream)

        def line(phase: str, done: int, total: int) -> None:
            lines.maybe(phase, done, total, "candidates")

        return None, line
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # Redrawn on each update, not by rich's refresh thread: with no other thread running, the
    # estimate and the DAG timing can fork their worker processes (triosim.plan.forked_estimate).
    prog = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,}"),
                    TimeElapsedColumn(), console=Console(file=stream), transient=True, auto_refresh=False)
    tasks: dict[str, int] = {}

    def update(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = prog.add_task(phase, total=total)
        prog.update(tasks[phase], completed=done)
        prog.refresh()

    return prog, update


@dataclass
class PlanInputs:
    """What one plan searches with, from its flags."""

    profile: object
    space: object
    candidates: list
    settings: object
    figures: object
    base: dict  # every simulation flag (dest -> value) the candidates share
    base_flags: list[str]  # those the user changed, as command-line flags
    trace_dir: Path
    protect: list[Path]


def _other_dispatchers(args: argparse.Namespace, experts: int | None) -> tuple[str, ...]:
    """The token dispatchers plan tries beside the run's own on an MoE model: none when the user
    gave ``--moe-token-dispatcher`` (a pin) or the model has no experts."""
    from ..config.typed_flags import typed
    from ..graph.expert.plan import DISPATCHERS

    if not experts or typed(args, "moe_token_dispatcher") or "moe_token_dispatcher" in getattr(args, "config_dests", ()):
        return ()
    own = getattr(args, "moe_token_dispatcher", "alltoall")
    return tuple(d for d in DISPATCHERS if d != own)


def plan_inputs(args: argparse.Namespace) -> PlanInputs:
    """Check the flags, build the platform of ``--gpus`` GPUs, load the trace and enumerate."""
    from ..plan import (
        Figures,
        ModelProfile,
        PlanSettings,
        SearchSpace,
        enumerate_candidates,
        explain_empty,
        mesh_shapes,
    )
    from ..plan.candidates import layer_facts
    from ..plan.combined_time import MoeOverlaps
    from ..plan.context_time import attention_sequence
    from ..plan.fp8_recipes import other_recipes, with_recipes
    from ..plan.search_size import check_search_size

    _check_flags(args)
    base, base_flags = base_config(args)
    trace_dir = trace_dir_from_flag(args.trace_dir)
    protect = input_files(args)
    refuse_outputs_over_inputs([("--out", args.out), ("--plot", args.plot)], args)
    # the platform of all N GPUs, and the trace at its recorded batch
    # (--fp8-param-gather: the distributed optimizer's or FSDP's gathers, so ZeRO 1-3 only)
    gathers = bool(getattr(args, "fp8_param_gather", False))
    ns = argparse.Namespace(**{**base, "dp": args.gpus, "tp": None, "pp": None, "cp": None, "gpus": None,
                               "global_batch": None, **({"zero": "1"} if gathers else {})})
    check_model_flags(ns)
    platform = platform_from_args(ns)
    batches = resolve_batches(ns)  # a model card's trace is built here, at one sequence per op
    raw = load_recorded_trace(batches.trace_dir, batches.batch, ns.time_column, layers_to_repeat(ns),
                              *op_time_options(ns), gpu_timing_options(ns), card=card_flag(ns))
    layers, unit, heads = layer_facts(raw)
    node = platform.node_of.count(0) if platform.node_of else args.gpus_per_node
    pinned = tuple((a, getattr(args, a)) for a in PINNABLE if getattr(args, a, None) is not None)
    sequence = attention_sequence(raw)
    if sequence is not None and _sliding_window_card(ns):
        # Transformer Engine's ring attention refuses sliding windows, and plan times only the ring
        if (getattr(args, "cp", None) or 1) > 1:
            raise ConfigError(f"--cp {args.cp}: the model's sliding-window attention layers do not run as ring "
                              "attention, the context parallelism plan searches (time --cp-comm-type a2a or "
                              "allgather with run, or sweep it)")
        sequence = None  # no context parallelism to search
    _check_context(getattr(args, "cp", None), sequence)
    experts = _routed_experts(args, raw)
    pinned += tuple((a, getattr(args, a)) for a in EXPERT_PINS if getattr(args, a, None) is not None)
    space = SearchSpace(args.gpus, args.global_batch, layers, heads, max(1, node), args.max_tp, pinned=pinned,
                        sequence=sequence, recompute_pin=_recompute_pin(args), offload_pin=_offload_pin(args, raw),
                        experts=experts, etp_allowed=getattr(args, "moe_token_dispatcher", "alltoall") == "alltoall",
                        combined=bool(getattr(args, "moe_a2a_overlap", False)), rank_order=_rank_order(args),
                        # Megatron-Core's precision-aware optimizer runs only in the distributed optimizer
                        **({"zero_stages": (1, 2, 3)} if gathers or getattr(ns, "use_precision_aware_optimizer", False)
                           else {}),
                        **_layouts(args, raw, unit), **_card_layers(raw))
    if not mesh_shapes(space):
        raise ConfigError(explain_empty(space, unit))
    precision = training_precision(ns)
    recipe_pinned = (getattr(args, "fp8_recipe", "auto") or "auto") != "auto"
    candidates = with_recipes(list(enumerate_candidates(space)),
                              other_recipes(precision, GpuOptions.of(ns).device(), recipe_pinned))
    check_search_size(space, candidates)  # before anything is profiled
    profile = ModelProfile(raw, platform, reference_compat=bool(ns.reference_compat), precision=precision,
                           moe=(str(getattr(args, "moe_token_dispatcher", "alltoall")),
                                float(getattr(args, "moe_imbalance", 1.0))),
                           overlaps=MoeOverlaps(bool(getattr(args, "moe_shared_expert_overlap", False)),
                                                bool(getattr(args, "moe_a2a_overlap", False)),
                                                bool(getattr(args, "delay_wgrad_compute", False))))
    settings = PlanSettings(args.global_batch, memory_capacity(ns), bucket_bytes=args.bucket_mb * 1024 * 1024,
                            seq_len=_seq_len(args, batches.trace_dir),
                            partition=args.partition if args.partition in ("count", "layers", "auto") else "time",
                            overlap_grad_reduce=bool(getattr(ns, "overlap_grad_reduce", False)),
                            overlap_param_gather=bool(getattr(ns, "overlap_param_gather", False)),
                            overlap_variants=args.overlaps == "search" and not (
                                getattr(ns, "overlap_grad_reduce", False) or getattr(ns, "overlap_param_gather", False)),
                            dispatchers=_other_dispatchers(args, experts),
                            pipeline_send=str(getattr(ns, "pipeline_send", "auto") or "auto"))
    flops = model_flops_per_sample(raw, raw.batch_size) * args.global_batch
    figures = Figures(args.gpus, args.global_batch, settings.seq_len, flops, _peak_flops(args, raw),
                      global_flag="global_batch" in base)
    return PlanInputs(profile, space, candidates, settings, figures, base, base_flags, trace_dir, protect)


def cmd_plan(args: argparse.Namespace) -> int:
    from ..plan import (
        explain_infeasible,
        mesh_shapes,
        print_pareto,
        print_table,
        run_line,
        search,
        strategy_has,
        write_csv,
        write_plot,
    )

    inputs = plan_inputs(args)
    profile, space, candidates, settings, figures = (inputs.profile, inputs.space, inputs.candidates,
                                                     inputs.settings, inputs.figures)
    base, base_flags, trace_dir, protect = inputs.base, inputs.base_flags, inputs.trace_dir, inputs.protect
    from ..sweep.execute import default_jobs

    jobs = default_jobs() if args.jobs is None else args.jobs
    # the settings between none, selective and full, where nothing of recomputation is pinned
    refined = space.recompute_pin is None and space.offload_pin is None and strategy_has("recompute")
    prog, update = _progress(args.quiet)
    # The first Ctrl-C stops the search; a second one (people press twice) must not stop the
    # writing of what the search finished.
    with FirstInterruptOnly() as interrupts:
        if prog is not None:
            with prog:
                outcome = search(candidates, profile, settings, base, args.top, jobs, update, args.dask, refined)
        else:
            outcome = search(candidates, profile, settings, base, args.top, jobs, update, args.dask, refined)
        interrupts.hold()
        if args.out:
            write_csv(args.out, outcome.rows, outcome.ranked, figures, base_flags, protect=protect)
        if args.plot and not outcome.interrupted:
            write_plot(args.plot, outcome.rows, outcome.ranked, figures, protect=protect)
    if outcome.interrupted:
        done = sum(1 for r in outcome.rows if r.estimate is not None)
        timed = sum(1 for r in outcome.rows if r.dag is not None)
        kept = f"; {args.out} keeps them" if args.out else ""
        print(f"triosim: interrupted after {done:,} estimates and {timed} DAG timings{kept}", file=sys.stderr)
        return 130
    if not outcome.ranked:
        for line in explain_infeasible(outcome.rows):
            print(f"triosim: {line}", file=sys.stderr)
        return EXIT_NOTHING_FITS
    if args.quiet:
        print(run_line(base_flags, outcome.ranked[0], figures))
        return 0
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    feasible = sum(1 for r in outcome.rows if r.feasible)
    out_of_memory = sum(1 for r in outcome.rows if r.estimate is not None and not r.estimate.fits)
    errors = sum(1 for r in outcome.rows if r.error is not None)
    timed = sum(1 for r in outcome.rows if r.dag is not None)
    refinements = len(outcome.rows) - len(candidates)  # partial recomputation or offload of those that do not fit
    console.print(f"{len(candidates):,} candidates"
                  + (f" and {refinements:,} refinements" if refinements else "")
                  + f" on {args.gpus:,} GPUs ({len(mesh_shapes(space))} meshes), "
                  f"global batch {args.global_batch}: {feasible:,} fit, {out_of_memory:,} do not fit in memory"
                  + (f", {errors:,} refused" if errors else "")
                  + f"; estimated in {outcome.estimate_s:.1f} s, {timed} DAG-timed in {outcome.dag_s:.1f} s")
    name = getattr(args, "model", None) or getattr(args, "model_file", None) or trace_dir.name
    title = f"{name}" + (f" × {args.num_layers} layers" if args.num_layers else "") + \
        f" · {args.gpus} GPUs · global batch {args.global_batch}"
    print_table(console, outcome.ranked, figures, base_flags, args.show, title)
    print_pareto(console, outcome.ranked, args.show)
    for flag, path in (("CSV", args.out), ("plot", args.plot)):
        if path:
            console.print(f"{flag} written to {shlex.quote(path)}", soft_wrap=True)
    return 0


__all__ = ["cmd_plan", "register"]
