"""Flags to objects: the batch sizes, the scaled trace, the Platform and the Strategy of a run."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..compute.op_time import attach_op_time_model
from ..compute.scale import scale_trace
from ..errors import ConfigError, TraceError
from ..graph.layer_count import check_pipeline_depth
from ..graph.strategy import Strategy, parse_zero
from ..hardware.platform import Platform
from ..hardware.presets import build_platform
from ..hardware.topology_file import check as check_topology_file
from ..limits import check_batch_limit, check_gpu_count
from ..trace import Trace
from ..trace.load import load_trace, trace_batch_size
from .batch_flags import global_batch_per_replica
from .comm_flags import apply_link_efficiency
from .defaults import apply_run_defaults, resolve_schedule
from .flags import sim_namespace
from .gpu import GpuOptions, planning_capacity, time_trace_on_gpu
from .layout_flags import layout_options
from .model_flags import card_flag, card_trace_error, check_model_flags, model_given, model_trace
from .notes import check_unused_platform_flags
from .parallel_flags import degrees_given, parallel_options, resolve_gpus
from .precision import training_precision, with_flag_precision
from .trace_dirs import trace_dir_from_flag
from .typed_flags import typed


@dataclass(frozen=True)
class BatchSizes:
    """The trace's recorded batch (and where that number came from) and the simulated one."""

    trace_dir: Path
    batch: int
    source: str  # "flag", "meta.json" or "assumed" (no meta.json: 128)
    sim: int


def resolve_batches(args: argparse.Namespace, info_cache: dict[str, tuple[int, str]] | None = None) -> BatchSizes:
    """The trace directory and both batch sizes of a configuration, checked as ``run`` does.

    ``info_cache`` (trace directory → (batch, source)) lets a sweep read each meta.json once.
    """
    apply_run_defaults(args)
    if model_given(args):  # no trace directory: the card's trace, built at the micro-batch
        built = model_trace(args, GpuOptions.of(args).dtype)
        trace_dir, batch, source = built.trace_dir, built.batch, "model card"
    else:
        trace_dir = trace_dir_from_flag(args.trace_dir)
        batch, source = args.batch_size, "flag"
    if batch is None:
        key = str(trace_dir)
        if info_cache is not None and key in info_cache:
            batch, source = info_cache[key]
        else:
            batch, source = trace_batch_size(trace_dir)
            if info_cache is not None:
                info_cache[key] = (batch, source)
    if batch <= 0:
        raise ConfigError(f"-batch-size must be a positive integer, got {batch}")
    sim = global_batch_per_replica(args)
    if sim is None:
        sim = args.batch_size_sim if args.batch_size_sim not in (None, -1) else batch
    if sim <= 0:
        raise ConfigError(f"-batch-size-sim must be a positive integer (or -1 for the trace's batch), got {sim}")
    check_batch_limit(batch, "-batch-size")
    check_batch_limit(sim, "-batch-size-sim")
    return BatchSizes(trace_dir, batch, source, sim)


def load_scaled_trace(args: argparse.Namespace) -> Trace:
    """The trace of ``--trace-dir`` recorded at its batch, scaled to ``--batch-size-sim``."""
    b = resolve_batches(args)
    trace = load_recorded_trace(b.trace_dir, b.batch, args.time_column, layers_to_repeat(args),
                                *op_time_options(args), gpu_timing_options(args), card=card_flag(args))
    trace = trace.with_batch_source(b.source)
    return scale_trace(trace, b.sim, reference_compat=args.reference_compat)


def layers_to_repeat(args: argparse.Namespace) -> int | None:
    """The depth the trace's layer is repeated to: ``--num-layers``, or a card's depth when its
    trace holds fewer layers (None: as loaded)."""
    if model_given(args):
        return model_trace(args, GpuOptions.of(args).dtype).repeat_to
    return getattr(args, "num_layers", None)


def op_time_options(args: argparse.Namespace) -> tuple[str, float]:
    """(op-time model, kernel floor in µs) of the flags; the original's linear scaling under
    --reference-compat."""
    model = "linear" if args.reference_compat else getattr(args, "op_time_model", "auto")
    if getattr(args, "num_layers", None) is not None and model == "auto":
        model = "linear-floor"  # traces at other batches in the directory have the original depth
    return model, float(getattr(args, "kernel_floor_us", 2.0))


def gpu_timing_options(args: argparse.Namespace) -> GpuOptions | None:
    """The GPU flags that decide op times (None without ``--gpu``): part of a sweep's trace key."""
    options = GpuOptions.of(args)
    return GpuOptions(options.gpu, options.gpu_file, options.source, options.trace_gpu, options.dtype) \
        if options.given else None


def load_recorded_trace(trace_dir: str | Path, batch: int, time_column: str, num_layers: int | None,
                        op_time_model: str = "auto", kernel_floor_us: float = 2.0,
                        gpu: GpuOptions | None = None, card: str | None = None) -> Trace:
    """The trace at its recorded batch, its transformer layer repeated to ``num_layers`` if given,
    with its op-time model, timed on ``gpu``'s device when given (``run``, ``plan`` and every
    configuration of a sweep load traces through here). ``card``: the flag that named the model
    card the trace was built from (:func:`~triosim.config.model_flags.card_flag`); a check the
    built trace fails is then said of the card, not of the cached trace's files."""
    try:
        return _load_recorded(trace_dir, batch, time_column, num_layers, op_time_model, kernel_floor_us, gpu)
    except TraceError as exc:
        if card is None:
            raise
        raise card_trace_error(exc, card, trace_dir, num_layers) from None


def _load_recorded(trace_dir: str | Path, batch: int, time_column: str, num_layers: int | None,
                   op_time_model: str, kernel_floor_us: float, gpu: GpuOptions | None) -> Trace:
    if num_layers is not None:
        if num_layers < 1:
            raise ConfigError(f"--num-layers must be a positive integer, got {num_layers}")
        from ..trace.repeat import load_repeated

        trace = load_repeated(trace_dir, num_layers, batch_size=batch, time_column=time_column)
    else:
        trace = load_trace(trace_dir, batch_size=batch, time_column=time_column)
    trace = attach_op_time_model(trace, op_time_model, kernel_floor_us, time_column)
    if gpu is not None:  # after loading, before batch scaling
        trace = time_trace_on_gpu(trace, gpu)[0]
    return trace


# What each -case is as degrees, for the error that refuses both at once.
_CASE_AS_DEGREES = {
    0: "-case 0 is one GPU: leave -case out",
    1: "-case 1 (one all-reduce after backward) has no degrees form: leave out the degrees",
    2: "-case 2 is --dp N",
    3: "-case 3 is --tp N --tp-style per-op",
    4: "-case 4 is --pp N",
}


def check_case(args: argparse.Namespace) -> None:
    """``-case`` is 0..4, and not given together with ``--dp/--tp/--pp``: both choose the
    parallelism, and a run with degrees used to drop ``-case`` silently. ``-case 0`` counts as
    given only when typed (it is every run's default, and a ``--json`` result's config block
    records it for hybrid runs too)."""
    if args.case not in range(5):
        raise ConfigError(f"-case must be one of 0..4, got {args.case}")
    if degrees_given(args) and (args.case != 0 or typed(args, "case")):
        degrees = " ".join(f"--{k} {getattr(args, k)}" for k in ("dp", "tp", "pp", "cp")
                           if getattr(args, k, None) is not None)
        raise ConfigError(f"-case {args.case} and {degrees} both choose the parallelism; give one of them "
                          f"({_CASE_AS_DEGREES[args.case]})")


def check_hybrid_micro_batch(mb: int | None, batch: int) -> None:
    """A hybrid run cuts each replica's batch into equal micro-batches, as Megatron-LM does
    (its global batch must be micro-batch × micro-batches × dp); ``-case 4`` alone keeps GPipe's
    smaller last micro-batch (docs/parallelism.md)."""
    if mb is None or batch % mb == 0:
        return
    divisors = [d for d in range(1, batch + 1) if batch % d == 0]
    near = sorted(sorted(divisors, key=lambda d: (abs(d - mb), d))[:6])
    raise ConfigError(f"-micro-batch-size {mb} does not divide the per-replica batch of {batch}: a --dp/--tp/--pp "
                      f"run cuts it into equal micro-batches (use {', '.join(map(str, near))})")


def strategy_from_args(args: argparse.Namespace, sim_batch: int) -> Strategy:
    apply_run_defaults(args)
    mb = args.micro_batch_size if args.micro_batch_size not in (None, -1) else None
    if mb is not None and mb <= 0:
        raise ConfigError(f"-micro-batch-size must be a positive integer, got {mb}")
    if mb is not None and mb > sim_batch:
        raise ConfigError(f"-micro-batch-size {mb} is larger than the simulated batch {sim_batch}")
    if degrees_given(args):
        check_hybrid_micro_batch(mb, sim_batch)
    schedule = args.schedule
    if degrees_given(args) or args.case == 4:  # the runs that have micro-batches
        schedule = resolve_schedule(args, -(-sim_batch // mb) if mb else 1)
    elif schedule == "auto":
        schedule = "gpipe"
    strategy = Strategy(
        case=args.case,
        micro_batch_size=mb,
        bucket_mb=args.bucket_mb,
        schedule=schedule,
        partition=args.partition,
        initial_placement=args.initial_placement,
        reference_compat=args.reference_compat,
        collective_detail=args.collective_detail,
        virtual_stages=getattr(args, "virtual_stages", 1),
        **parallel_options(args),
        **layout_options(args),
    )
    strategy.validate(resolve_gpus(args))
    return strategy


def platform_from_args(args: argparse.Namespace) -> Platform:
    apply_run_defaults(args)
    check_model_flags(args)  # first: "--model needs --gpu" says more than any GPU-flag error
    GpuOptions.of(args).check(bool(args.reference_compat))
    gpus = resolve_gpus(args)
    check_gpu_count(gpus)
    # case 0 runs on one GPU whatever -GPUnumber says; a hybrid run on dp × tp × pp
    single = gpus == 1 if degrees_given(args) else args.case == 0
    if single or args.topology_file is not None:
        check_unused_platform_flags(args)  # not used, but a wrong value is still an error
    if single and args.topology_file is not None:
        check_topology_file(args.topology_file)  # likewise: read and checked, not built
    platform = build_platform(
        num_gpus=1 if single else gpus,
        capacity_log2=args.capacity,
        capacity_bytes=planning_capacity(args),
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
        topology_file=None if single else args.topology_file,
        network=args.network,
        collective_algo=args.collective_algo,
        collective_latency_us=args.collective_latency_us,
    )
    platform = apply_link_efficiency(platform, getattr(args, "link_efficiency", None), args.reference_compat)
    protocol = getattr(args, "collective_protocol", "simple")
    if protocol != "simple" and not args.reference_compat:  # the original had Simple only
        platform = platform.with_network(collective_protocol=protocol)
    return platform


def configure(args: argparse.Namespace | Mapping[str, Any] | None = None,
              **options: Any) -> tuple[Trace, Platform, Strategy]:
    """(trace, platform, strategy) from parsed flags, a mapping or keyword arguments.

    ``configure(case=2, gpus=4, trace_dir="t")`` takes the flag names (any spelling, ``_`` for
    ``-``) and fills in every other flag's default. Flags are checked before the trace is read.
    """
    if not isinstance(args, argparse.Namespace):
        args = sim_namespace({**dict(args or {}), **options}, where="configure()")
    elif options:
        raise TypeError("configure(): pass either a namespace or keyword options, not both")
    check_case(args)
    apply_run_defaults(args)
    training_precision(args)  # the flags' own errors before any file is read
    if getattr(args, "use_precision_aware_optimizer", False) and parse_zero(getattr(args, "zero", "0") or "0") == 0:
        raise ConfigError("--use-precision-aware-optimizer needs the distributed optimizer (--zero 1 or more), as "
                          "Megatron-Core requires")
    platform = platform_from_args(args)
    trace = with_flag_precision(load_scaled_trace(args), args)
    strategy = strategy_from_args(args, trace.batch_size)
    if strategy.hybrid:  # before any graph is built: a pipeline stage per layer at most
        check_pipeline_depth(trace, strategy.degrees(platform.num_gpus)[2],
                             strategy.virtual_stages if strategy.schedule == "interleaved" else 1, strategy)
    return trace, platform, strategy
