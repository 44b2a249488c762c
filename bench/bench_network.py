"""Time the flow network model on a large run and report the flow solver's share.

    python bench/bench_network.py            # resnet50, case 2, 1,024 GPUs, DGX H100 SuperPOD file
    python bench/bench_network.py --gpus 256 --network exclusive --trace /path/to/trace

Prints wall time per stage (configure = trace loading + platform, build, schedule, summarize),
the time spent inside the flow solver (max-min rate computation and flow set-up, measured by
wrapping them), the number of flows, and the process's peak resident memory. The trace defaults
to the resnet50 reference trace in ../shared/reference (TRIOSIM_REFERENCE_DIR overrides).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

REFERENCE = Path(os.environ.get("TRIOSIM_REFERENCE_DIR", Path(__file__).resolve().parents[1].parent / "shared"
                                / "reference")) / "sample_trace" / "trace2-h100-bs128"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(REFERENCE / "resnet50"))
    ap.add_argument("--case", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--topology-file", default="topologies/dgx-h100-superpod.yaml")
    ap.add_argument("--network", default="flow", choices=("flow", "exclusive"))
    ap.add_argument("--collective-algo", default="auto")
    args = ap.parse_args()

    t_start = time.perf_counter()
    import triosim.hardware.flow_network as network
    import triosim.schedule.list_scheduler as scheduler
    from triosim.config import configure
    from triosim.graph import build_graph
    from triosim.report.result import summarize

    solver = {"seconds": 0.0, "rate_updates": 0, "flows": 0}
    real_rates, real_flow = scheduler.maxmin_rates, scheduler.flow_of

    def timed_rates(flows):
        t = time.perf_counter()
        real_rates(flows)
        solver["seconds"] += time.perf_counter() - t
        solver["rate_updates"] += 1

    def timed_flow(*args):
        t = time.perf_counter()
        f = real_flow(*args)
        solver["seconds"] += time.perf_counter() - t
        solver["flows"] += 1
        return f

    scheduler.maxmin_rates, scheduler.flow_of = timed_rates, timed_flow
    assert network.maxmin_rates is real_rates

    stages = {}
    t = time.perf_counter()
    trace, platform, strategy = configure(trace_dir=args.trace, case=args.case, gpus=args.gpus,
                                          topology_file=args.topology_file, network=args.network,
                                          collective_algo=args.collective_algo)
    stages["configure"] = time.perf_counter() - t
    t = time.perf_counter()
    graph = build_graph(trace, platform, strategy)
    stages["build"] = time.perf_counter() - t
    t = time.perf_counter()
    sched = scheduler.schedule(graph)
    stages["schedule"] = time.perf_counter() - t
    t = time.perf_counter()
    summarize(graph, sched, platform)
    stages["summarize"] = time.perf_counter() - t
    total = time.perf_counter() - t_start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux

    print(f"{Path(args.trace).name} case {args.case}, {args.gpus} GPUs, {platform.topology}, --network {args.network}")
    print(f"iteration time        {sched.makespan * 1e3:.4f} ms   ({len(graph):,} tasks, {graph.num_edges:,} edges)")
    used = ", ".join(f"{k} ×{v['calls']}" for k, v in graph.meta.get("collectives", {}).items())
    print(f"collectives           {used}")
    for name, sec in stages.items():
        print(f"{name:<21} {sec:8.2f} s")
    print(f"total (in process)    {total:8.2f} s")
    print(f"flow solver           {solver['seconds']:8.2f} s  = {100 * solver['seconds'] / total:.1f}% of the total, "
          f"{100 * solver['seconds'] / max(stages['schedule'], 1e-12):.1f}% of scheduling "
          f"({solver['flows']:,} flows, {solver['rate_updates']:,} rate updates)")
    print(f"peak RSS              {rss:8.0f} MiB")


if __name__ == "__main__":
    main()
