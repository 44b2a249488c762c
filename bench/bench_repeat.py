"""Time `trace repeat` and the Megatron plan on deep traces: repeat the GPT sample to L layers,
load the result, and plan tensor parallelism on it; prints seconds per step and peak RSS.

    python bench/bench_repeat.py --layers 4,24,96,384 --tp 4
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from triosim.graph.tensor.megatron import plan_tensor_parallel
from triosim.trace import load_trace
from triosim.trace.repeat import repeat_trace_dir

GPT = Path(__file__).resolve().parents[1] / "sample_trace" / "gpt-cpu-bs8"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=GPT)
    ap.add_argument("--layers", default="4,24,96")
    ap.add_argument("--tp", type=int, default=4)
    args = ap.parse_args()
    print(f"{'layers':>6} {'ops':>6} {'tensors':>8} {'repeat s':>9} {'load s':>7} {'plan s':>7} {'plan+sp s':>9}")
    for layers in (int(x) for x in args.layers.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            repeat_trace_dir(args.trace, tmp, layers)
            t1 = time.perf_counter()
            trace = load_trace(tmp)
            t2 = time.perf_counter()
            plan = plan_tensor_parallel(trace, args.tp)
            t3 = time.perf_counter()
            plan_tensor_parallel(trace, args.tp, sequence_parallel=True)
            t4 = time.perf_counter()
        print(f"{layers:>6} {len(trace.ops):>6} {len(trace.tensors):>8} {t1 - t0:>9.2f} {t2 - t1:>7.2f} "
              f"{t3 - t2:>7.2f} {t4 - t3:>9.2f}   {plan.summary()}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
