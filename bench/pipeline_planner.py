"""Pipeline planner figures: partitions, bandwidth and micro-batch series, compat with R > 1.

    python bench/pipeline_planner.py                       # everything (a few minutes)
    python bench/pipeline_planner.py --only partitions,bandwidth

Uses the original's vgg13 and resnet50 traces in ../shared/reference (batch 128) with the
command line's defaults (op-time model ``auto``, i.e. linear-floor on these traces), unless
``--op-time-model linear``. Prints iteration times in ms.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from triosim import Strategy, build_platform, load_trace, simulate
from triosim.compute_model import attach_op_time_model

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "sample_trace" / "trace2-h100-bs128"
SECTIONS = ("partitions", "bandwidth", "microbatch", "compat")


def ms(trace, gpus: int, ptp: float = 65.0, **kw) -> float:
    compat = kw.get("reference_compat", False)
    platform = build_platform(gpus, ptp_bandwidth_gbps=ptp, reference_compat=compat)
    return simulate(trace, platform, Strategy(case=4, **kw)).makespan_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=REFERENCE)
    ap.add_argument("--op-time-model", default="auto")
    ap.add_argument("--only", default=",".join(SECTIONS))
    args = ap.parse_args()
    if not (args.reference / "vgg13" / "trace.csv").is_file():
        print(f"bench: {args.reference}: no reference traces (is ../shared present?)", file=sys.stderr)
        return 2
    only = set(args.only.split(","))
    vgg_raw = load_trace(args.reference / "vgg13")
    vgg = attach_op_time_model(vgg_raw, args.op_time_model)
    rn = attach_op_time_model(load_trace(args.reference / "resnet50"), args.op_time_model)
    t0 = time.perf_counter()
    parts = ("count", "time", "optimal")
    if "partitions" in only:
        print("vgg13, ptp 65 GB/s, 1F1B: GPUs / micro-batch | " + " | ".join(parts))
        for gpus, micro in ((4, 32), (5, 32), (8, 32), (8, 8)):
            row = [ms(vgg, gpus, micro_batch_size=micro, schedule="1f1b", partition=p) for p in parts]
            print(f"  N={gpus} mb={micro} | " + " | ".join(f"{x:.4f}" for x in row), flush=True)
    if "bandwidth" in only:
        print("resnet50, 4 GPUs, micro-batch 16: ptp GB/s | gpipe time | gpipe optimal | 1f1b time | 1f1b optimal")
        for ptp in (300, 600, 900):
            row = [ms(rn, 4, ptp, micro_batch_size=16, schedule=s, partition=p)
                   for s in ("gpipe", "1f1b") for p in ("time", "optimal")]
            print(f"  {ptp} | " + " | ".join(f"{x:.4f}" for x in row), flush=True)
    if "microbatch" in only:
        print("resnet50, 4 GPUs, GPipe, optimal partition: micro-batch | ms")
        for micro in (128, 64, 32, 16, 8, 4, 2, 1):
            print(f"  {micro} | {ms(rn, 4, micro_batch_size=micro):.4f}", flush=True)
    if "compat" in only:
        print("vgg13 --reference-compat: GPUs / micro-batch | ms")
        for gpus, micro in ((2, 32), (4, 32), (8, 32), (4, 16), (4, 64), (2, None), (4, None), (8, None)):
            print(f"  N={gpus} mb={micro} | {ms(vgg_raw, gpus, micro_batch_size=micro, reference_compat=True):.4f}",
                  flush=True)
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
