"""A 48-configuration sweep of a reference trace: cases 0/1/2 × 4 GPU counts × 4 link speeds.

Run from the repository root (needs ../shared/reference, and matplotlib for the plot)::

    python bench/sweep_48.py [--trace vgg13] [--out-dir out/sweep48] [--jobs N] [--dask ADDRESS]

It prints the wall time of the whole sweep (and, for comparison, of the same grid in one
process with ``--compare-inprocess``), checks the CSV has 48 rows in grid order, and leaves
``sweep48.csv``, ``sweep48.json`` and ``scaling.png`` in the output directory.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO.parent / "shared" / "reference" / "sample_trace" / "trace2-h100-bs128"
GRID = ["--case", "0,1,2", "--gpus", "2,4,8,16", "--ptp-bandwidth", "65,300,600,900"]


def sweep(trace_dir: Path, out_dir: Path, extra: list[str], tag: str) -> tuple[float, int]:
    from triosim.cli.console import main

    csv_path = out_dir / f"{tag}.csv"
    t0 = time.perf_counter()
    rc = main(["sweep", "--trace-dir", str(trace_dir), *GRID, "--out", str(csv_path),
               "--out", str(out_dir / f"{tag}.json"), *extra])
    wall = time.perf_counter() - t0
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    expected = [(c, g, b) for c in ("0", "1", "2") for g in ("2", "4", "8", "16")
                for b in ("65.0", "300.0", "600.0", "900.0")]
    assert [(r["case"], r["gpus"], r["ptp-bandwidth"]) for r in rows] == expected, "rows not in grid order"
    print(f"{tag}: exit {rc}, {len(rows)} rows, "
          f"{sum(r['status'] == 'ok' for r in rows)} ok, wall {wall:.2f} s", file=sys.stderr)
    return wall, len(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="vgg13")
    ap.add_argument("--out-dir", default=str(REPO / "out" / "sweep48"))
    ap.add_argument("--jobs", default=None)
    ap.add_argument("--dask", default=None)
    ap.add_argument("--compare-inprocess", action="store_true")
    args = ap.parse_args()
    trace_dir = REFERENCE / args.trace
    if not (trace_dir / "trace.csv").is_file():
        print(f"reference trace {trace_dir} not available", file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extra = ["--plot", str(out / "scaling.png"), "--top", "12"]
    if args.jobs:
        extra += ["--jobs", args.jobs]
    if args.dask:
        extra += ["--dask", args.dask]
    sweep(trace_dir, out, extra, "sweep48")
    if args.compare_inprocess:
        sweep(trace_dir, out, ["--jobs", "1", "-q"], "sweep48-inprocess")
        same = (out / "sweep48.csv").read_bytes() == (out / "sweep48-inprocess.csv").read_bytes()
        print(f"in-process CSV identical to the parallel one: {same}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
