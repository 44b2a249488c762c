"""Mixture-of-experts training against NVIDIA Megatron-Bridge's published performance summary
(25.11 container; tokens/s/GPU; the MoE benchmarks there are force-balanced and dropless, so
``--moe-imbalance 1``). Published numbers are expectations here, never inputs.

    python bench/moe_validation.py                 # the five rows (about a minute on 2 cores)
    python bench/moe_validation.py --rows 1,4      # some of them

Each row is typed as published (system, model, precision, GPUs, global and micro batch, sequence,
TP/PP/VP/EP) with the recipe settings docs/validation.md ("The published MoE rows") cites from
Megatron-Bridge's recipes, where triosim has the flag: the distributed optimizer with both
overlaps (``--zero 1 --overlap-grad-reduce --overlap-param-gather``), bf16 gradient reduction
(every model's common settings), the alltoall dispatcher, Megatron-Core's rank order
tp-cp-ep-dp-pp (``--rank-order tp,dp,pp``: an expert group of 8 inside a node), sequence
parallelism with TP > 1; GPT-OSS: the recomputation of ``layernorm`` and ``moe_act`` (on H100
the summary's MBS 4, as published, though its GA 2 contradicts it: 64 GPUs at PP 4 and MBS 4
make GA 8, and the recipe's base configuration runs MBS 1); Qwen3: ``moe_a2a_overlap`` (``--moe-a2a-overlap
--delay-wgrad-compute``); Qwen3 235B:
the embedding and the loss counted as pipeline layers; DeepSeek-V3: its MTP layer, the
recomputation of ``mla_up_proj``, the shared expert overlapped with the dispatch and the
recipe's pipeline layout as the recipe types it (the 3 dense layers on the first stage with the
embedding, the MTP layer on the last with the loss), the precision-aware optimizer with bf16
Adam moments.
Not typed, for want of the flag or the model: DeepSeek-V3's FP8 parameter gather (not
modelled with MXFP8), the router's grouped top-k, CUDA graphs.

Iteration time = GBS · seq / (tokens/s/GPU · GPUs). Columns: the simulated time, its error
against the published one, the peak memory per GPU (fits: under the GPU's memory), and where a
mean GPU's time goes: attention, expert (grouped) GEMMs, other GEMMs, router and permutation,
the other compute, exposed dispatch/combine all-to-all (EP), exposed DP and PP communication,
and the pipeline bubble (idle).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from triosim.compute.op_kinds import base_name, classify
from triosim.compute.op_time_source import lookup_gpu
from triosim.config import configure
from triosim.graph.recompute import recompute
from triosim.simulation import simulate

TOPOLOGIES = Path(__file__).resolve().parents[1] / "topologies"
# system, model, precision, GPUs, GBS, MBS, seq, TP, PP, VP, EP, published tokens/s/GPU (the
# Megatron-Bridge 25.11 performance summary, as the table gives it)
ROWS = [
    ("DGX-H100", "gpt-oss-120b", "bf16", 64, 512, 4, 4096, 1, 4, 1, 8, 5630),
    ("DGX-H100", "qwen3-30b-a3b", "fp8-cs", 16, 512, 2, 4096, 1, 2, 24, 8, 5275),
    ("DGX-H100", "qwen3-235b-a22b", "fp8-cs", 256, 2048, 1, 4096, 2, 8, 4, 32, 1575),
    ("DGX-B200", "gpt-oss-120b", "bf16", 64, 512, 4, 4096, 1, 1, 1, 8, 8213),
    ("DGX-B200", "deepseek-v3", "mxfp8", 256, 2048, 1, 4096, 1, 16, 1, 8, 2139),
]
SYSTEMS = {"DGX-H100": ("h100-sxm", "dgx-h100-superpod.yaml"), "DGX-B200": ("b200", "dgx-b200-superpod.yaml")}
PRECISIONS = {"bf16": {"dtype": "bf16"}, "fp8-cs": {"dtype": "fp8", "fp8-recipe": "current"},
              "mxfp8": {"dtype": "fp8", "fp8-recipe": "mxfp8"}}
ROUTING = ("linear", "_softmax", "sigmoid", "topk", "moe::permute", "moe::unpermute", "TopkBackward0",
           "MoePermuteBackward0", "MoeUnpermuteBackward0", "SoftmaxBackward0", "SigmoidBackward0")


# Per model, the recipe settings beyond the mesh that triosim has flags for (docs/validation.md).
# Every model's common settings reduce gradients in bf16 (``grad_reduce_in_fp32 = False``:
# gpt_oss_llm_pretrain.py:33-34, qwen3_llm_pretrain.py:44-45, deepseek_llm_pretrain.py:40-41).
EXTRA = {
    "gpt-oss-120b": {"recompute": "selective", "recompute-modules": "layernorm,moe_act"},
    # moe_a2a_overlap sets overlap_moe_expert_parallel_comm and delay_wgrad_compute (helpers.py:183-187)
    "qwen3-30b-a3b": {"moe-a2a-overlap": True, "delay-wgrad-compute": True},
    "qwen3-235b-a22b": {"account-for-embedding-in-pipeline-split": True, "account-for-loss-in-pipeline-split": True,
                        "moe-a2a-overlap": True, "delay-wgrad-compute": True},
    # DeepSeek-V3's layout for PP 16 as the recipe types it (deepseek_v3.py:235-249: E + 4 layers,
    # 14 stages of 4, then one layer + MTP + loss; the 4 of the first stage are the 3 dense layers
    # and the first MoE layer)
    # the precision-aware optimizer with bf16 moments (deepseek_v3.py:272-276)
    "deepseek-v3": {"moe-shared-expert-overlap": True, "recompute": "selective", "recompute-modules": "mla_up_proj",
                    "use-precision-aware-optimizer": True, "exp-avg-dtype": "bf16", "exp-avg-sq-dtype": "bf16",
                    "pipeline-model-parallel-layout": "Et*4|(t*4|)*14,tmL"},
}


def flags(row: tuple) -> dict:
    system, model, precision, gpus, gbs, mbs, seq, tp, pp, vp, ep, _ = row
    gpu, topology = SYSTEMS[system]
    out = {"model": model, "gpu": gpu, "topology-file": str(TOPOLOGIES / topology), "dp": gpus // (tp * pp),
           "tp": tp, "pp": pp, "ep": ep, "global-batch": gbs, "micro-batch-size": mbs, "seq-len": seq,
           "zero": 1, "overlap-grad-reduce": True, "overlap-param-gather": True, "rank-order": "tp,dp,pp",
           "grad-reduce-dtype": "bf16", **PRECISIONS[precision], **EXTRA.get(model, {})}
    if tp > 1:
        out["sequence-parallel"] = True
    if vp > 1:
        out.update({"schedule": "interleaved", "virtual-stages": vp})
    return out


def _category(trace, i: int, experts: set[int]) -> str:
    """What op ``i`` is for the breakdown."""
    name = base_name(trace.ops[i].name)
    kind = classify(trace.ops[i].name, trace.ops[i].stage)[1]
    if name in ("_grouped_mm", "GroupedMmBackward0"):
        return "expert_gemm"
    if kind == "attention":
        return "attention"
    if i in experts or name in ROUTING[1:]:
        return "router_permute"
    return "other_gemm" if kind == "matmul" else "other"


def breakdown(trace, result) -> dict[str, float]:
    """Mean seconds per built GPU of each compute category (a fused task split by its ops' times)."""
    graph = result.graph
    # the router: a linear whose output goes to the score op (softmax/sigmoid over the experts)
    router = set()
    for i, op in enumerate(trace.ops):
        if base_name(op.name) in ("_softmax", "sigmoid"):
            router.update(j for j in range(max(0, i - 2), i) if base_name(trace.ops[j].name) == "linear")
    routed = {i for i in router} | {i for i, op in enumerate(trace.ops) if base_name(op.name) in ROUTING[1:]}
    out: dict[str, float] = {}
    gpus = set()
    for t, kind in enumerate(graph.kind):
        if kind != "compute":
            continue
        attrs = graph.attrs[t] or {}
        ops = [o for o in (attrs.get("ops") or (attrs.get("op"),)) if isinstance(o, int)]
        if not ops:
            continue
        gpus.update(graph.devices[t])
        weights = [max(trace.ops[o].duration_s, 1e-12) for o in ops]
        total = sum(weights)
        for o, w in zip(ops, weights):
            cat = _category(trace, o, routed)
            out[cat] = out.get(cat, 0.0) + graph.duration[t] * w / total
    return {k: v / max(1, len(gpus)) for k, v in out.items()}


def one(row: tuple) -> dict:
    start = time.perf_counter()
    trace, platform, strategy = configure(flags(row))
    result = simulate(trace, platform, strategy)
    system, model, precision, gpus, gbs, mbs, seq, *_, published = row
    published_s = gbs * seq / (published * gpus)
    mean = result.time_breakdown()["mean"]
    peak = max(m["peak_bytes"] for m in result.graph.meta["hybrid"]["memory"])
    # the ops the tasks name are those of the trace after recomputation's rewrite (selective modules
    # re-run single ops, so the rewrite needs no pipeline cuts)
    rec = recompute(trace, strategy.recompute_spec)
    parts = breakdown(rec.trace if rec is not None else trace, result)
    return {"row": row, "time_s": result.makespan_s, "published_s": published_s,
            "error": result.makespan_s / published_s - 1, "peak_gb": peak / 1e9,
            "fits": peak <= lookup_gpu(SYSTEMS[system][0], "--gpu").memory_bytes,
            "parts_s": parts, "exposed_ep_s": mean["exposed_ep_ms"] / 1e3, "exposed_dp_s": mean["exposed_dp_ms"] / 1e3,
            "exposed_pp_s": mean["exposed_pp_ms"] / 1e3, "idle_s": mean["idle_ms"] / 1e3,
            "wall_s": time.perf_counter() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,3,4,5", help="which rows (1-based)")
    args = ap.parse_args()
    print("| system | model | prec | GPUs | time (s) | published (s) | error | peak GB | fits | attention | expert "
          "GEMMs | other GEMMs | router/permute | other | exposed EP | exposed DP | exposed PP | bubble | run (s) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in map(int, args.rows.split(",")):
        r = one(ROWS[k - 1])
        row, p = r["row"], r["parts_s"]
        print(f"| {row[0]} | {row[1]} | {row[2]} | {row[3]} | {r['time_s']:.3f} | {r['published_s']:.3f} | "
              f"{r['error']:+.1%} | {r['peak_gb']:.1f} | {'yes' if r['fits'] else 'no'} | "
              f"{p.get('attention', 0):.3f} | {p.get('expert_gemm', 0):.3f} | {p.get('other_gemm', 0):.3f} | "
              f"{p.get('router_permute', 0):.3f} | {p.get('other', 0):.3f} | {r['exposed_ep_s']:.3f} | "
              f"{r['exposed_dp_s']:.3f} | {r['exposed_pp_s']:.3f} | {r['idle_s']:.3f} | {r['wall_s']:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
