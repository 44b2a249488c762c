"""The flags of a hybrid run (``--dp --tp --pp --cp --cp-comm-type --zero --sequence-parallel
--recompute --recompute-method --recompute-num-layers --recompute-modules --tp-style --rank-order
--exact``): their argparse definitions and what they become
in a Strategy."""

from __future__ import annotations

import argparse
import math

from ..errors import ConfigError
from ..graph.recompute_spec import METHODS
from ..graph.strategy import (
    CP_COMM_TYPES,
    MOE_DISPATCHERS,
    PIPELINE_SENDS,
    RECOMPUTE_MODES,
    parse_rank_order,
    parse_zero,
)
from ..graph.tensor.userbuffers import UserbufferTable, userbuffer_table
from ..safe_yaml import load_yaml_file
from ..shipped_files import resolve_shipped
from .typed_flags import StoreTyped

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
    add_expert_flags(g)
    g.add_argument("--zero", default="0", help="ZeRO stage over the DP group: 0, 1, 2, 3 or fsdp (= 3); "
                   "nothing to shard with --dp 1 and --cp 1")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="megatron TP: split the replicated ops too (reduce-scatter + all-gather per block); "
                        "nothing to split with --tp 1")
    g.add_argument("--recompute", default="none", choices=RECOMPUTE_MODES, action=StoreTyped,
                   help="activation recomputation (hybrid runs): none, selective (re-run the attention core "
                        "before its backward) or full (re-run each layer's forward, keep only layer inputs)")
    g.add_argument("--recompute-method", default=None, choices=METHODS,
                   help="with --recompute full: uniform (every layer, one checkpoint per group of "
                        "--recompute-num-layers layers) or block (only the first --recompute-num-layers layers of "
                        "each model chunk); Megatron's names")
    g.add_argument("--recompute-num-layers", default=None, type=int, metavar="N",
                   help="layers per checkpoint group (uniform) or recomputed layers per model chunk (block; the "
                        "default method when this is given alone, with --recompute full)")
    g.add_argument("--recompute-modules", default=None, metavar="LIST",
                   help="with --recompute selective: the parts of each layer to re-run, comma-separated: core_attn "
                        "(default), mlp, layernorm, moe_act, mla_up_proj (or space-separated, as a sweep needs: "
                        "its commas separate the values it tries)")
    g.add_argument("--offload-activations", default=None, metavar="N|FRACTION",
                   help="copy the activations of the first N layers of each model chunk (or that fraction of its "
                        "layers) to host memory over the GPU's host link during forward, and back one layer ahead "
                        "in backward (Megatron-Core's CPU offloading); not with --recompute")
    g.add_argument("--tp-style", default=None,
                   help="tensor parallel: megatron (default for --tp) or per-op (case 3's scheme)")
    g.add_argument("--rank-order", default="tp,pp,dp",
                   help="how ranks map to GPUs, innermost first (tp,pp,dp: a TP group inside a node)")
    g.add_argument("--exact", action="store_true",
                   help="build every GPU instead of one representative per role (default: only while the "
                        "graph stays small)")
    g.add_argument("--representatives", action="store_true",
                   help="build one representative per role however small the mesh (collectives in closed form)")
    add_overlap_flags(g)


def add_expert_flags(g: argparse._ArgumentGroup) -> None:
    """Expert parallelism of a mixture-of-experts model (Megatron-Core's names; docs/moe.md)."""
    g.add_argument("--ep", type=int, default=None,
                   help="expert-parallel degree (Megatron's --expert-model-parallel-size): each MoE layer's experts "
                        "split over N GPUs, folded over the tp x cp x dp GPUs of a stage (no extra GPUs); tokens "
                        "dispatched to and combined from their experts' GPUs; expert gradients reduced over the "
                        "tp x cp x dp / N GPUs holding the same experts")
    g.add_argument("--etp", type=int, default=None,
                   help="expert tensor parallelism (Megatron's --expert-tensor-parallel-size): each expert's width "
                        "split over N GPUs, the tokens an expert rank received all-gathered over them and the "
                        "outputs reduce-scattered; experts / (ep x etp) a GPU (default 1)")
    g.add_argument("--moe-token-dispatcher", default="alltoall", choices=MOE_DISPATCHERS, action=StoreTyped,
                   help="how tokens reach their experts: alltoall (default), allgather (tokens gathered, outputs "
                        "reduce-scattered), flex (DeepEP: between nodes once per node, then NVLink inside it)")
    g.add_argument("--moe-shared-expert-overlap", action="store_true",
                   help="run the shared experts while the tokens are dispatched (Megatron's switch of that name); "
                        "off: the dispatch waits for them")
    g.add_argument("--moe-a2a-overlap", action="store_true",
                   help="run each all-to-all beside another micro-batch's compute: the interleaved schedule's "
                        "steady state runs one forward and one backward block together (Megatron's "
                        "--overlap-moe-expert-parallel-comm); needs --ep and, with --pp, --schedule interleaved")
    g.add_argument("--delay-wgrad-compute", action="store_true",
                   help="with --moe-a2a-overlap: the experts' weight gradients after the MLP's data gradients, "
                        "beside the backward's combine exchange (Megatron's switch of that name)")
    g.add_argument("--moe-imbalance", type=float, default=1.0, metavar="F",
                   help="the busiest expert's tokens over the mean (1: balanced, as force-balanced benchmarks run); "
                        "every expert rank waits for the busiest")


def add_overlap_flags(g: argparse._ArgumentGroup) -> None:
    """The overlap switches, named and defaulted as Megatron-Core's (off; docs/overlap.md)."""
    g.add_argument("--tp-comm-overlap", action="store_true",
                   help="with --sequence-parallel: each all-gather and reduce-scatter in chunks beside its GEMM "
                        "(Transformer Engine userbuffers); off: the GEMM waits for the whole collective")
    g.add_argument("--tp-comm-overlap-cfg", metavar="FILE.yaml",
                   help="with --tp-comm-overlap: Transformer Engine's userbuffer settings per GEMM (qkv_fprop, "
                        "proj_fprop, ... -> method, num_sm, num_splits, set_sm_margin), as Megatron-LM's flag of "
                        "that name reads them; the GEMMs it leaves out keep TE's defaults; a bare name finds a "
                        "shipped table (userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192, ...)")
    g.add_argument("--overlap-grad-reduce", action="store_true",
                   help="reduce each --bucket-mb gradient bucket as soon as backward fills it; off (Megatron's "
                        "default): every gradient after the stage's last backward op")
    g.add_argument("--overlap-param-gather", action="store_true",
                   help="--zero 1/2 with --overlap-grad-reduce: gather the updated parameters per bucket before "
                        "the forward ops that use them; off: one all-gather after the optimizer step")
    g.add_argument("--pipeline-send", default="auto", choices=PIPELINE_SENDS,
                   help="pipeline sends: blocking (a stage goes on once its send and the matching receive are "
                        "done, as Megatron's batched send/receive), overlapped, or auto (blocking under 1f1b and "
                        "gpipe, overlapped under interleaved, as Megatron-LM); Megatron's --overlap-p2p-comm is "
                        "overlapped")
    g.add_argument("--pipeline-scatter-gather", action="store_true",
                   help="without --sequence-parallel: each TP rank sends 1/tp of a pipeline tensor and the receiving "
                        "TP group all-gathers it (Megatron-LM 2021-22's default; Megatron-Core sends it whole)")


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
                          ("--tp-comm-overlap", getattr(args, "tp_comm_overlap", False)),
                          ("--overlap-grad-reduce", getattr(args, "overlap_grad_reduce", False)),
                          ("--overlap-param-gather", getattr(args, "overlap_param_gather", False)),
                          ("--pipeline-send", str(getattr(args, "pipeline_send", "auto")) != "auto"),
                          ("--pipeline-scatter-gather", getattr(args, "pipeline_scatter_gather", False)),
                          ("--sequence-parallel", getattr(args, "sequence_parallel", False)),
                          ("--recompute", str(getattr(args, "recompute", "none")) != "none"),
                          ("--recompute-modules", getattr(args, "recompute_modules", None) is not None),
                          ("--offload-activations", getattr(args, "offload_activations", None) is not None),
                          ("--ep", getattr(args, "ep", None) not in (None, 1)),
                          ("--etp", getattr(args, "etp", None) not in (None, 1)),
                          ("--moe-shared-expert-overlap", getattr(args, "moe_shared_expert_overlap", False)),
                          ("--moe-a2a-overlap", getattr(args, "moe_a2a_overlap", False)),
                          ("--delay-wgrad-compute", getattr(args, "delay_wgrad_compute", False))):
            if bad:
                raise ConfigError(f"{flag} needs the degrees of a hybrid run: give --dp/--tp/--pp (not -case)")
        case = getattr(args, "case", None)
        if getattr(args, "representatives", False) and case not in (1, 2, 3):
            # cases 1-3 build GPU 0 and mirror the others (the default); case 0 and 4 have no replicas
            raise ConfigError(f"--representatives: -case {case} has no replicas to stand for (cases 1-3 build "
                              "GPU 0 and mirror the other GPUs by default)")
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
        **recompute_options(args),
        "cp": getattr(args, "cp", None),
        "cp_comm_type": str(getattr(args, "cp_comm_type", "p2p")),
        "ep": getattr(args, "ep", None),
        "etp": getattr(args, "etp", None),
        "moe_token_dispatcher": str(getattr(args, "moe_token_dispatcher", "alltoall")),
        "moe_imbalance": _imbalance(getattr(args, "moe_imbalance", 1.0)),
        "moe_shared_expert_overlap": bool(getattr(args, "moe_shared_expert_overlap", False)),
        "moe_a2a_overlap": bool(getattr(args, "moe_a2a_overlap", False)),
        "delay_wgrad_compute": bool(getattr(args, "delay_wgrad_compute", False)),
        **overlap_options(args),
    }


def _imbalance(value) -> float:
    x = float(value)
    if not (math.isfinite(x) and 1.0 <= x <= 1e6):
        raise ConfigError(f"--moe-imbalance must be a number from 1 (balanced) to 1e6, got {value}")
    return x


def _check_granularity(args: argparse.Namespace) -> None:
    granularity = str(args.recompute)
    if granularity != "full" and (getattr(args, "recompute_method", None) is not None
                                  or getattr(args, "recompute_num_layers", None) is not None):
        raise ConfigError(f"--recompute-method/--recompute-num-layers need --recompute full (Megatron's "
                          f"--recompute-granularity full), not --recompute {granularity}")
    if granularity != "selective" and getattr(args, "recompute_modules", None) is not None:
        raise ConfigError(f"--recompute-modules needs --recompute selective (Megatron's --recompute-granularity "
                          f"selective), not --recompute {granularity}")


def recompute_options(args: argparse.Namespace) -> dict:
    """Strategy keyword arguments of recomputation's detail flags (checked by the strategy).

    A detail given with another granularity is refused here, where a given flag is told from its
    default: ``--recompute selective --recompute-num-layers 1`` or ``--recompute-method uniform``
    hold the strategy's default values, and Megatron-Core refuses both (``recompute_num_layers must
    be None`` and ``recompute method is not yet supported`` under selective)."""
    out: dict = {}
    if hasattr(args, "recompute"):  # plan's pins come without a granularity
        _check_granularity(args)
    if getattr(args, "recompute_method", None) is not None:
        out["recompute_method"] = args.recompute_method
    layers = getattr(args, "recompute_num_layers", None)
    if layers is not None:
        if layers < 1:
            raise ConfigError(f"--recompute-num-layers must be a positive integer, got {layers}")
        out["recompute_num_layers"] = layers
    offload = getattr(args, "offload_activations", None)
    if offload is not None:
        from ..graph.offload import OffloadSpec

        OffloadSpec.parse(offload)  # refuse a bad value here, one line
        out["offload_activations"] = str(offload)
    modules = getattr(args, "recompute_modules", None)
    if modules is not None:
        out["recompute_modules"] = tuple(m for m in str(modules).replace(" ", ",").split(",") if m)
    return out


def overlap_options(args: argparse.Namespace) -> dict:
    """Strategy keyword arguments of the overlap switches."""
    return {
        "tp_comm_overlap": bool(getattr(args, "tp_comm_overlap", False)),
        "tp_comm_overlap_cfg": _userbuffer_table(getattr(args, "tp_comm_overlap_cfg", None)),
        "overlap_grad_reduce": bool(getattr(args, "overlap_grad_reduce", False)),
        "overlap_param_gather": bool(getattr(args, "overlap_param_gather", False)),
        "pipeline_send": str(getattr(args, "pipeline_send", "auto")),
        "pipeline_scatter_gather": bool(getattr(args, "pipeline_scatter_gather", False)),
    }


def _userbuffer_table(path) -> UserbufferTable | None:
    """The table of ``--tp-comm-overlap-cfg`` (None without it): the file as given, or for a bare
    name a table shipped with triosim (``userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192``)."""
    if path is None:
        return None
    found = resolve_shipped(path, "triosim.userbuffers", "--tp-comm-overlap-cfg", "tables")
    return userbuffer_table(load_yaml_file(found, "--tp-comm-overlap-cfg file"), source=str(path))


def _exact(args: argparse.Namespace) -> bool | None:
    exact, reps = bool(getattr(args, "exact", False)), bool(getattr(args, "representatives", False))
    if exact and reps:
        raise ConfigError("--exact and --representatives exclude each other")
    return True if exact else False if reps else None
