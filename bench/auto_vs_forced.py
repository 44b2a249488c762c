"""CPU time of ``--collective-algo auto`` against the same run with auto's winner forced.

    python bench/auto_vs_forced.py                     # the built-in list of configurations
    python bench/auto_vs_forced.py --trace /path/to/resnet50 --repeat 3

``auto`` compares the algorithms' closed forms and builds only the winner's tasks; the tree's
pipeline is walked only when a bound on it does not already lose. Target: auto costs at most
1.2× the CPU of the winner forced, on every configuration. Each run is a fresh process (its
user + system CPU from the OS); the winner is the algorithm the auto run's JSON names for its
largest collective. Prints one row per configuration and the worst ratio. The resnet50 trace
defaults to the reference trace in ../shared/reference (TRIOSIM_REFERENCE_DIR overrides);
configurations that need it are skipped when it is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REFERENCE = Path(os.environ.get("TRIOSIM_REFERENCE_DIR", Path(__file__).resolve().parents[1].parent / "shared"
                                / "reference")) / "sample_trace" / "trace2-h100-bs128"

# (label, needs the resnet50 trace, flags)
CONFIGS = [
    ("resnet50 case 2, 1024 GPUs, ring topology", True, ["--case", "2", "--gpus", "1024"]),
    ("resnet50 case 1, 1024 GPUs, ring topology", True, ["--case", "1", "--gpus", "1024"]),
    ("resnet50 case 2, 256 GPUs, DGX H100 SuperPOD", True,
     ["--case", "2", "--gpus", "256", "--topology-file", "dgx-h100-superpod"]),
    ("resnet50 case 2, 64 GPUs, DGX A100 SuperPOD", True,
     ["--case", "2", "--gpus", "64", "--topology-file", "dgx-a100-superpod"]),
    ("GPT sample dp 16 × tp 8, DGX H100 SuperPOD", False,
     ["--dp", "16", "--tp", "8", "--topology-file", "dgx-h100-superpod"]),
    ("GPT sample dp 8 × tp 4 × pp 2, nvlink-cluster", False,
     ["--dp", "8", "--tp", "4", "--pp", "2", "--topology", "nvlink-cluster"]),
]


def timed(args: list[str]) -> tuple[float, dict]:
    """(CPU seconds of one ``triosim run`` process, its JSON result)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [str(Path(sys.executable).parent / "triosim"), "run", *args, "-q", "--json", str(out)]
        before = os.times()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        after = os.times()
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        return cpu, json.loads(out.read_text())


def winner(result: dict) -> str:
    """The algorithm of the collectives that moved the most bytes (``ring/ll128`` → ``ring``)."""
    rows = (result.get("collectives") or {}).values()
    best = max(rows, key=lambda r: r["bytes"], default=None)
    return best["algo"].split("/")[0] if best else "ring"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(REFERENCE / "resnet50"), help="the resnet50 trace directory")
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement; the least CPU is kept")
    args = ap.parse_args()
    have_resnet = (Path(args.trace) / "trace.csv").is_file()
    print(f"{'configuration':<48} {'winner':<13} {'auto s':>8} {'forced s':>9} {'ratio':>6}  same time")
    worst = 0.0
    for label, resnet, flags in CONFIGS:
        if resnet and not have_resnet:
            print(f"{label:<48} skipped: no trace at {args.trace}")
            continue
        flags = (["--trace-dir", args.trace] if resnet else []) + flags
        runs = [timed(flags) for _ in range(args.repeat)]
        auto_cpu, auto_result = min(runs, key=lambda r: r[0])
        algo = winner(auto_result)
        forced = [timed([*flags, "--collective-algo", algo]) for _ in range(args.repeat)]
        forced_cpu, forced_result = min(forced, key=lambda r: r[0])
        ratio = auto_cpu / forced_cpu if forced_cpu > 0 else float("inf")
        worst = max(worst, ratio)
        same = auto_result["makespan_ms"] == forced_result["makespan_ms"]
        print(f"{label:<48} {algo:<13} {auto_cpu:8.2f} {forced_cpu:9.2f} {ratio:6.2f}  {same}")
    print(f"worst auto / forced CPU ratio: {worst:.2f} (target <= 1.2)")


if __name__ == "__main__":
    main()
