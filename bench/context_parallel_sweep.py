"""Context parallelism on Llama 3 70B, 64 H100s: sequence length 8k → 128k at a fixed million
tokens per iteration, CP 1/2/4/8 (tp 8, dp = 64 / (8 · cp), ZeRO-1, sequence parallel).

    python bench/context_parallel_sweep.py                   # the table (about 90 s on 2 cores)
    python bench/context_parallel_sweep.py --plot cp.png     # and time and memory against the sequence
    python bench/context_parallel_sweep.py --seq 8192,131072 --cp 1,8

Each row is one ``triosim run --model llama3-70b --gpu h100-sxm --topology-file
topologies/dgx-h100-superpod.yaml -GPUnumber 64 --tp 8 --cp C --zero 1 --sequence-parallel
--seq-len S --global-batch 2^20/S``: the iteration, tokens/s per GPU, the peak memory per GPU and
whether it fits in 80 GB, the exchange's exposed time (``exposed CP``) and the wall time of the
run (the simulation's own cost).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from triosim.compute.op_time_source import lookup_gpu
from triosim.config import configure
from triosim.simulation import simulate

TOKENS = 1 << 20
TOPOLOGY = Path(__file__).resolve().parents[1] / "topologies" / "dgx-h100-superpod.yaml"


def one(seq: int, cp: int) -> dict:
    start = time.perf_counter()
    trace, platform, strategy = configure({
        "model": "llama3-70b", "gpu": "h100-sxm", "topology-file": str(TOPOLOGY), "gpus": 64, "tp": 8, "cp": cp,
        "zero": 1, "sequence-parallel": True, "seq-len": seq, "global-batch": TOKENS // seq})
    result = simulate(trace, platform, strategy)
    mean = result.time_breakdown()["mean"]
    peak = max(m["peak_bytes"] for m in result.graph.meta["hybrid"]["memory"])
    return {"seq": seq, "cp": cp, "dp": strategy.dp, "iteration_s": result.makespan_s,
            "tokens_per_s_per_gpu": TOKENS / result.makespan_s / platform.num_gpus, "peak_gb": peak / 1e9,
            "fits": peak <= lookup_gpu("h100-sxm", "--gpu").memory_bytes, "exposed_cp_ms": mean["exposed_cp_ms"],
            "wall_s": time.perf_counter() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", default="8192,16384,32768,65536,131072")
    ap.add_argument("--cp", default="1,2,4,8")
    ap.add_argument("--plot", metavar="FILE.png", help="iteration time and peak memory against the sequence")
    args = ap.parse_args()
    rows = []
    print("| sequence | cp | dp | iteration (s) | tokens/s/GPU | peak GB | fits | exposed CP (ms) | run (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seq in map(int, args.seq.split(",")):
        for cp in map(int, args.cp.split(",")):
            r = one(seq, cp)
            rows.append(r)
            print(f"| {seq:,} | {cp} | {r['dp']} | {r['iteration_s']:.3f} | {r['tokens_per_s_per_gpu']:,.0f} | "
                  f"{r['peak_gb']:.1f} | {'yes' if r['fits'] else 'no'} | {r['exposed_cp_ms']:.1f} | "
                  f"{r['wall_s']:.1f} |", flush=True)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for cp in sorted({r["cp"] for r in rows}):
            mine = [r for r in rows if r["cp"] == cp]
            left.plot([r["seq"] for r in mine], [r["iteration_s"] for r in mine], marker="o", label=f"cp {cp}")
            right.plot([r["seq"] for r in mine], [r["peak_gb"] for r in mine], marker="o", label=f"cp {cp}")
        for ax, label in ((left, "iteration (s), 2^20 tokens"), (right, "peak memory per GPU (GB)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length")
            ax.set_ylabel(label)
            ax.legend()
        right.axhline(80, color="grey", linestyle="--", linewidth=1)
        fig.suptitle("Llama 3 70B, 64 H100 (tp 8, dp 64/(8·cp), ZeRO-1, SP)")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
