"""Pipeline planner figures: partitions, bandwidth and micro-batch series, compat with R > 1,
and the planner's own speed on large hybrid runs.

    python bench/pipeline_planner.py                       # everything (a few minutes)
    python bench/pipeline_planner.py --only partitions,bandwidth
    python bench/pipeline_planner.py --only speed          # the planner's time (no reference traces)

Uses the original's vgg13 and resnet50 traces in ../shared/reference (batch 128) with the
command line's defaults (op-time model ``auto``, i.e. linear-floor on these traces), unless
``--op-time-model linear``. Prints iteration times in ms.

``speed``: the stage planner alone (``plan_stages`` of one pipeline, as ``--dp/--tp/--pp`` runs
call it, routes already known) on the GPT sample repeated to 96 layers, 64 micro-batches of 1,
1F1B, nvlink-cluster: ``--dp 8 --tp 8 --pp 8`` (512 GPUs) and ``--dp 128 --tp 8 --pp 16``
(16,384 GPUs), for each ``--partition``. Wall and CPU seconds, best of ``--repeat`` runs (the
CPU time is the steadier figure on a shared machine). Target: at most 0.3 s each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from triosim import Strategy, build_platform, load_trace, simulate
from triosim.compute.op_time import attach_op_time_model

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "sample_trace" / "trace2-h100-bs128"
GPT = Path(__file__).resolve().parents[1] / "sample_trace" / "gpt-h16-cpu-bs8"
SECTIONS = ("partitions", "bandwidth", "microbatch", "compat", "speed")
SPEED_MESHES = ((8, 8, 8), (128, 8, 16))


def ms(trace, gpus: int, ptp: float = 65.0, **kw) -> float:
    compat = kw.get("reference_compat", False)
    platform = build_platform(gpus, ptp_bandwidth_gbps=ptp, reference_compat=compat)
    return simulate(trace, platform, Strategy(case=4, **kw)).makespan_ms


def planner_speed(dp: int, tp: int, pp: int, partition: str, repeat: int) -> tuple[float, float, tuple[int, ...]]:
    """Best wall and CPU seconds of the stage planner for one mesh, and the stage starts."""
    from triosim.config import configure
    from triosim.graph.collectives.star_routes import prime_routes
    from triosim.graph.composition import stage_plan
    from triosim.graph.pipeline.builder import micro_batch_sizes
    from triosim.graph.rank_map import RankMap

    trace, platform, strategy = configure(trace_dir=str(GPT), num_layers=96, dp=dp, tp=tp, pp=pp, schedule="1f1b",
                                          batch_size_sim=64, micro_batch_size=1, topology="nvlink-cluster",
                                          partition=partition)
    ranks = RankMap(dp, tp, pp, tuple(strategy.rank_order))
    gpus = ranks.stage_gpus(0, 0)
    # As the hybrid builder does before planning: the routes between neighbouring stages.
    prime_routes(platform, ((gpus[s], gpus[s + e]) for s in range(pp) for e in (-1, 1) if 0 <= s + e < pp))
    fractions = [m / trace.batch_size for m in micro_batch_sizes(trace.batch_size, strategy.micro_batch_size)]
    best_wall = best_cpu = float("inf")
    starts: tuple[int, ...] = ()
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        plan = stage_plan(trace, platform, strategy, fractions, gpus)
        best_wall = min(best_wall, time.perf_counter() - w0)
        best_cpu = min(best_cpu, time.process_time() - c0)
        starts = plan.starts
    return best_wall, best_cpu, starts


def speed(repeat: int) -> None:
    print(f"stage planner, GPT sample x 96 layers, 64 micro-batches, 1F1B, nvlink-cluster (best of {repeat}):")
    print("  mesh | GPUs | partition | wall s | CPU s | stage starts")
    for dp, tp, pp in SPEED_MESHES:
        for part in ("count", "time", "optimal"):
            wall, cpu, starts = planner_speed(dp, tp, pp, part, repeat)
            print(f"  dp {dp} x tp {tp} x pp {pp} | {dp * tp * pp} | {part} | {wall:.3f} | {cpu:.3f} | "
                  f"{','.join(map(str, starts))}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=REFERENCE)
    ap.add_argument("--op-time-model", default="auto")
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--repeat", type=int, default=3, help="speed: runs per figure (the best is shown)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if only == {"speed"}:  # needs no reference traces
        speed(args.repeat)
        return 0
    if not (args.reference / "vgg13" / "trace.csv").is_file():
        print(f"bench: {args.reference}: no reference traces (is ../shared present?)", file=sys.stderr)
        return 2
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
    if "speed" in only:
        speed(args.repeat)
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
