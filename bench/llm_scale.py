"""Large LLM meshes: whole `triosim run` processes, wall and CPU seconds, peak RSS and task count.

    python bench/llm_scale.py              # both configurations
    python bench/llm_scale.py --only 1T    # one of them

The model is the 16-head GPT sample trace (``sample_trace/gpt-h16-cpu-bs8``) repeated to the
published depth, so the mesh and the schedule are the published ones while the layer is the
sample's (the point is the simulator's cost, not the model's time):

- **1T** (Narayanan et al. 2021, Table 1: 128 layers, TP 8 × PP 64, 512 GPUs): 128 layers,
  batch 512 in micro-batches of 1, 1F1B. Targets ≤ 30 s, ≤ 2 GiB.
- **175B interleaved** (Korthikanti et al. 2022, Table 5: TP 8 × PP 8, 3 stages per GPU, 64 GPUs):
  96 layers, batch 64 in micro-batches of 1, interleaved with V = 3. Target ≤ 10 s.

Both on ``nvlink-cluster`` (8 GPUs a node: a TP group is one node). CPU seconds are the steadier
figure on a shared machine; the load average and a calibration loop are printed first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from calibration import calibration_seconds  # bench/calibration.py (bench/ is on the path)

REPO = Path(__file__).resolve().parents[1]
GPT = REPO / "sample_trace" / "gpt-h16-cpu-bs8"
CLI = "import sys; from triosim.cli.console import main; sys.exit(main())"
COMMON = ["-trace-dir", str(GPT), "--topology", "nvlink-cluster", "-micro-batch-size", "1"]
CONFIGS = {
    "1T": (["--num-layers", "128", "--tp", "8", "--pp", "64", "-batch-size-sim", "512", "--schedule", "1f1b"],
           "<= 30 s, <= 2 GiB"),
    "175B interleaved": (["--num-layers", "96", "--tp", "8", "--pp", "8", "-batch-size-sim", "64", "--schedule",
                          "interleaved", "--virtual-stages", "3"], "<= 10 s"),
}


def run(argv: list[str], code: Path) -> tuple[float, float, float, dict]:
    """Wall seconds, CPU seconds, peak RSS (GiB) and the JSON result of one `triosim run`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CLI, "run", *argv, "--json", "-"], capture_output=True, text=True,
                          cwd=code, env=dict(os.environ, PYTHONPATH=str(code)))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"llm_scale: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu, after.ru_maxrss / 2**20, json.loads(proc.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="one configuration: " + ", ".join(CONFIGS))
    ap.add_argument("--code", type=Path, default=REPO, help="the checkout whose triosim runs (default: this one)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; calibration loop {calibration_seconds():.2f} s CPU; "
          f"code {args.code}")
    print(f"{'configuration':<18} {'GPUs':>5} {'tasks':>10} {'iteration ms':>14} {'wall s':>7} {'CPU s':>7} "
          f"{'peak RSS GiB':>12}  target")
    for name, (argv, target) in CONFIGS.items():
        if args.only and args.only != name:
            continue
        wall, cpu, rss, out = run([*COMMON, *argv], args.code.resolve())
        print(f"{name:<18} {out['gpus']:>5} {out['tasks']:>10,} {out['makespan_ms']:>14.3f} {wall:>7.1f} "
              f"{cpu:>7.1f} {rss:>12.2f}  {target}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
