"""Side by side with llm-analysis (analytical, PyPI) on one GPT configuration: iteration time
and memory per GPU.

    python bench/llm_analysis_compare.py

The model is GPT-Neo-1.3B's shape (24 layers, d_model 2048, 16 heads, FFN 8192, vocab 50,257,
sequence 2048), on 16 H100-SXM-80GB-class GPUs: dp 2 × tp 4 × pp 2, ZeRO-1, micro-batch 1,
8 micro-batches per replica (global batch 16), 1F1B, Megatron TP inside an 8-GPU NVSwitch node.

triosim's side needs a trace. There is no H100 trace of a GPT here, so the bench builds one:
``triosim.trace.synthetic_transformer`` writes two decoder layers of that shape, ``--num-layers 24``
repeats them, and every op gets a roofline time on the H100 numbers llm-analysis uses (989 TFLOPS
bf16 peak at the same 50 % FLOPS efficiency, 3,350 GB/s HBM at the same 80 % efficiency): linears
2·M·N·K FLOPs forward and twice that backward, attention 4·b·s²·h forward and twice that
backward, every other op the bytes it reads and writes. Activations are re-sized to bf16;
weights, gradients and Adam's two states stay fp32 (16 B per parameter, as mixed precision's
2 + 2 + 12, split differently). So the compute of both
sides comes from the same roofline, and the comparison is about what each adds: pipeline bubble,
exposed TP/DP communication, and the memory accounting.

llm-analysis is run when it is importable (``pip install llm-analysis`` into a virtual
environment; it is not a dependency of triosim). Otherwise its numbers from the last run, recorded
below, are printed and marked as recorded.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import replace
from pathlib import Path

from triosim import simulate
from triosim.config import configure
from triosim.trace import Trace
from triosim.trace.repeat import load_repeated
from triosim.trace.synthetic_transformer import (
    SyntheticTransformer,
    write_synthetic_transformer,
)

LAYERS, HIDDEN, HEADS, FFN, VOCAB, SEQ = 24, 2048, 16, 8192, 50257, 2048
DP, TP, PP, ZERO, MICRO, ACCUM = 2, 4, 2, 1, 1, 8
PEAK_FLOPS, FLOPS_EFF = 989e12, 0.5
HBM_BYTES_S, HBM_EFF = 3350e9, 0.8
GIB = 2**30

# llm-analysis 0.2.2, train(model_name="EleutherAI_gpt-neo-1.3B", gpu_name="h100-sxm-80gb",
# dtype_name="w16a16e16", batch_size_per_gpu=1, gradient_accumulation_steps=8, seq_len=2048,
# ds_zero=1, dp_size=2, tp_size=4, pp_size=2, total_num_gpus=16, flops_efficiency=0.5,
# hbm_memory_efficiency=0.8): the keys printed below, as it returned them.
RECORDED = {
    "latency_per_iter": 0.037577486257310416,
    "latency_per_micro_batch": 0.004697185782163802,
    "latency_fwd": 0.0024857197157125595,
    "latency_fwd_tp_comm": 0.00067108864,
    "weight_memory_per_gpu": 353478656.0,
    "gradient_memory_per_gpu": 706957312.0,
    "optimizer_state_memory_per_gpu": 1060435968.0,
    "activation_memory_per_gpu": 1144686592.0,
    "(weight+op_state+grad+act)_memory_per_gpu": 3265558528.0,
    "num_params_total": 1310986240.0,
}


def llm_analysis_numbers() -> tuple[dict, str]:
    """llm-analysis's summary for the configuration, and where it came from."""
    try:
        from llm_analysis.analysis import train
    except ImportError:
        return RECORDED, "recorded (llm-analysis 0.2.2 not installed now)"
    summary = train(model_name="EleutherAI_gpt-neo-1.3B", gpu_name="h100-sxm-80gb", dtype_name="w16a16e16",
                    log_level="ERROR", batch_size_per_gpu=MICRO, gradient_accumulation_steps=ACCUM, seq_len=SEQ,
                    ds_zero=ZERO, dp_size=DP, tp_size=TP, pp_size=PP, total_num_gpus=DP * TP * PP,
                    flops_efficiency=FLOPS_EFF, hbm_memory_efficiency=HBM_EFF)
    return {k: summary[k] for k in RECORDED}, "run now"


# ----------------------------------------------------------------------------- triosim's trace


def _numel(trace: Trace, k: str) -> int:
    return trace.tensors[k].numel


def roofline_seconds(trace: Trace, i: int) -> float:
    """H100 roofline time of op ``i`` at the trace's batch (see the module docstring)."""
    op = trace.ops[i]
    name = op.name.lower()
    params = set(trace.parameters)
    tokens = trace.batch_size * SEQ
    flops = 0.0
    matrices = [k for k in trace.reads[i] if k in params and len(trace.tensors[k].shape or ()) == 2]
    if op.stage != "optimizer" and matrices and "embedding" not in name:
        n, k = trace.tensors[matrices[0]].shape
        flops = 2.0 * tokens * n * k * (2 if op.stage == "backward" else 1)
    elif "scaled_dot_product_attention" in name:
        flops = 4.0 * trace.batch_size * SEQ * SEQ * HIDDEN * (2 if op.stage == "backward" else 1)
    moved = sum(trace.tensors[k].bytes for k in (*trace.reads[i], *trace.writes[i]))
    return max(flops / (PEAK_FLOPS * FLOPS_EFF), moved / (HBM_BYTES_S * HBM_EFF))


def bf16_activations(trace: Trace) -> Trace:
    """Activations (every batch-sized float tensor) in bf16. Weights, gradients and Adam's two
    states stay fp32: 4 + 4 + 8 = 16 B per parameter, the same total as mixed precision's
    2 + 2 + 12 (triosim matches optimizer state to parameters by size, so the split stays fp32)."""
    tensors = {}
    for k, t in trace.tensors.items():
        if k not in trace.batch_invariant and t.each_byte == 4:
            t = t._replace(each_byte=2, bytes=t.numel * 2)
        tensors[k] = t
    return replace(trace, tensors=tensors)


def gpt_trace(tmp: Path) -> Trace:
    path = write_synthetic_transformer(tmp / "gpt", SyntheticTransformer(
        layers=2, batch_size=MICRO * ACCUM, seq_len=SEQ, hidden=HIDDEN, heads=HEADS, ffn_mult=FFN // HIDDEN,
        vocab=VOCAB, foreach_optimizer=False))  # one update per parameter: its state lives on its stage
    trace = bf16_activations(load_repeated(path, LAYERS, batch_size=MICRO * ACCUM))
    ops = [op._replace(duration_s=roofline_seconds(trace, op.index)) for op in trace.ops]
    return replace(trace, ops=ops, op_time=None)


FLAGS = dict(dp=DP, tp=TP, pp=PP, zero=str(ZERO), micro_batch_size=MICRO, schedule="1f1b", tp_style="megatron",
             topology="nvlink-cluster", gpus_per_node=8, ptp_bandwidth=450.0, node_bandwidth=50.0,
             capacity=math.log2(80e9))


def triosim_numbers(tmp: Path) -> dict:
    trace = gpt_trace(tmp)
    _, platform, strategy = configure(trace_dir=str(tmp / "gpt"), **FLAGS)
    res = simulate(trace, platform, strategy)
    # the same with links at 10^6 GB/s and no latency: compute, imbalance and pipeline bubble only
    _, fast, _ = configure(trace_dir=str(tmp / "gpt"), **{**FLAGS, "ptp_bandwidth": 1e6, "node_bandwidth": 1e6,
                                                            "link_latency_us": 0.0, "collective_latency_us": 0.0})
    no_comm = simulate(trace, fast, strategy)
    h = res.graph.meta["hybrid"]
    mem = max(h["memory"], key=lambda m: m["peak_bytes"])
    gpus = res.per_gpu
    return {"iteration_s": res.makespan_s, "no_comm_s": no_comm.makespan_s,
            "compute_s": max(g.compute_ms for g in gpus) / 1e3,
            "mean_compute_s": sum(g.compute_ms for g in gpus) / len(gpus) / 1e3,
            "exposed_comm_s": max(g.exposed_comm_ms for g in gpus) / 1e3,
            "params": sum(trace.tensors[p].numel for p in trace.parameters), "memory": mem, "stages": h["memory"],
            "collectives": h["collectives_dp0_tp0"]}


def main() -> None:
    print(f"GPT-Neo-1.3B shape ({LAYERS} layers, d_model {HIDDEN}, {HEADS} heads, vocab {VOCAB}, seq {SEQ}); "
          f"dp {DP} x tp {TP} x pp {PP}, ZeRO-{ZERO}, micro-batch {MICRO} x {ACCUM}, 1F1B, H100-class\n")
    la, source = llm_analysis_numbers()
    with tempfile.TemporaryDirectory() as tmp:
        ts = triosim_numbers(Path(tmp))
    m = ts["memory"]
    rows = [
        ("parameters", f"{ts['params'] / 1e9:.3f} B", f"{la['num_params_total'] / 1e9:.3f} B"),
        ("iteration time", f"{ts['iteration_s'] * 1e3:.2f} ms", f"{la['latency_per_iter'] * 1e3:.2f} ms"),
        ("iteration, links at 10⁶ GB/s (compute + bubble)", f"{ts['no_comm_s'] * 1e3:.2f} ms", "—"),
        ("exposed communication, most on one GPU", f"{ts['exposed_comm_s'] * 1e3:.2f} ms",
         f"not in the iteration time (TP comm of one forward: {la['latency_fwd_tp_comm'] * 1e3:.2f} ms)"),
        ("compute per GPU: mean / busiest", f"{ts['mean_compute_s'] * 1e3:.2f} / {ts['compute_s'] * 1e3:.2f} ms",
         f"{la['latency_per_micro_batch'] * ACCUM * 1e3:.2f} ms (FLOPs / (GPUs × achieved FLOPS), × {ACCUM})"),
        ("weights per GPU", f"{m['weights_bytes'] / GIB:.3f} GiB", f"{la['weight_memory_per_gpu'] / GIB:.3f} GiB"),
        ("gradients per GPU", f"{m['gradients_bytes'] / GIB:.3f} GiB", f"{la['gradient_memory_per_gpu'] / GIB:.3f} GiB"),
        ("optimizer state per GPU", f"{m['optimizer_bytes'] / GIB:.3f} GiB",
         f"{la['optimizer_state_memory_per_gpu'] / GIB:.3f} GiB"),
        ("activations per GPU", f"{m['activations_peak_bytes'] / GIB:.3f} GiB (rest of peak)",
         f"{la['activation_memory_per_gpu'] / GIB:.3f} GiB"),
        ("peak per GPU", f"{m['peak_bytes'] / GIB:.3f} GiB (stage {m['stage']})",
         f"{la['(weight+op_state+grad+act)_memory_per_gpu'] / GIB:.3f} GiB"),
    ]
    print(f"| | triosim | llm-analysis ({source}) |\n|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a} | {b} |")
    print("\ntriosim per stage (GiB): " + "; ".join(
        f"stage {s['stage']}: weights {s['weights_bytes'] / GIB:.3f}, grads {s['gradients_bytes'] / GIB:.3f}, "
        f"optimizer {s['optimizer_bytes'] / GIB:.3f}, rest {s['activations_peak_bytes'] / GIB:.3f}, "
        f"peak {s['peak_bytes'] / GIB:.3f}" for s in ts["stages"]))
    print("triosim collectives of one pipeline (dp 0, tp 0; both stages' groups summed): " + "; ".join(
        f"{k}: {v['collectives']} calls, {v['wire_bytes_per_gpu'] / GIB:.3f} GiB sent per member GPU"
        for k, v in ts["collectives"].items()))


if __name__ == "__main__":
    main()
