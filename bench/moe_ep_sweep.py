"""Expert parallelism on Qwen3 235B-A22B, 256 H100s: --ep 1 → 32 on the mesh of Megatron-Bridge's
published row (tp 2, pp 8 interleaved over 4 virtual stages, dp 16, FP8 current scaling, global
batch 2,048 of 4,096 tokens, micro-batch 1, the distributed optimizer with both overlaps, bf16
gradient reduction, sequence parallel, the embedding and loss counted as pipeline layers,
Megatron-Core's rank order tp-cp-ep-dp-pp, the all-to-all overlap (``--moe-a2a-overlap
--delay-wgrad-compute``, from --ep 2: it needs expert parallelism): the row's settings in bench/moe_validation.py).

    python bench/moe_ep_sweep.py                     # the table (about 2 minutes on 2 cores)
    python bench/moe_ep_sweep.py --plot ep.png       # and time and memory against ep
    python bench/moe_ep_sweep.py --ep 8,32

Each row is one ``triosim run --model qwen3-235b-a22b --gpu h100-sxm --topology-file
topologies/dgx-h100-superpod.yaml --dp 16 --tp 2 --pp 8 --schedule interleaved --virtual-stages 4
--ep E ...``: the iteration, tokens/s per GPU, the peak memory per GPU and whether it fits in
80 GB, the exposed dispatch/combine time (``exposed EP``) and expert-gradient reduction
(``exposed DP``, dense and expert groups together), and the wall time of the run.
"""

from __future__ import annotations

import argparse
import time

from moe_validation import ROWS, flags

from triosim.compute.op_time_source import lookup_gpu
from triosim.config import configure
from triosim.simulation import simulate

ROW = ROWS[2]  # Qwen3 235B-A22B on 256 H100s
GBS, SEQ, GPUS = 2048, 4096, 256


def one(ep: int) -> dict:
    start = time.perf_counter()
    row = {**flags(ROW), "ep": ep}
    if ep == 1:  # the all-to-all overlap needs expert parallelism (Megatron-Core asserts it)
        row.pop("moe-a2a-overlap")
        row.pop("delay-wgrad-compute")
    trace, platform, strategy = configure(row)
    result = simulate(trace, platform, strategy)
    mean = result.time_breakdown()["mean"]
    peak = max(m["peak_bytes"] for m in result.graph.meta["hybrid"]["memory"])
    return {"ep": ep, "iteration_s": result.makespan_s, "tokens_per_s_per_gpu": GBS * SEQ / result.makespan_s / GPUS,
            "peak_gb": peak / 1e9, "fits": peak <= lookup_gpu("h100-sxm", "--gpu").memory_bytes,
            "exposed_ep_s": mean["exposed_ep_ms"] / 1e3, "exposed_dp_s": mean["exposed_dp_ms"] / 1e3,
            "wall_s": time.perf_counter() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ep", default="1,2,4,8,16,32")
    ap.add_argument("--plot", metavar="FILE.png", help="iteration time and peak memory against ep")
    args = ap.parse_args()
    rows = []
    print("| ep | iteration (s) | tokens/s/GPU | peak GB | fits | exposed EP (s) | exposed DP (s) | run (s) |")
    print("|---:|---:|---:|---:|---|---:|---:|---:|")
    for ep in map(int, args.ep.split(",")):
        r = one(ep)
        rows.append(r)
        print(f"| {ep} | {r['iteration_s']:.3f} | {r['tokens_per_s_per_gpu']:,.0f} | {r['peak_gb']:.1f} | "
              f"{'yes' if r['fits'] else 'no'} | {r['exposed_ep_s']:.3f} | {r['exposed_dp_s']:.3f} | "
              f"{r['wall_s']:.1f} |", flush=True)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        eps = [r["ep"] for r in rows]
        left.plot(eps, [r["iteration_s"] for r in rows], marker="o", label="iteration")
        left.plot(eps, [r["exposed_ep_s"] for r in rows], marker="s", label="exposed dispatch/combine")
        left.plot(eps, [r["exposed_dp_s"] for r in rows], marker="^", label="exposed gradient reduction")
        right.plot(eps, [r["peak_gb"] for r in rows], marker="o")
        for ax, label in ((left, "seconds"), (right, "peak memory per GPU (GB)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("--ep")
            ax.set_ylabel(label)
        left.legend()
        right.axhline(80, color="grey", linestyle="--", linewidth=1)
        fig.suptitle("Qwen3 235B-A22B, 256 H100 (tp 2, pp 8 x 4 virtual, dp 16, FP8, ZeRO-1, SP)")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
