"""Flags given a value that the chosen configuration does not use.

The rule: a value that is wrong on its own (``--topology torus``, ``-interconnects 2``, a mesh
whose rows x columns is not the GPU count) is an error whatever the case, exit code 2; a valid
value that the configuration simply does not use (``-GPUnumber 4`` with ``-case 0``,
``--bucket-mb`` outside DDP) is simulated without it and named in one note on stderr, so
nothing is ignored silently.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from ..errors import ConfigError
from ..hardware.platform import TOPOLOGIES
from .flags import FlagTable

# dest -> flag as documented. A value other than the flag's default counts as "given".
_PLATFORM = (
    ("gpus", "-GPUnumber"),
    ("interconnects", "-interconnects"),
    ("num_rows", "-numRows"),
    ("num_cols", "-numCols"),
    ("topology", "--topology"),
    ("ptp_bandwidth", "-ptp-bandwidth"),
    ("gpus_per_node", "--gpus-per-node"),
    ("node_bandwidth", "--node-bandwidth"),
    ("topology_file", "--topology-file"),
    ("link_efficiency", "--link-efficiency"),
)
# What a topology file's links replace (-bandwidth stays: the file may leave remote memory to it).
_FILE_REPLACES = (
    ("topology", "--topology"),
    ("ptp_bandwidth", "-ptp-bandwidth"),
    ("interconnects", "-interconnects"),
    ("num_rows", "-numRows"),
    ("num_cols", "-numCols"),
    ("link_latency_us", "--link-latency-us"),
    ("gpus_per_node", "--gpus-per-node"),
    ("node_bandwidth", "--node-bandwidth"),
)
# --reference-compat runs the original's network whatever these say; a value equal to what it
# runs is not worth a note.
_COMPAT_NETWORK = (
    ("network", "--network", "exclusive"),
    ("collective_algo", "--collective-algo", "one-way-ring"),
    ("collective_latency_us", "--collective-latency-us", 0.0),
    ("collective_protocol", "--collective-protocol", "simple"),
)
_MESH = (("num_rows", "-numRows"), ("num_cols", "-numCols"))
_CLUSTER = (("gpus_per_node", "--gpus-per-node"), ("node_bandwidth", "--node-bandwidth"))
_DDP = (("bucket_mb", "--bucket-mb"),)
_PIPELINE = (("micro_batch_size", "-micro-batch-size"), ("schedule", "--schedule"), ("partition", "--partition"))


def _given(args: argparse.Namespace, table: Iterable[tuple[str, str]], defaults: dict) -> list[str]:
    out = []
    for dest, flag in table:
        default = defaults.get(dest)
        value = getattr(args, dest, default)
        if value is not None and value != default:
            out.append(f"{flag} {value}")
    return out


def _flag_defaults() -> dict:
    # The run flags' own defaults, so the two never disagree.
    return FlagTable.from_cli().defaults()


def unused_flags(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(why unused, ["-flag value", ...]) for each group of given flags the run does not use."""
    case = getattr(args, "case", 0)
    d = _flag_defaults()
    groups: list[tuple[str, list[str]]] = []
    if any(getattr(args, k, None) is not None for k in ("dp", "tp", "pp", "cp")):
        case = None  # a hybrid --dp/--tp/--pp run: the case presets' rules do not apply
    if case == 0:
        groups.append(("-case 0 simulates one GPU", _given(args, _PLATFORM, d)))
    elif getattr(args, "topology_file", None) is not None:
        groups.append(("the --topology-file's links replace them", _given(args, _FILE_REPLACES, d)))
    elif getattr(args, "gpus", None) != 1 or case is not None:
        if getattr(args, "interconnects", 0) == 0 and getattr(args, "topology", "ring") != "mesh":
            groups.append(("only the optical mesh (-interconnects 1) has rows and columns", _given(args, _MESH, d)))
        if getattr(args, "topology", "ring") != "nvlink-cluster":
            groups.append(("only --topology nvlink-cluster has nodes", _given(args, _CLUSTER, d)))
    if getattr(args, "reference_compat", False):
        groups.append(("--reference-compat runs the original's network (exclusive links, one-way ring, no "
                       "latency, Simple protocol)",
                       [f"{flag} {getattr(args, dest)}" for dest, flag, compat in _COMPAT_NETWORK
                        if getattr(args, dest, d.get(dest)) not in (d.get(dest), compat)]))
    if case is None:  # a hybrid run: options of an axis that is 1
        groups.extend(_hybrid_unused(args))
    if case not in (2, None):
        groups.append(("buckets are DDP's (-case 2)", _given(args, _DDP, d)))
    if case not in (4, None):
        groups.append(("micro-batches are the pipeline's (-case 4)", _given(args, _PIPELINE, d)))
    if case not in (4, None) or (case is None and (getattr(args, "pp", None) or 1) == 1):
        groups.append(("the layer cuts are the pipeline's, and there is one stage", _layout_given(args)))
    return [(why, flags) for why, flags in groups if flags]


def _layout_given(args: argparse.Namespace) -> list[str]:
    """The layout flags given (graph.pipeline.layer_layout), as typed."""
    from ..graph.pipeline.layer_layout import LayerSplit

    split = LayerSplit.of(args)
    if not split.given:
        return []
    uneven = split.first_stage_layers is not None or split.last_stage_layers is not None
    if uneven or (split.layout is not None and _layout_stages(split.layout) > 1):
        return []  # refused on one stage (no first and last stage, no stages to lay out): the error says so
    return [split.flags()]


def _layout_stages(layout: str) -> int:
    from ..errors import ConfigError
    from ..graph.pipeline.layer_layout import parse_layout

    try:
        return len(parse_layout(layout))
    except ConfigError:
        return 0  # the layout's own error names it


def _hybrid_unused(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """ZeRO without a data-parallel group to shard over, sequence parallelism without tensor
    parallelism: both build nothing different (same times, same memory)."""
    from ..graph.strategy import ZERO_ALIASES

    out = []
    zero = str(getattr(args, "zero", "0")).strip()
    # ZeRO shards over the dp × cp data ranks (context ranks hold the same parameters)
    data = (getattr(args, "dp", None) or 1) * (getattr(args, "cp", None) or 1)
    if data == 1 and ZERO_ALIASES.get(zero.lower(), 0) > 0:
        out.append(("ZeRO shards over the data-parallel and context-parallel ranks, and --dp and --cp are 1",
                    [f"--zero {zero}"]))
    if (getattr(args, "cp", None) or 1) == 1 and str(getattr(args, "cp_comm_type", "p2p")) != "p2p":
        out.append(("the exchange is context parallelism's, and --cp is 1", [f"--cp-comm-type {args.cp_comm_type}"]))
    if (getattr(args, "tp", None) or 1) == 1 and getattr(args, "sequence_parallel", False):
        # --tp-comm-overlap overlaps sequence parallelism's collectives: none at tp 1 either
        flags = ["--sequence-parallel", *(["--tp-comm-overlap"] if getattr(args, "tp_comm_overlap", False) else [])]
        out.append(("sequence parallelism splits tensor-parallel blocks, and --tp is 1", flags))
    if (getattr(args, "ep", None) or 1) == 1 and (getattr(args, "etp", None) or 1) == 1:
        # every GPU holds every expert: no dispatch to choose, overlap or load unevenly
        moe = [f"--moe-token-dispatcher {args.moe_token_dispatcher}"
               if getattr(args, "moe_token_dispatcher", "alltoall") != "alltoall" else "",
               f"--moe-imbalance {args.moe_imbalance}" if getattr(args, "moe_imbalance", 1.0) != 1.0 else "",
               "--moe-shared-expert-overlap" if getattr(args, "moe_shared_expert_overlap", False) else ""]
        out.append(("only expert parallelism sends tokens to other GPUs' experts, and --ep is 1", [f for f in moe if f]))
    return out


def unused_flag_note(args: argparse.Namespace) -> str | None:
    """One line for stderr naming every given flag the run does not use, or None."""
    parts = [f"{why}: {', '.join(flags)} not used" for why, flags in unused_flags(args)]
    return "triosim: note: " + "; ".join(parts) if parts else None


def check_unused_platform_flags(args: argparse.Namespace) -> None:
    """Values of the platform flags that are wrong on their own, checked even when unused."""
    topology = getattr(args, "topology", "ring")
    if topology not in TOPOLOGIES:
        raise ConfigError(f"--topology must be one of {', '.join(TOPOLOGIES)}, got {topology!r}")
    interconnects = getattr(args, "interconnects", 0)
    if interconnects not in (0, 1):
        raise ConfigError(f"-interconnects must be 0 (electrical) or 1 (optical), got {interconnects}")
    if interconnects == 1 or topology == "mesh":
        gpus = getattr(args, "gpus", None) or 8  # -GPUnumber's default
        rows = getattr(args, "num_rows", None) or 1
        cols = getattr(args, "num_cols", None) or gpus
        if rows * cols != gpus:
            raise ConfigError(
                f"optical mesh: -numRows × -numCols = {rows} × {cols} = {rows * cols}, "
                f"which is not -GPUnumber = {gpus}"
            )
