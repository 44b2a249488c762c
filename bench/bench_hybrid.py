"""Hybrid-parallel speed and memory: whole `triosim run` processes, wall time, CPU time and peak RSS.

    python bench/bench_hybrid.py            # the two targets (16,384 and 512 GPUs)
    python bench/bench_hybrid.py --repeat 10  # each run 10 times: min, median and max
    python bench/bench_hybrid.py --agreement  # also representative vs --exact on small meshes

The model is the 16-head GPT sample trace (``sample_trace/gpt-h16-cpu-bs8``, 2 traced layers)
repeated to 96 layers (``--num-layers 96``), per-replica batch 64 in 64 micro-batches of 1, 1F1B,
on ``nvlink-cluster`` (8 GPUs per NVSwitch node, TP inside a node), Megatron tensor parallelism
(16 heads split 8 ways). Targets on a 2-core machine: 16,384 GPUs (dp 128 × tp 8 × pp 16) in
≤ 20 s and ≤ 2 GiB peak RSS; 512 GPUs (dp 8 × tp 8 × pp 8) in ≤ 5 s. CPU seconds (user + system
of the process) are printed beside the wall time: on a shared machine they are the steadier figure.
The load average and a calibration loop (a fixed pure-Python loop, timed in this process) are
printed first: the machine's own speed drifts, and the loop shows by how much.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from calibration import calibration_seconds  # bench/calibration.py (bench/ is on the path)

REPO = Path(__file__).resolve().parents[1]
GPT = REPO / "sample_trace" / "gpt-h16-cpu-bs8"
GPT4 = REPO / "sample_trace" / "gpt-cpu-bs8"  # 4 heads: the agreement table
CLI = "import sys; from triosim.cli.console import main; sys.exit(main())"
ORIGINAL_NETWORK = ["--network", "exclusive", "--collective-algo", "one-way-ring", "--collective-latency-us", "0"]
COMMON = ["--schedule", "1f1b", "-batch-size-sim", "64", "-micro-batch-size", "1", "--topology", "nvlink-cluster"]


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, dict, float]:
    """Wall seconds, peak RSS (GiB), the JSON and the CPU seconds of one ``triosim run`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CLI, "run", *argv, "--json", "-"], capture_output=True,
                          text=True, cwd=REPO, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"triosim failed: {proc.stderr.strip()}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss = max(before.ru_maxrss, after.ru_maxrss) / 2**20  # KiB -> GiB
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, rss, json.loads(proc.stdout), cpu


def spread(values: list[float]) -> str:
    """``min / median / max`` of several runs (the one value of a single run)."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    v = sorted(values)
    return f"{v[0]:.2f} / {v[len(v) // 2]:.2f} / {v[-1]:.2f}"


def phases(argv: list[str]) -> dict[str, float]:
    """CPU seconds of each phase of one run in this process (imports excluded)."""
    from triosim.cli.console import build_parser, normalize_argv
    from triosim.config import configure
    from triosim.graph import build_graph
    from triosim.report.result import summarize
    from triosim.schedule.list_scheduler import schedule
    from triosim.trace.load import collector_paused

    args = build_parser().parse_args(["run", *normalize_argv(argv)])
    out: dict[str, float] = {}
    with collector_paused():  # as `triosim run` does
        t = time.process_time()
        trace, platform, strategy = configure(args)
        out["load + repeat"] = time.process_time() - t
        t = time.process_time()
        graph = build_graph(trace, platform, strategy)
        out["build"] = time.process_time() - t
        t = time.process_time()
        sched = schedule(graph)
        out["schedule"] = time.process_time() - t
        t = time.process_time()
        summarize(graph, sched, platform)
        out["summary"] = time.process_time() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=96)
    ap.add_argument("--agreement", action="store_true", help="also compare representatives with --exact")
    ap.add_argument("--tp-style", default="megatron", help="megatron (default) or per-op")
    ap.add_argument("--phases", action="store_true", help="also CPU seconds per phase, in this process")
    ap.add_argument("--repeat", type=int, default=1, help="run each target this many times (min / median / max)")
    ap.add_argument("--cached-bytecode", action="store_true",
                    help="run with Python's bytecode cache (in a temporary directory, after one untimed run) even "
                         "where PYTHONDONTWRITEBYTECODE is set: as an installed package runs")
    args = ap.parse_args()
    env = None
    cache = tempfile.TemporaryDirectory(prefix="triosim-bench-pyc-") if args.cached_bytecode else None
    if cache is not None:  # removed when the bench ends
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache.name
    layers = ["--num-layers", str(args.layers)] if args.layers else []
    print(f"GPT sample trace repeated to {args.layers} layers, 1F1B, 64 micro-batches, nvlink-cluster")
    cached = args.cached_bytecode or not sys.dont_write_bytecode
    print(f"load average {os.getloadavg()[0]:.2f}; calibration loop {calibration_seconds():.2f} s CPU; "
          f"Python bytecode {'cached' if cached else 'not cached (PYTHONDONTWRITEBYTECODE: compiled at each start)'}")
    print(f"{'mesh':>22} {'GPUs':>6} {'tasks':>9} {'iteration ms':>13} {'wall s':>18} {'CPU s':>18} "
          f"{'peak RSS GiB':>13} target")
    for dp, tp, pp, target in ((8, 8, 8, "<= 5 s"), (128, 8, 16, "<= 20 s, <= 2 GiB")):
        argv = ["-trace-dir", str(GPT), *layers, "--dp", str(dp), "--tp", str(tp), "--pp", str(pp),
                "--tp-style", args.tp_style, *COMMON]
        if env is not None:
            run(argv, env)  # writes the bytecode cache
        walls, cpus, rsss = [], [], []
        for _ in range(max(1, args.repeat)):
            wall, rss, out, cpu = run(argv, env)
            walls.append(wall)
            cpus.append(cpu)
            rsss.append(rss)
        print(f"{f'dp {dp} x tp {tp} x pp {pp}':>22} {dp * tp * pp:>6} {out['tasks']:>9,} "
              f"{out['makespan_ms']:>13.3f} {spread(walls):>18} {spread(cpus):>18} {max(rsss):>13.3f} {target}")
        if args.phases:
            split = phases(["-trace-dir", str(GPT), *layers, "--dp", str(dp), "--tp", str(tp), "--pp", str(pp),
                            "--tp-style", args.tp_style, *COMMON])
            print(" " * 24 + "CPU s: " + ", ".join(f"{k} {v:.2f}" for k, v in split.items()))
    if args.agreement:
        print("\nrepresentatives vs --exact (GPT sample as traced, batch 8, micro-batch 2, 1F1B, nvlink-cluster with "
              "4 GPUs per node, macro collectives)")
        print(f"{'network':>9} {'mesh':>20} {'ZeRO':>4} {'exact ms':>13} {'repr. ms':>13} {'rel. diff':>10} "
              f"{'exact s':>8} {'repr. s':>8}")
        for network, extra in (("exclusive", ORIGINAL_NETWORK), ("default", [])):
            for dp, tp, pp in ((2, 2, 2), (4, 2, 2), (2, 4, 2), (4, 4, 4)):
                for zero in (0, 1, 3):
                    base = ["-trace-dir", str(GPT4), "--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--zero",
                            str(zero), "-micro-batch-size", "2", "--schedule", "1f1b", "--topology", "nvlink-cluster",
                            "--gpus-per-node", "4", "--collective-detail", "macro", *extra]
                    we, _, ex, _ = run([*base, "--exact"])
                    wr, _, rp, _ = run([*base, "--representatives"])
                    diff = abs(ex["makespan_ms"] - rp["makespan_ms"]) / ex["makespan_ms"]
                    print(f"{network:>9} {f'dp {dp} x tp {tp} x pp {pp}':>20} {zero:>4} {ex['makespan_ms']:>13.6f} "
                          f"{rp['makespan_ms']:>13.6f} {diff:>10.1e} {we:>8.2f} {wr:>8.2f}")


if __name__ == "__main__":
    main()
