"""Scaling curve: build and schedule time versus GPU count, with tasks scheduled per second.

    python bench/bench_scaling.py --trace resnet50 --cases 1,2,3 --gpus 8,16,32,64,128,256,512,1024
    python bench/bench_scaling.py --trace resnet50 --cases 4 --gpus 8,16,32,64 --extra-mb 1 --batch-sim 512

In-process timing of the phases (load is done once), so the figures show how cost grows with
the number of tasks; bench_run.py measures whole processes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "sample_trace" / "trace2-h100-bs128"


def main() -> int:
    from triosim import build_platform, load_trace, scale_trace
    from triosim.graph import build_graph
    from triosim.graph.strategy import Strategy
    from triosim.report.result import summarize
    from triosim.schedule.list_scheduler import schedule

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--batch-sim", type=int, default=None)
    ap.add_argument("--cases", default="1,2,3")
    ap.add_argument("--gpus", default="8,16,32,64,128,256,512,1024")
    ap.add_argument("--extra-mb", type=int, default=None, help="micro-batch size for case 4")
    args = ap.parse_args()
    path = REFERENCE / args.trace if args.trace in ("vgg13", "resnet50") else Path(args.trace)
    if not (path / "trace.csv").is_file():
        print(f"bench: {path}: no trace.csv (is ../shared present?)", file=sys.stderr)
        return 2
    trace = load_trace(path, batch_size=args.batch_size)
    if args.batch_sim:
        trace = scale_trace(trace, args.batch_sim)
    print(f"trace {path.name}; in-process build + schedule + summary")
    print(f"{'case':>4} {'GPUs':>6} {'tasks':>10} {'edges':>10} {'build s':>8} {'sched s':>8} {'total s':>8} "
          f"{'tasks/s':>10} {'iteration ms':>13}")
    for case in [int(c) for c in args.cases.split(",")]:
        for n in [int(g) for g in args.gpus.split(",")]:
            t0 = time.perf_counter()
            plat = build_platform(n)
            graph = build_graph(trace, plat, Strategy(case=case, micro_batch_size=args.extra_mb))
            t1 = time.perf_counter()
            sched = schedule(graph)
            t2 = time.perf_counter()
            summarize(graph, sched, plat)
            t3 = time.perf_counter()
            total = t3 - t0
            print(f"{case:>4} {n:>6} {len(graph):>10,} {graph.num_edges:>10,} {t1 - t0:8.3f} {t2 - t1:8.3f} "
                  f"{total:8.3f} {len(graph) / total:10,.0f} {sched.makespan * 1e3:13.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
