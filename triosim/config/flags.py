"""The simulation flags: one table (name, type, default, help) that the command line, ``--config``
files, sweep grids and Python arguments all read, so no flag is defined or checked twice."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..hardware.platform import COLLECTIVE_ALGOS, COLLECTIVE_PROTOCOLS, NETWORKS
from .batch_flags import add_global_batch_flag
from .comm_flags import add_comm_flags
from .gpu import add_gpu_flags
from .layout_flags import add_layout_flags
from .model_flags import add_model_flags
from .parallel_flags import add_parallel_flags
from .precision import add_precision_flags
from .typed_flags import StoreTyped

DEFAULT_WORD = "default"  # a value spelling that means "the run default of this flag"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
def add_sim_flags(p: argparse.ArgumentParser) -> None:
    """The flags shared by ``run``, ``dag`` and ``sweep``: trace, platform and strategy.

    Every flag added here is also a key of ``--config`` files, an axis ``triosim sweep`` can
    vary, and a keyword of :func:`configure`.
    """
    g = p.add_argument_group("trace")
    g.add_argument("--trace-dir", help="trace directory with trace.csv + tensor.csv (default: the embedded sample)")
    g.add_argument("--batch-size", type=int, default=None,
                   help="batch the trace was recorded at (default: from meta.json, else 128)")
    g.add_argument("--batch-size-sim", type=int, default=-1, help="per-GPU simulated batch (default: = batch-size); a --dp/--tp/--pp run: "
                        "per data-parallel replica (or give --global-batch)")
    g.add_argument("--time-column", choices=("nooverlap", "span"), default="nooverlap",
                   help="op time: kernel-time sum (default, as the original) or first-to-last kernel span")
    g.add_argument("--num-layers", type=int, default=None, metavar="L",
                   help="repeat the trace's transformer layer to L layers before simulating (as `trace repeat`)")
    g.add_argument("--op-time-model", default="auto",
                   help="op time at another batch: auto (fit if the trace dir has batch-<N>/ traces, else "
                        "linear-floor), fit, linear-floor or linear (the original's; always under --reference-compat)")
    g.add_argument("--kernel-floor-us", type=float, default=2.0,
                   help="shortest op time in µs when scaling to a smaller batch or micro-batch (2)")
    add_model_flags(g)
    g = p.add_argument_group("platform")
    g.add_argument("--GPUnumber", "--gpus", dest="gpus", type=int, default=None,
                   help="number of GPUs (8; a hybrid run: dp × tp × pp)")
    g.add_argument("--bandwidth", type=float, default=696.0, help="GPU↔remote-memory link, GB/s (696)")
    g.add_argument("--ptp-bandwidth", type=float, default=65.0, help="GPU↔GPU link, GB/s (65)")
    g.add_argument("--capacity", type=float, default=40.0, help="GPU memory = 2^capacity bytes (40)")
    g.add_argument("--interconnects", type=int, default=0, help="0 electrical, 1 optical mesh")
    g.add_argument("--numRows", dest="num_rows", type=int, default=1, help="optical mesh rows (1)")
    g.add_argument("--numCols", dest="num_cols", type=int, default=None, help="optical mesh columns (= GPUnumber)")
    g.add_argument("--topology", default="ring", action=StoreTyped,
                   help="electrical topology: ring, fully-connected, switch, nvlink-cluster")
    g.add_argument("--gpus-per-node", type=int, default=8, help="nvlink-cluster: GPUs per NVSwitch node (8)")
    g.add_argument("--node-bandwidth", type=float, default=50.0,
                   help="nvlink-cluster: each GPU's NIC to the cluster network, GB/s (50 = 400 Gb/s)")
    g.add_argument("--link-latency-us", type=float, default=None, help="per-link latency in µs (0; optical hop 0.02)")
    g.add_argument("--topology-file", default=None, metavar="FILE.yaml",
                   help="read the cluster from a YAML file (kind: preset or cluster; a shipped name such as "
                        "dgx-h100-superpod works too); its links replace --topology, -ptp-bandwidth, "
                        "-interconnects, the mesh and node flags and --link-latency-us")
    g.add_argument("--network", choices=NETWORKS, default="flow",
                   help="link model: flow (concurrent transfers share links max-min fairly, default) or exclusive "
                        "(a transfer reserves its whole route, the original model)")
    g.add_argument("--collective-algo", choices=COLLECTIVE_ALGOS, default="auto",
                   help="collective algorithm: auto (fastest closed form, as NCCL's tuner; default), ring, "
                        "one-way-ring (the original), tree, hierarchical, direct or nvls (NVLink SHARP, where "
                        "the topology file's NVLink switch offers it; elsewhere ring)")
    g.add_argument("--collective-protocol", choices=COLLECTIVE_PROTOCOLS, default="simple",
                   help="NCCL protocol of every collective: simple (default), ll or ll128 (lower latency, less "
                        "bandwidth), or auto (the fastest protocol and algorithm per collective, as NCCL's tuner); "
                        "--reference-compat always runs the original's Simple")
    g.add_argument("--collective-latency-us", type=collective_latency, default=None, metavar="US|nccl",
                   help="per-step collective latency in µs (default nccl: NCCL's per-algorithm and per-link "
                        "constants plus its per-call latency; 0 turns collective latency off)")
    add_comm_flags(g)
    g = p.add_argument_group("strategy")
    g.add_argument("--case", type=int, default=0, action=StoreTyped,
                   help="0 single GPU, 1 data parallel, 2 DDP, 3 tensor parallel, 4 pipeline parallel "
                        "(not with --dp/--tp/--pp: -case 2 is --dp N, 3 is --tp N --tp-style per-op, 4 is --pp N)")
    g.add_argument("--micro-batch-size", type=int, default=-1,
                   help="pipeline micro-batch (default: 1 with --global-batch, as Megatron recipes run; otherwise "
                        "the whole batch in one, so the stages run one after another). -case 4: the last one may "
                        "be smaller; --dp/--tp/--pp: must divide the batch")
    add_global_batch_flag(g)
    g.add_argument("--bucket-mb", type=float, default=25.0, help="DDP gradient bucket size in MB (25)")
    g.add_argument("--schedule", default="auto",
                   help="pipeline schedule: auto (1f1b over several micro-batches, as Megatron; gpipe under "
                        "--reference-compat), gpipe, 1f1b or interleaved")
    g.add_argument("--virtual-stages", type=int, default=1,
                   help="interleaved schedule: pipeline stages per GPU (V >= 2; needs --schedule interleaved)")
    g.add_argument("--partition", default="auto",
                   help="pipeline stage cuts: auto (layers for a --model run whose layers split equally over "
                        "the stages, else optimal), layers (Megatron-LM's: equal transformer layers per stage, "
                        "the embedding on the first, the head and loss on the last), optimal (searched, then "
                        "re-timed), time (balanced) or count (equal ops)")
    add_layout_flags(g)
    g.add_argument("--initial-placement", default="gpu",
                   help="where parameters/optimizer state/inputs start: gpu (if they fit) or remote")
    g.add_argument("--collective-detail", default="auto", help="collectives: auto, expanded or macro")
    g.add_argument("--reference-compat", action="store_true",
                   help="reproduce the original TrioSim's conventions (see docs/reference-compat.md)")
    add_parallel_flags(g)
    add_gpu_flags(p)
    add_precision_flags(p)


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
            raise ConfigError(f"--{self.name}: {_short_repr(raw)} is not a boolean (true/false)")
        if isinstance(raw, bool) or isinstance(raw, (list, dict)):
            raise ConfigError(f"--{self.name}: {_short_repr(raw)} is not a valid value")
        value: Any = raw.strip() if isinstance(raw, str) else raw
        if self.type is int and isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"--{self.name}: {_short_repr(raw)} is not an integer")
        if self.type is not None:
            try:
                value = self.type(int(value) if self.type is int and isinstance(value, float) else value)
            except OverflowError:
                # float() of a YAML integer of hundreds of digits; int() of an infinite float
                raise ConfigError(f"--{self.name}: {_short_repr(raw)} is out of range (a number holds at most about 1.8e308)") from None
            except (TypeError, ValueError):
                kind = {int: "an integer", float: "a number"}.get(self.type, "a valid value")
                raise ConfigError(f"--{self.name}: {_short_repr(raw)} is not {kind}") from None
        elif not isinstance(value, str):
            value = str(value)
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"--{self.name}: {_short_repr(raw)} is not one of {', '.join(map(str, self.choices))}"
            )
        return value


def _short_repr(value: Any) -> str:
    """``repr(value)`` cut to 60 characters: an error line quotes a value, never a page of it."""
    text = repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and len(text) > 24:
        return f"an integer of {len(text.lstrip('-'))} digits"
    return text if len(text) <= 60 else text[:57] + "..."


# `run`'s options that are no simulation flag (what to print, where to write, how to read the
# command line): a --config or --grid file cannot set them.
COMMAND_LINE_ONLY = frozenset({"megatron-args", "config", "json", "timeline", "timeline-gpus",
                               "timeline-micro-batches", "quiet"})


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
        raise ConfigError(f"unknown flag {_short_repr(name)} in {where}{self.suggest(name)}")

    def suggest(self, name: str) -> str:
        """``; did you mean 'ptp_bandwidth'?`` (the closest key, spelt as the user spells keys),
        or a pointer to the list of flags when nothing is close."""
        import difflib

        key = flag_key(name)
        if key in COMMAND_LINE_ONLY:  # listed by `run --help`, so do not send the user there
            return f" (--{key} is a command-line option, not a simulation flag a settings file can set)"
        spellings: dict[str, str] = {}
        for spec in self.specs:
            for option in (spec.dest, *spec.options):
                spellings.setdefault(flag_key(option), spec.name)
        close = difflib.get_close_matches(key, list(spellings), n=1, cutoff=0.75)
        if not close:
            return " (the keys are the flags of 'triosim run --help', without the dashes)"
        spec_name = spellings[close[0]]
        if "_" in name and "-" not in name:  # answer in the user's spelling: ptp_bandwith -> ptp_bandwidth
            spec_name = spec_name.replace("-", "_")
        return f"; did you mean {spec_name!r}?"

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
