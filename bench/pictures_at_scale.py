"""The DAG picture and the timeline of Llama-2 70B on 64 or 256 H100s: nodes, pixels, megabytes, seconds.

    python bench/pictures_at_scale.py               # --pp 1 and --pp 4, default pictures and timelines
    python bench/pictures_at_scale.py --pp 4 --full # also the full timeline (--timeline-gpus all ...)

Each configuration runs as the user would (``triosim dag --render png``, ``triosim run -q
--timeline``), in a fresh process, and prints the command's own lines (nodes drawn from how many
tasks, the picture's size, the timeline's size and event counts) with the wall time. It needs
Graphviz's ``dot`` for the picture (docs/dag.md has the numbers measured with it).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA_70B = ["--model", "llama2-70b", "--gpu", "h100-sxm", "--tp", "8", "--dp", "8", "--global-batch", "512",
             "-micro-batch-size", "1", "--schedule", "1f1b",
             "--topology-file", str(ROOT / "topologies" / "dgx-h100-superpod.yaml")]


def timed(argv: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "triosim.cli", *argv], capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return took, (proc.stdout + proc.stderr).strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=int, nargs="*", default=[1, 4])
    ap.add_argument("--full", action="store_true", help="also write the full timeline")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for pp in args.pp:
            flags = [*LLAMA_70B, "--pp", str(pp)]
            print(f"== Llama-2 70B, tp 8 x dp 8 x pp {pp}")
            took, out = timed(["dag", *flags, "--export", f"{tmp}/dag{pp}.dot", "--render", "png"])
            print(f"{out}\n   dag --render png: {took:.1f} s")
            runs = [("default", [])]
            if args.full:
                runs.append(("full", ["--timeline-gpus", "all", "--timeline-micro-batches", "all"]))
            for what, extra in runs:
                took, out = timed(["run", *flags, "-q", "--timeline", f"{tmp}/t{pp}.json", *extra])
                print(f"{out}\n   run --timeline ({what}): {took:.1f} s")


if __name__ == "__main__":
    main()
