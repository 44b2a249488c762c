"""Stress benchmark: a synthetic trace of ~200,000 operator rows, loaded and simulated (case 0).

    python bench/stress_trace.py                 # 200k rows: stages in-process, then a whole run
    python bench/stress_trace.py --rows 50000 --profile
    python bench/stress_trace.py --checker       # also time load_trace(fast=False)
    python bench/stress_trace.py --runs 5        # five whole runs: min, median, max

Prints the trace size; the time of each stage in this process (``load_trace``, the op-time
model, building the task graph, scheduling), as wall and CPU seconds; and the wall and CPU time
of a whole ``triosim run -case 0 -q`` process on it (start-up, loading, building, scheduling).
Because the machine may be shared, it also prints the load average and the time of a fixed
pure-Python loop (10^7 additions), so that figures from different moments can be compared.
The trace is written once into ``--dir`` (default: a temporary directory) and reused.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_trace(directory: Path, rows: int) -> Path:
    from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

    # The synthetic MLP has 3 ops per layer (forward, backward, optimizer) plus loss and its grad.
    layers = max(1, (rows - 2) // 3)
    if not (directory / "trace.csv").is_file():
        write_synthetic_trace(directory, SyntheticModel(layers=layers, batch_size=8, seed=7))
    return directory


def calibration_s() -> float:
    """CPU seconds of 10^7 Python additions: about 0.4 s on an idle modern core."""
    t0 = time.process_time()
    x = 0
    for i in range(10_000_000):
        x += i
    return time.process_time() - t0


class Clock:
    """Wall and CPU seconds of a block."""

    def __enter__(self) -> Clock:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0

    def __str__(self) -> str:
        return f"{self.wall:6.2f} s wall, {self.cpu:6.2f} s CPU"


def stages(trace_dir: Path, checker: bool) -> None:
    """Each stage of ``triosim run -case 0`` in this process."""
    from triosim.compute.op_time import attach_op_time_model
    from triosim.config import configure
    from triosim.graph import build_graph
    from triosim.schedule.list_scheduler import schedule
    from triosim.trace import load_trace

    with Clock() as c:
        trace = load_trace(trace_dir, batch_size=8)
    reader = "pyarrow" if type(trace.tensors).__name__ == "TensorTable" else "the checker"
    print(f"  load_trace            {c}  ({len(trace.ops):,} ops, {len(trace.tensors):,} tensors; {reader})")
    if checker:
        with Clock() as c:
            slow = load_trace(trace_dir, batch_size=8, fast=False)
        print(f"  load_trace(fast=False) {c}  (same trace: {slow == trace})")
    with Clock() as c:
        attach_op_time_model(trace)
    print(f"  op-time model         {c}")
    args = run_args(trace_dir)
    from triosim.cli.console import build_parser, normalize_argv

    ns = build_parser().parse_args(normalize_argv(args[1:]))
    trace, platform, strategy = configure(ns)
    with Clock() as c:
        graph = build_graph(trace, platform, strategy)
    print(f"  build the task graph  {c}  ({len(graph):,} tasks)")
    with Clock() as c:
        sched = schedule(graph)
    print(f"  schedule              {c}  (iteration {sched.makespan * 1e3:.4f} ms)")


def run_args(trace_dir: Path) -> list[str]:
    return ["triosim", "run", "-case", "0", "-trace-dir", str(trace_dir), "-batch-size", "8", "-q"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000, help="operator rows of trace.csv (200000)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (or reuse) the trace")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile a whole `triosim run -case 0` in this process and print the top entries")
    ap.add_argument("--checker", action="store_true", help="also time the row-by-row checker (fast=False)")
    ap.add_argument("--no-run", action="store_true", help="time only the stages in this process")
    ap.add_argument("--runs", type=int, default=1, help="whole `triosim run` processes to time (1)")
    args = ap.parse_args()
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="triosim-stress-")
        args.dir = Path(tmp.name) / f"mlp-{args.rows}"
    t0 = time.perf_counter()
    trace_dir = make_trace(args.dir, args.rows)
    gen_s = time.perf_counter() - t0
    n_ops = sum(1 for _ in open(trace_dir / "trace.csv")) - 1
    n_tensor = sum(1 for _ in open(trace_dir / "tensor.csv")) - 1
    size_mb = sum((trace_dir / f).stat().st_size for f in ("trace.csv", "tensor.csv")) / 1e6
    print(f"trace: {n_ops:,} trace.csv rows, {n_tensor:,} tensor.csv rows, {size_mb:.1f} MB "
          f"(written in {gen_s:.1f} s) at {trace_dir}")
    load = os.getloadavg()
    print(f"machine: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs; "
          f"10^7 Python additions take {calibration_s():.2f} s CPU")

    if args.profile:
        import cProfile
        import pstats

        from triosim.cli.console import main as triosim_main

        prof = cProfile.Profile()
        prof.enable()
        triosim_main(run_args(trace_dir)[1:])
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    print("stages in this process (the garbage collector paused, as `triosim run` pauses it):")
    from triosim.trace.load import collector_paused

    with collector_paused():
        stages(trace_dir, args.checker)
    if not args.no_run:
        # The console script's own entry (what `triosim run` runs), in a fresh interpreter.
        cmd = [sys.executable, "-c", "from triosim.cli.console import console_main; console_main()", *run_args(trace_dir)[1:]]
        walls = []
        for _ in range(args.runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "100"})
            run_s = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            if proc.returncode != 0:
                print(proc.stderr.strip(), file=sys.stderr)
                return proc.returncode
            walls.append(run_s)
            print(f"triosim run -case 0 (whole process): {run_s:.2f} s wall, {cpu_s:.2f} s CPU "
                  f"(all its threads), "
                  f"iteration {proc.stdout.strip()} ms")
        if len(walls) > 1:
            print(f"whole process over {len(walls)} runs: min {min(walls):.2f} s, "
                  f"median {statistics.median(walls):.2f} s, max {max(walls):.2f} s")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
