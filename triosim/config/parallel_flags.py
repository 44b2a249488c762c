"""The flags of a hybrid run (``--dp --tp --pp --cp --cp-comm-type --zero --sequence-parallel
--recompute --tp-style --rank-order --exact``): their argparse definitions and what they become
in a Strategy."""

from __future__ import annotations

import argparse
import math

from ..errors import ConfigError
from ..graph.strategy import CP_COMM_TYPES, RECOMPUTE_MODES, parse_rank_order, parse_zero

DEFAULT_GPUS = 8
DEGREES = ("dp", "tp", "pp", "cp")  # the flags that make a run hybrid, and multiply to its GPUs


def add_parallel_flags(g: argparse._ArgumentGroup) -> None:
    """Add the hybrid flags to the ``strategy`` flag group."""
    g.add_argument("--dp", type=int, default=None, help="data-parallel degree (hybrid run; missing degrees are 1)")
    g.add_argument("--tp", type=int, default=None, help="tensor-parallel degree")
    g.add_argument("--pp", type=int, default=None, help="pipeline-parallel degree (stages)")
    g.add_argument("--cp", type=int, default=None,
                   help="context-parallel degree (Megatron's --context-parallel-size): each sequence split over N "
                        "GPUs in 2N chunks (causal load balancing), keys and values exchanged in attention; the "
                        "N GPUs join data parallelism in the gradient reduction (dp x cp) and ZeRO sharding")
    g.add_argument("--cp-comm-type", default="p2p", choices=CP_COMM_TYPES,
                   help="how context-parallel attention exchanges keys and values: p2p (ring attention, overlapped "
                        "with the partial attentions; default), a2a (all-to-all of q/k/v and the output, heads "
                        "split; DeepSpeed Ulysses), allgather (keys and values gathered before attention); "
                        "a2a+p2p is not modelled")
    g.add_argument("--zero", default="0", help="ZeRO stage over the DP group: 0, 1, 2, 3 or fsdp (= 3); "
                   "nothing to shard with --dp 1")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="megatron TP: split the replicated ops too (reduce-scatter + all-gather per block); "
                        "nothing to split with --tp 1")
    g.add_argument("--recompute", default="none", choices=RECOMPUTE_MODES,
                   help="activation recomputation (hybrid runs): none, selective (re-run the attention core "
                        "before its backward) or full (re-run each layer's forward, keep only layer inputs)")
    g.add_argument("--tp-style", default=None,
                   help="tensor parallel: megatron (default for --tp) or per-op (case 3's scheme)")
    g.add_argument("--rank-order", default="tp,pp,dp",
                   help="how ranks map to GPUs, innermost first (tp,pp,dp: a TP group inside a node)")
    g.add_argument("--exact", action="store_true",
                   help="build every GPU instead of one representative per role (default: only while the "
                        "graph stays small)")
    g.add_argument("--representatives", action="store_true",
                   help="build one representative per role however small the mesh (collectives in closed form)")


def degrees_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) is not None for k in DEGREES)


def resolve_gpus(args: argparse.Namespace) -> int:
    """-GPUnumber as given, else dp × tp × pp × cp for a hybrid run, else 8."""
    gpus = getattr(args, "gpus", None)
    if degrees_given(args):
        for flag in DEGREES:
            value = getattr(args, flag, None)
            if value is not None and value < 1:
                raise ConfigError(f"--{flag} must be a positive integer, got {value}")
        product = math.prod(getattr(args, k, None) or 1 for k in DEGREES)
        if gpus is None:
            return product
        if gpus != product:
            cp = getattr(args, "cp", None) or 1
            with_cp = f" × --cp {cp}" if cp > 1 else ""
            raise ConfigError(
                f"--dp {args.dp or 1} × --tp {args.tp or 1} × --pp {args.pp or 1}{with_cp} = {product} GPUs, but "
                f"-GPUnumber is {gpus}: make them agree or leave -GPUnumber out"
            )
    return DEFAULT_GPUS if gpus is None else gpus


def parallel_options(args: argparse.Namespace) -> dict:
    """Strategy keyword arguments of the hybrid flags."""
    if not degrees_given(args):
        for flag, bad in (("--zero", str(getattr(args, "zero", "0")).strip() not in ("0", "")),
                          ("--sequence-parallel", getattr(args, "sequence_parallel", False)),
                          ("--recompute", str(getattr(args, "recompute", "none")) != "none")):
            if bad:
                raise ConfigError(f"{flag} needs the degrees of a hybrid run: give --dp/--tp/--pp (not -case)")
    return {
        "dp": getattr(args, "dp", None),
        "tp": getattr(args, "tp", None),
        "pp": getattr(args, "pp", None),
        "zero": parse_zero(getattr(args, "zero", "0")),
        "sequence_parallel": bool(getattr(args, "sequence_parallel", False)),
        "tp_style": getattr(args, "tp_style", None),
        "rank_order": parse_rank_order(getattr(args, "rank_order", "tp,pp,dp")),
        "exact": _exact(args),
        "recompute": str(getattr(args, "recompute", "none")),
        "cp": getattr(args, "cp", None),
        "cp_comm_type": str(getattr(args, "cp_comm_type", "p2p")),
    }


def _exact(args: argparse.Namespace) -> bool | None:
    exact, reps = bool(getattr(args, "exact", False)), bool(getattr(args, "representatives", False))
    if exact and reps:
        raise ConfigError("--exact and --representatives exclude each other")
    return True if exact else False if reps else None
