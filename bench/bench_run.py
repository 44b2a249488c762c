"""Time whole `triosim run` processes: median wall time and peak memory per (case, GPU count).

    python bench/bench_run.py --trace resnet50 --cases 1,2,3 --gpus 8,64 --repeat 3
    python bench/bench_run.py --trace /path/to/trace --batch-size 16 --cases 0 --gpus 1

``--trace vgg13|resnet50`` means the reference traces in ../shared/reference (batch 128).
Each run is a fresh process (start-up, trace loading, building, scheduling, report), measured
from outside; peak memory is the child's maximum resident set size (os.wait4).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "sample_trace" / "trace2-h100-bs128"


def run_reaped(argv: list[str]) -> tuple[float, int, str, int]:
    """Start the child and reap it ourselves so its own rusage (peak RSS) is reported."""
    t0 = time.perf_counter()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.dup2(out_w, 1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(out_r)
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    os.close(out_w)
    chunks = []
    while True:
        data = os.read(out_r, 65536)
        if not data:
            break
        chunks.append(data)
    os.close(out_r)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    return wall, usage.ru_maxrss * 1024, b"".join(chunks).decode().strip(), os.waitstatus_to_exitcode(status)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="resnet50", help="vgg13, resnet50 (reference) or a trace directory")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--cases", default="0,1,2,3,4")
    ap.add_argument("--gpus", default="8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--extra", default="", help="extra flags for triosim run, e.g. '--micro-batch-size 1'")
    args = ap.parse_args()

    trace = REFERENCE / args.trace if args.trace in ("vgg13", "resnet50") else Path(args.trace)
    if not (trace / "trace.csv").is_file():
        print(f"bench: {trace}: no trace.csv (is ../shared present?)", file=sys.stderr)
        return 2
    exe = [sys.executable, "-m", "triosim.cli"]
    rows = []
    for case in [int(c) for c in args.cases.split(",")]:
        for n in [int(g) for g in args.gpus.split(",")]:
            argv = [*exe, "run", "-trace-dir", str(trace), "-batch-size", str(args.batch_size),
                    "-case", str(case), "-GPUnumber", str(n), "--quiet", *args.extra.split()]
            walls, peaks, result, code = [], [], "", 0
            for _ in range(args.repeat):
                wall, peak, result, code = run_reaped(argv)
                walls.append(wall)
                peaks.append(peak)
            rows.append((case, n, statistics.median(walls), max(peaks), result if code == 0 else f"exit {code}"))
            print(f"case {case} N={n:>5}: {statistics.median(walls):7.3f} s  {max(peaks) / 2**20:8.1f} MiB  "
                  f"-> {rows[-1][4]} ms", file=sys.stderr)
    print(f"\ntrace {trace.name}, {args.repeat} runs each, median wall time, peak RSS ({os.cpu_count()} CPUs)")
    print(f"{'case':>4} {'GPUs':>6} {'wall s':>8} {'peak MiB':>9} {'iteration ms':>14}")
    for case, n, wall, peak, result in rows:
        print(f"{case:>4} {n:>6} {wall:8.3f} {peak / 2**20:9.1f} {result:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
