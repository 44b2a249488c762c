"""Run configuration: the simulation flags, and how they become a (Trace, Platform, Strategy).

One module turns every way of describing a run into the three objects a simulation needs:

* command-line flags (``triosim run``, ``triosim dag``; :func:`add_sim_flags` defines them),
* a configuration file (``--config run.yaml`` or ``.json``, keys spelled like the flags, or the
  ``config`` block of a ``--json`` result), read by :func:`read_config_file`,
* Python arguments: ``configure(case=2, gpus=4, trace_dir="my_trace")``.

``triosim.cli.console`` and ``triosim.sweep`` are thin shells over it: both read the flag table from
here, neither imports the other.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .compute.op_time import attach_op_time_model
from .compute.scale import scale_trace
from .errors import ConfigError
from .graph.layer_count import check_pipeline_depth
from .graph.strategy import Strategy
from .hardware.platform import (
    COLLECTIVE_ALGOS,
    COLLECTIVE_PROTOCOLS,
    NETWORKS,
    Platform,
    build_platform,
)
from .limits import check_gpu_count
from .notes import check_unused_platform_flags
from .parallel_flags import add_parallel_flags, degrees_given, parallel_options, resolve_gpus
from .trace import Trace, load_trace, trace_batch_size

DEFAULT_WORD = "default"  # a value spelling that means "the run default of this flag"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def default_trace_dir() -> Path:
    """The embedded sample trace (shipped in the wheel as ``triosim.sample_trace``)."""
    from .sample_trace import trace_dir

    return trace_dir()


def trace_dir_from_flag(value: str | os.PathLike | None) -> Path:
    """``-trace-dir``'s directory; not given means the embedded sample, but "" is a mistake."""
    if value is None:
        return default_trace_dir()
    if not str(value).strip():
        raise ConfigError("-trace-dir is empty; leave it out to use the embedded sample trace")
    return Path(value)


# ----------------------------------------------------------------------------- the flags


def add_sim_flags(p: argparse.ArgumentParser) -> None:
    """The flags shared by ``run``, ``dag`` and ``sweep``: trace, platform and strategy.

    Every flag added here is also a key of ``--config`` files, an axis ``triosim sweep`` can
    vary, and a keyword of :func:`configure`.
    """
    g = p.add_argument_group("trace")
    g.add_argument("--trace-dir", help="trace directory with trace.csv + tensor.csv (default: the embedded sample)")
    g.add_argument("--batch-size", type=int, default=None,
                   help="batch the trace was recorded at (default: from meta.json, else 128)")
    g.add_argument("--batch-size-sim", type=int, default=-1, help="per-GPU simulated batch (default: = batch-size)")
    g.add_argument("--time-column", choices=("nooverlap", "span"), default="nooverlap",
                   help="op time: kernel-time sum (default, as the original) or first-to-last kernel span")
    g.add_argument("--num-layers", type=int, default=None, metavar="L",
                   help="repeat the trace's transformer layer to L layers before simulating (as `trace repeat`)")
    g.add_argument("--op-time-model", default="auto",
                   help="op time at another batch: auto (fit if the trace dir has batch-<N>/ traces, else "
                        "linear-floor), fit, linear-floor or linear (the original's; always under --reference-compat)")
    g.add_argument("--kernel-floor-us", type=float, default=2.0,
                   help="shortest op time in µs when scaling to a smaller batch or micro-batch (2)")
    g = p.add_argument_group("platform")
    g.add_argument("--GPUnumber", "--gpus", dest="gpus", type=int, default=None,
                   help="number of GPUs (8; a hybrid run: dp × tp × pp)")
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
    g.add_argument("--topology-file", default=None, metavar="FILE.yaml",
                   help="read the cluster from a YAML file (kind: preset or cluster; a shipped name such as "
                        "dgx-h100-superpod works too); its links replace --topology and the bandwidth flags")
    g.add_argument("--network", choices=NETWORKS, default="flow",
                   help="link model: flow (concurrent transfers share links max-min fairly, default) or exclusive "
                        "(a transfer reserves its whole route, the original model)")
    g.add_argument("--collective-algo", choices=COLLECTIVE_ALGOS, default="auto",
                   help="collective algorithm: auto (fastest closed form, as NCCL's tuner; default), ring, "
                        "one-way-ring (the original), tree, hierarchical or direct")
    g.add_argument("--collective-protocol", choices=COLLECTIVE_PROTOCOLS, default="simple",
                   help="NCCL protocol of every collective: simple (default), ll or ll128 (lower latency, less "
                        "bandwidth), or auto (the fastest protocol and algorithm per collective, as NCCL's tuner)")
    g.add_argument("--collective-latency-us", type=collective_latency, default=None, metavar="US|nccl",
                   help="per-step collective latency in µs (default nccl: NCCL's per-algorithm and per-link "
                        "constants plus its per-call latency; 0 turns collective latency off)")
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
                   help="reproduce the original TrioSim's conventions (see docs/reference-compat.md)")
    add_parallel_flags(g)


def collective_latency(text: str) -> float | None:
    """``--collective-latency-us``: a number of µs, or ``nccl`` (None: NCCL's constants)."""
    if str(text).strip().lower() == "nccl":
        return None
    return float(text)


@dataclass(frozen=True)
class FlagSpec:
    """One simulation flag as configuration files, sweeps and Python arguments see it."""

    dest: str
    name: str  # the key: the last (most readable) long option without dashes, e.g. ``gpus``
    options: tuple[str, ...]
    type: Callable[[str], Any] | None
    choices: tuple[Any, ...] | None
    is_bool: bool
    default: Any
    help: str
    group: str

    def parse(self, raw: Any) -> Any:
        """One value, from a command-line token or a YAML/JSON scalar, checked like ``run`` does."""
        if raw is None or (isinstance(raw, str) and raw.strip().lower() == DEFAULT_WORD):
            return self.default
        if self.is_bool:
            if isinstance(raw, bool):
                return raw
            word = str(raw).strip().lower()
            if word in _TRUE:
                return True
            if word in _FALSE:
                return False
            raise ConfigError(f"--{self.name}: {raw!r} is not a boolean (true/false)")
        if isinstance(raw, bool) or isinstance(raw, (list, dict)):
            raise ConfigError(f"--{self.name}: {raw!r} is not a valid value")
        value: Any = raw.strip() if isinstance(raw, str) else raw
        if self.type is int and isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"--{self.name}: {raw!r} is not an integer")
        if self.type is not None:
            try:
                value = self.type(int(value) if self.type is int and isinstance(value, float) else value)
            except (TypeError, ValueError):
                kind = {int: "an integer", float: "a number"}.get(self.type, "a valid value")
                raise ConfigError(f"--{self.name}: {raw!r} is not {kind}") from None
        elif not isinstance(value, str):
            value = str(value)
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"--{self.name}: {raw!r} is not one of {', '.join(map(str, self.choices))}"
            )
        return value


def flag_key(name: str) -> str:
    """Spelling-insensitive flag key: ``-GPUnumber``, ``gpunumber``, ``ptp_bandwidth``, …"""
    return name.strip().lstrip("-").replace("_", "-").lower()


@dataclass(frozen=True)
class FlagTable:
    """All simulation flags, in :func:`add_sim_flags` order, with a lookup by any spelling."""

    specs: tuple[FlagSpec, ...]

    @classmethod
    def from_cli(cls) -> FlagTable:
        """The table of :func:`add_sim_flags`: the flags of ``triosim run``."""
        parser = argparse.ArgumentParser(add_help=False)
        add_sim_flags(parser)
        specs = []
        # argparse keeps groups and actions in private lists; they have been stable since 2.7
        # and reading them is what keeps this table in step with `triosim run`.
        for group in parser._action_groups:
            for action in group._group_actions:
                if not action.option_strings:
                    continue
                longs = [o for o in action.option_strings if o.startswith("--")]
                is_bool = action.nargs == 0 and action.const is True
                specs.append(
                    FlagSpec(
                        dest=action.dest,
                        name=(longs or action.option_strings)[-1].lstrip("-"),
                        options=tuple(action.option_strings),
                        type=action.type if callable(action.type) else None,
                        choices=tuple(action.choices) if action.choices else None,
                        is_bool=is_bool,
                        default=action.default,
                        help=action.help or "",
                        group=group.title or "",
                    )
                )
        return cls(tuple(specs))

    def lookup(self, name: str, where: str = "the sweep grid") -> FlagSpec:
        key = flag_key(name)
        for spec in self.specs:
            if key == flag_key(spec.dest) or any(key == flag_key(o) for o in spec.options):
                return spec
        known = ", ".join(s.name for s in self.specs)
        raise ConfigError(f"unknown flag {name!r} in {where} (known: {known})")

    def by_dest(self, dest: str) -> FlagSpec:
        for spec in self.specs:
            if spec.dest == dest:
                return spec
        raise KeyError(dest)

    def defaults(self) -> dict[str, Any]:
        return {s.dest: s.default for s in self.specs}


def sim_namespace(options: Mapping[str, Any] | None = None, where: str = "the options") -> argparse.Namespace:
    """Every simulation flag at its ``run`` default, with ``options`` (any flag spelling) applied.

    Values are checked and converted like the command line does (``"8"`` → 8, ``"default"`` →
    the default); an unknown key is a ConfigError naming ``where``.
    """
    table = FlagTable.from_cli()
    values = table.defaults()
    for name, raw in (options or {}).items():
        spec = table.lookup(str(name), where)
        values[spec.dest] = spec.parse(raw)
    return argparse.Namespace(**values)


# ----------------------------------------------------------------------------- flags -> objects


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
    sim = args.batch_size_sim if args.batch_size_sim not in (None, -1) else batch
    if sim <= 0:
        raise ConfigError(f"-batch-size-sim must be a positive integer (or -1 for the trace's batch), got {sim}")
    return BatchSizes(trace_dir, batch, source, sim)


def load_scaled_trace(args: argparse.Namespace) -> Trace:
    """The trace of ``--trace-dir`` recorded at its batch, scaled to ``--batch-size-sim``."""
    b = resolve_batches(args)
    trace = load_recorded_trace(b.trace_dir, b.batch, args.time_column, getattr(args, "num_layers", None),
                                *op_time_options(args))
    trace = trace.with_batch_source(b.source)
    return scale_trace(trace, b.sim, reference_compat=args.reference_compat)


def op_time_options(args: argparse.Namespace) -> tuple[str, float]:
    """(op-time model, kernel floor in µs) of the flags; the original's linear scaling under
    --reference-compat."""
    model = "linear" if args.reference_compat else getattr(args, "op_time_model", "auto")
    if getattr(args, "num_layers", None) is not None and model == "auto":
        model = "linear-floor"  # traces at other batches in the directory have the original depth
    return model, float(getattr(args, "kernel_floor_us", 2.0))


def load_recorded_trace(trace_dir: str | Path, batch: int, time_column: str, num_layers: int | None,
                        op_time_model: str = "auto", kernel_floor_us: float = 2.0) -> Trace:
    """The trace at its recorded batch, its transformer layer repeated to ``num_layers`` if given,
    with its op-time model (``run`` and every configuration of a sweep load traces through here)."""
    if num_layers is not None:
        if num_layers < 1:
            raise ConfigError(f"--num-layers must be a positive integer, got {num_layers}")
        from .trace.repeat import load_repeated

        trace = load_repeated(trace_dir, num_layers, batch_size=batch, time_column=time_column)
    else:
        trace = load_trace(trace_dir, batch_size=batch, time_column=time_column)
    return attach_op_time_model(trace, op_time_model, kernel_floor_us, time_column)


def check_case(args: argparse.Namespace) -> None:
    if args.case not in range(5):
        raise ConfigError(f"-case must be one of 0..4, got {args.case}")


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
        **parallel_options(args),
    )
    strategy.validate(resolve_gpus(args))
    return strategy


def platform_from_args(args: argparse.Namespace) -> Platform:
    gpus = resolve_gpus(args)
    check_gpu_count(gpus)
    # case 0 runs on one GPU whatever -GPUnumber says; a hybrid run on dp × tp × pp
    single = gpus == 1 if degrees_given(args) else args.case == 0
    if single:
        check_unused_platform_flags(args)  # not used, but a wrong value is still an error
    platform = build_platform(
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
        topology_file=None if single else args.topology_file,
        network=args.network,
        collective_algo=args.collective_algo,
        collective_latency_us=args.collective_latency_us,
    )
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
    platform = platform_from_args(args)
    trace = load_scaled_trace(args)
    strategy = strategy_from_args(args, trace.batch_size)
    if strategy.hybrid:  # before any graph is built: a pipeline stage per layer at most
        check_pipeline_depth(trace, strategy.degrees(platform.num_gpus)[2],
                             strategy.virtual_stages if strategy.schedule == "interleaved" else 1)
    return trace, platform, strategy


# ----------------------------------------------------------------------------- configuration files


def read_config_file(path: str | Path, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``--config`` file: a mapping flag name → value, JSON (``.json``) or YAML (otherwise).

    A whole ``--json`` result is accepted too: its ``config`` block is used. Keys that describe
    the run but are no flag (``triosim_version``, ``trace_sha256``, …) go into ``facts`` when
    given (``check_config_facts`` compares them with this run), else they are ignored.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--config {p}: cannot read ({exc.strerror})") from None
    data = parse_mapping_text(text, p, "--config")
    if "config" in data and isinstance(data["config"], dict) and "makespan_ms" in data:
        data = data["config"]
    out: dict[str, Any] = {}
    table = FlagTable.from_cli()
    for name, value in data.items():
        if str(name) in INFO_KEYS:
            if facts is not None:
                facts[str(name)] = value
            continue
        spec = table.lookup(str(name), f"--config {p}")
        if isinstance(value, (list, dict)):
            raise ConfigError(f"--config {p}: {name!r} must be a single value (sweep lists belong in --grid)")
        try:
            out[spec.dest] = spec.parse(value)
        except ConfigError as exc:
            raise ConfigError(f"--config {p}: {exc}") from None
    return out


def parse_mapping_text(text: str, path: Path, flag: str) -> dict[str, Any]:
    """JSON when the name ends in ``.json``, YAML otherwise (PyYAML is needed only then)."""
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{flag} {path}: invalid JSON ({exc})") from None
    else:
        try:
            import yaml
        except ImportError:
            raise ConfigError(
                f"{flag} {path}: reading YAML needs PyYAML (pip install 'triosim[yaml]'), or use a .json file"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{flag} {path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{flag} {path}: expected a mapping of flag names to values")
    return data


# Keys of a result's ``config`` block that record facts about the run rather than set a flag.
INFO_KEYS = frozenset({"triosim_version", "trace_sha256", "tensor_sha256"})


def file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def config_block(args: argparse.Namespace) -> dict[str, Any]:
    """Everything needed to run this simulation again: every simulation flag by its key (the
    trace directory made absolute), the triosim version and the sha256 of both trace files.

    ``--config`` accepts the block back (or the whole ``--json`` result holding it).
    """
    from . import __version__

    table = FlagTable.from_cli()
    trace_dir = trace_dir_from_flag(args.trace_dir)
    block: dict[str, Any] = {}
    for spec in table.specs:
        value = getattr(args, spec.dest, spec.default)
        if spec.dest == "trace_dir":
            value = str(trace_dir.resolve())
        block[spec.name] = value
    block["triosim_version"] = __version__
    block["trace_sha256"] = file_sha256(trace_dir / "trace.csv")
    block["tensor_sha256"] = file_sha256(trace_dir / "tensor.csv")
    return block


def check_config_facts(facts: dict[str, Any], block: dict[str, Any]) -> list[str]:
    """Warnings when a run from a result's ``config`` block cannot reproduce that result: the
    trace files or the triosim version differ from what the block recorded."""
    warnings = []
    for key, what in (("trace_sha256", "trace.csv"), ("tensor_sha256", "tensor.csv")):
        if key in facts and facts[key] != block.get(key):
            warnings.append(f"{what} differs from the one the configuration was recorded with "
                            f"(sha256 {str(facts[key])[:12]}… then, {str(block.get(key))[:12]}… now)")
    if "triosim_version" in facts and facts["triosim_version"] != block.get("triosim_version"):
        warnings.append(f"the configuration was recorded with triosim {facts['triosim_version']}, "
                        f"this is {block.get('triosim_version')}")
    return warnings
