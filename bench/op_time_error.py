"""How well each op-time model predicts another batch: vgg13 at batch 512 from batch 128.

    python bench/op_time_error.py                 # the original's data in ../shared/reference
    python bench/op_time_error.py --small DIR128 --big DIR512 --small-batch 128 --big-batch 512

Default data: the original's vgg13 sample trace (batch 128) and its raw tracer pair, which was
recorded at batch 512 (converted here with ``triosim trace convert``). Prints, op by op, the
measured time at the big batch and each model's prediction from the small-batch trace, then
the totals and their errors.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from triosim import load_trace
from triosim.cli.console import main as triosim_main
from triosim.compute.op_time import linear_floor_model, linear_model

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=Path, default=REFERENCE / "sample_trace" / "trace2-h100-bs128" / "vgg13")
    ap.add_argument("--big", type=Path, default=None, help="trace at the big batch (default: convert the pair)")
    ap.add_argument("--small-batch", type=int, default=128)
    ap.add_argument("--big-batch", type=int, default=512)
    ap.add_argument("--floor-us", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big_dir = args.big
        if big_dir is None:
            pair = REFERENCE / "tracer_data"
            if not (pair / "graph_vgg13-iter41.json").is_file():
                print(f"bench: {pair}: reference pair not found (is ../shared present?)", file=sys.stderr)
                return 2
            big_dir = Path(tmp) / "vgg13-bs512"
            triosim_main(["trace", "convert", "--graph", str(pair / "graph_vgg13-iter41.json"), "--profiler",
                          str(pair / "profiler_vgg13-iter41.json"), "--out", str(big_dir), "--quiet"])
        small = load_trace(args.small, batch_size=args.small_batch)
        big = load_trace(big_dir, batch_size=args.big_batch)
    models = {"linear": linear_model(small), "linear-floor": linear_floor_model(small, args.floor_us)}
    b = args.big_batch
    print(f"| op | name | measured µs (batch {b}) | " + " | ".join(f"{m} µs | err" for m in models) + " |")
    print("|---|---|---:|" + "---:|---:|" * len(models))
    totals = dict.fromkeys(models, 0.0)
    measured_total = 0.0
    for i, (a, o) in enumerate(zip(small.ops, big.ops)):
        meas = o.duration_s * 1e6
        measured_total += meas
        cells = []
        for name, model in models.items():
            pred = model.seconds(i, b) * 1e6
            totals[name] += pred
            cells.append(f"{pred:.0f} | {pred / meas - 1:+.1%}" if meas else f"{pred:.0f} | –")
        short = a.name.rsplit(": ", 1)[-1].replace("aten::", "")
        print(f"| {a.op_id} | {short} | {meas:.0f} | " + " | ".join(cells) + " |")
    cells = [f"{totals[m] / 1e3:.3f} ms | {totals[m] / measured_total - 1:+.1%}" for m in models]
    print(f"| | **total** | {measured_total / 1e3:.3f} ms | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
