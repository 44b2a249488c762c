"""Speed regressions: a fixed list of `triosim run` processes timed against a committed baseline.

    python bench/regressions.py                      # compare with bench/data/regressions-baseline.json
    python bench/regressions.py --record --note "…"  # write the baseline (from this checkout)
    python bench/regressions.py --code DIR --record  # … or from another checkout's triosim (e.g. main)

Each run is a whole process (imports included), timed by its CPU seconds (user + system, steadier
than wall time on a shared machine) and, over ``--repeat`` runs, the fastest. A machine's speed
drifts with its load, so every time is divided by a calibration loop (a fixed pure-Python loop)
timed just before it: the baseline and a later run compare in loops, not seconds. A run that
takes more than ``--slower`` (1.5) times its baseline is printed as SLOWER and the exit status is
1; an iteration time that differs from the baseline's is printed too (a speed change must not
move a number unless it was meant to).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from calibration import calibration_seconds  # bench/calibration.py (bench/ is on the path)

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO.parent / "shared" / "reference" / "sample_trace" / "trace2-h100-bs128"
BASELINE = REPO / "bench" / "data" / "regressions-baseline.json"
GPT = REPO / "sample_trace" / "gpt-h16-cpu-bs8"
CLI = "import sys; from triosim.cli.console import main; sys.exit(main())"
HYBRID = ["--num-layers", "96", "--schedule", "1f1b", "-micro-batch-size", "1", "-batch-size-sim", "64"]

# name -> arguments of `triosim run`; traces under ../shared/reference are skipped where absent.
RUNS: dict[str, list[str]] = {
    "resnet50 case 3, 8 GPUs": ["-trace-dir", str(REFERENCE / "resnet50"), "-case", "3", "-GPUnumber", "8"],
    "resnet50 case 1, 256 GPUs": ["-trace-dir", str(REFERENCE / "resnet50"), "-case", "1", "-GPUnumber", "256"],
    "resnet50 case 2, 1024 GPUs, ring": ["-trace-dir", str(REFERENCE / "resnet50"), "-case", "2", "-GPUnumber", "1024",
                                         "--collective-algo", "ring"],
    "vgg13 case 4, 8 stages": ["-trace-dir", str(REFERENCE / "vgg13"), "-case", "4", "-GPUnumber", "8",
                               "-micro-batch-size", "16"],
    "GPT 96 layers, dp 8 x tp 8 x pp 8, nvlink-cluster": ["-trace-dir", str(GPT), *HYBRID, "--dp", "8", "--tp", "8",
                                                          "--pp", "8", "--topology", "nvlink-cluster"],
    "GPT 96 layers, dp 128 x tp 8 x pp 16, nvlink-cluster": ["-trace-dir", str(GPT), *HYBRID, "--dp", "128", "--tp",
                                                             "8", "--pp", "16", "--topology", "nvlink-cluster"],
    "GPT 96 layers, dp 8 x tp 8 x pp 16, ring": ["-trace-dir", str(GPT), *HYBRID, "--dp", "8", "--tp", "8", "--pp",
                                                 "16"],
}


def run_once(argv: list[str], code: Path) -> tuple[float, str]:
    """CPU seconds of one `triosim run -q` process with ``code`` first on the path, and what it printed."""
    env = dict(os.environ, PYTHONPATH=str(code))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", CLI, "run", *argv, "-q"], capture_output=True, text=True,
                          cwd=code, env=env, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"regressions: {' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), proc.stdout.strip()


def measure(code: Path, repeat: int, only: list[str]) -> dict[str, dict]:
    out = {}
    for name, argv in RUNS.items():
        if only and not any(o in name for o in only):
            continue
        trace_dir = Path(argv[argv.index("-trace-dir") + 1])
        if not (trace_dir / "trace.csv").is_file():
            print(f"  skipped (no {trace_dir}): {name}", file=sys.stderr)
            continue
        best = None
        for _ in range(max(1, repeat)):
            calib = calibration_seconds()
            cpu, printed = run_once(argv, code)
            loops = cpu / calib
            if best is None or loops < best["loops"]:
                best = {"cpu_s": round(cpu, 3), "calibration_s": round(calib, 3), "loops": round(loops, 3),
                        "iteration_ms": printed}
        out[name] = best
        print(f"  {name}: {best['cpu_s']:.2f} s CPU = {best['loops']:.2f} loops ({best['iteration_ms']} ms)",
              file=sys.stderr, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="write the baseline instead of comparing")
    ap.add_argument("--note", default="", help="with --record: how the baseline was taken (code, machine load)")
    ap.add_argument("--code", type=Path, default=REPO, help="the checkout whose triosim runs (default: this one)")
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each, the fastest counts")
    ap.add_argument("--slower", type=float, default=1.5, help="ratio to baseline printed as SLOWER (1.5)")
    ap.add_argument("--only", action="append", default=[], help="only runs whose name contains this (repeatable)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; code {args.code}", file=sys.stderr)
    now = measure(args.code.resolve(), args.repeat, args.only)
    if args.record:
        doc = {"note": args.note, "load_average": round(os.getloadavg()[0], 2), "runs": now}
        fd, tmp = tempfile.mkstemp(dir=args.baseline.parent, prefix=".regressions-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, args.baseline)
        print(f"baseline written to {args.baseline}")
        return 0
    base = json.loads(args.baseline.read_text())["runs"]
    slower = 0
    print(f"{'run':<55} {'base loops':>10} {'now loops':>10} {'ratio':>6}  iteration ms")
    for name, m in now.items():
        b = base.get(name)
        if b is None:
            print(f"{name:<55} {'-':>10} {m['loops']:>10.2f} {'-':>6}  {m['iteration_ms']} (not in the baseline)")
            continue
        ratio = m["loops"] / b["loops"]
        flag = "  SLOWER" if ratio > args.slower else ""
        moved = "" if m["iteration_ms"] == b["iteration_ms"] else f" (baseline {b['iteration_ms']}: MOVED)"
        slower += bool(flag)
        print(f"{name:<55} {b['loops']:>10.2f} {m['loops']:>10.2f} {ratio:>6.2f}  {m['iteration_ms']}{moved}{flag}")
    print(f"{slower} of {len(now)} runs more than {args.slower}x slower than the baseline")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
