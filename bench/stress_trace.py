"""Stress benchmark: a synthetic trace of ~200,000 operator rows, loaded and simulated (case 0).

    python bench/stress_trace.py                 # 200k rows, load + `triosim run -case 0`
    python bench/stress_trace.py --rows 50000 --profile

Prints the trace size, the time ``load_trace`` takes in this process and the wall time of a
whole ``triosim run -case 0 -q`` process on it (start-up, loading, building, scheduling).
The trace is written once into ``--dir`` (default: a temporary directory) and reused.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_trace(directory: Path, rows: int) -> Path:
    from triosim.synthetic import SyntheticModel, write_synthetic_trace

    # The synthetic MLP has 3 ops per layer (forward, backward, optimizer) plus loss and its grad.
    layers = max(1, (rows - 2) // 3)
    if not (directory / "trace.csv").is_file():
        write_synthetic_trace(directory, SyntheticModel(layers=layers, batch_size=8, seed=7))
    return directory


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000, help="operator rows of trace.csv (200000)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (or reuse) the trace")
    ap.add_argument("--profile", action="store_true", help="cProfile load_trace and print the top entries")
    ap.add_argument("--no-run", action="store_true", help="time only load_trace, not a whole run")
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

    from triosim.trace import load_trace

    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        load_trace(trace_dir, batch_size=8)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(15)
    t0 = time.perf_counter()
    trace = load_trace(trace_dir, batch_size=8)
    load_s = time.perf_counter() - t0
    print(f"load_trace: {load_s:.2f} s ({len(trace.ops):,} ops, {len(trace.tensors):,} tensors)")
    if not args.no_run:
        cmd = [sys.executable, "-m", "triosim.cli", "run", "-case", "0", "-trace-dir", str(trace_dir),
               "-batch-size", "8", "-q"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "100"})
        run_s = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stderr.strip(), file=sys.stderr)
            return proc.returncode
        print(f"triosim run -case 0: {run_s:.2f} s wall, iteration {proc.stdout.strip()} ms")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
