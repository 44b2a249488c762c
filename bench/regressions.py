"""Speed regressions: a fixed list of `triosim run` (and `triosim plan`) processes timed against a
committed baseline.

    python bench/regressions.py                      # compare with bench/data/regressions-baseline.json
    python bench/regressions.py --record --note "…"  # write the baseline (from this checkout)
    python bench/regressions.py --record --only plan --note "…"  # re-record some, keep the others
    python bench/regressions.py --code DIR --record  # … or from another checkout's triosim (e.g. main)

Each run is a whole process of the ``triosim`` command (its entry point ``console_main``, imports
included; the package's bytecode compiled first, as an installed package has it, unless
``--source``), timed by its CPU seconds (user + system, steadier than wall time on a shared
machine) and, over ``--repeat`` runs, the fastest; its wall seconds, peak RSS and the load
average after it are printed and recorded beside them. A machine's speed
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from calibration import calibration_seconds  # bench/calibration.py (bench/ is on the path)

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO.parent / "shared" / "reference" / "sample_trace" / "trace2-h100-bs128"
BASELINE = REPO / "bench" / "data" / "regressions-baseline.json"
GPT = REPO / "sample_trace" / "gpt-h16-cpu-bs8"
# What the `triosim` console script runs (pyproject's [project.scripts]): after `run` it ends the
# process without freeing the graph object by object, as a user's run does.
CLI = "from triosim.cli.console import console_main; console_main()"
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
    # On a ring every GPU is built (one pipeline cannot stand for the others there): 96 layers on 1,024
    # GPUs passed the task limit, so the ring run is a 64-GPU one.
    "GPT 24 layers, dp 2 x tp 4 x pp 8, ring, every GPU": ["-trace-dir", str(GPT), "--num-layers", "24", "--schedule",
                                                           "1f1b", "-micro-batch-size", "1", "-batch-size-sim", "16",
                                                           "--dp", "2", "--tp", "4", "--pp", "8"],
    # Issue 36's targets (CPU s on 2 cores): <= 1 s, <= 2 s, <= 8 s, <= 8 s.
    "resnet50 case 2, 4096 GPUs": ["-trace-dir", str(REFERENCE / "resnet50"), "-case", "2", "-GPUnumber", "4096"],
    "resnet50 case 3, 4096 GPUs": ["-trace-dir", str(REFERENCE / "resnet50"), "-case", "3", "-GPUnumber", "4096"],
    # The same two, every GPU's tasks built and scheduled (--exact): "every exact run <= 2.5 us a task".
    "resnet50 case 2, 4096 GPUs, --exact": ["-trace-dir", str(REFERENCE / "resnet50"), "-case", "2", "-GPUnumber",
                                            "4096", "--exact"],
    "resnet50 case 3, 4096 GPUs, --exact": ["-trace-dir", str(REFERENCE / "resnet50"), "-case", "3", "-GPUnumber",
                                            "4096", "--exact"],
    "megatron-1t, tp 8 x pp 64, 512 micro-batches, selective + SP": [
        "--gpu", "a100-80gb", "--topology-file", str(REPO / "topologies" / "dgx-a100-superpod.yaml"), "--dtype", "fp16",
        "--model", "megatron-1t", "--tp", "8", "--pp", "64", "--schedule", "1f1b", "--global-batch", "512",
        "-micro-batch-size", "1", "--pipeline-send", "blocking", "--pipeline-scatter-gather", "--recompute",
        "selective", "--sequence-parallel"],
    "llama3-405b, dp 1024 x tp 8 x pp 16, 131,072 H100s": [
        "--model", "llama3-405b", "--gpu", "h100-sxm", "--topology-file",
        str(REPO / "topologies" / "dgx-h100-superpod.yaml"), "--dp", "1024", "--tp", "8", "--pp", "16",
        "--global-batch", "8192", "-micro-batch-size", "1", "--seq-len", "8192", "--dtype", "bf16"],
    # An entry that starts with "plan" runs `triosim plan` (its workers' CPU counted: the process
    # reaps them); what it prints with -q is the best configuration's command line.
    "plan gpt3-175b, 1,024 H100s, global batch 1,536": [
        "plan", "--model", "gpt3-175b", "--gpu", "h100-sxm", "--topology-file",
        "topologies/dgx-h100-superpod.yaml", "--gpus", "1024", "--global-batch", "1536"],  # the checkout's
}


def run_once(argv: list[str], code: Path) -> tuple[float, str, float, float]:
    """CPU seconds of one `triosim run -q` (or `plan -q`) process with ``code`` first on the path
    (with the workers it reaped), what it printed, its wall seconds and its peak RSS (MiB, the
    process's own: ``os.wait4``)."""
    env = dict(os.environ, PYTHONPATH=str(code))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        command = argv if argv[:1] == ["plan"] else ["run", *argv]
        proc = subprocess.Popen([sys.executable, "-c", CLI, *command, "-q"], stdout=out, stderr=err, cwd=code,
                                env=env)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"regressions: {' '.join(argv)}: exit {proc.returncode}: {stderr.strip()[-300:]}")
    return usage.ru_utime + usage.ru_stime, stdout.strip(), wall, usage.ru_maxrss / 1024


def compile_bytecode(code: Path) -> None:
    """Write the bytecode of ``code``'s package, as `pip install` does (with PYTHONDONTWRITEBYTECODE
    set, a source checkout would otherwise compile every module in every timed process: 0.3 s)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "triosim")], env=env, check=True,
                   stdout=subprocess.DEVNULL)


def measure(code: Path, repeat: int, only: list[str], compiled: bool = True) -> dict[str, dict]:
    if compiled:
        compile_bytecode(code)
    out = {}
    for name, argv in RUNS.items():
        if only and not any(o in name for o in only):
            continue
        trace_dir = Path(argv[argv.index("-trace-dir") + 1]) if "-trace-dir" in argv else None  # else a model card
        if trace_dir is not None and not (trace_dir / "trace.csv").is_file():
            print(f"  skipped (no {trace_dir}): {name}", file=sys.stderr)
            continue
        best = None
        for _ in range(max(1, repeat)):
            calib = calibration_seconds()
            cpu, printed, wall, rss = run_once(argv, code)
            loops = cpu / calib
            if best is None or loops < best["loops"]:
                best = {"cpu_s": round(cpu, 3), "calibration_s": round(calib, 3), "loops": round(loops, 3),
                        "iteration_ms": printed, "wall_s": round(wall, 3), "peak_rss_mib": round(rss),
                        "load_average": round(os.getloadavg()[0], 2)}
        out[name] = best
        print(f"  {name}: {best['cpu_s']:.2f} s CPU = {best['loops']:.2f} loops, {best['wall_s']:.2f} s wall, "
              f"{best['peak_rss_mib']} MiB, load {best['load_average']:.2f} ({best['iteration_ms']}"
              f"{'' if argv[:1] == ['plan'] else ' ms'})",
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
    ap.add_argument("--source", action="store_true",
                    help="do not compile the package's bytecode first (each process compiles what it imports)")
    ap.add_argument("--only", action="append", default=[], help="only runs whose name contains this (repeatable)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; code {args.code}", file=sys.stderr)
    now = measure(args.code.resolve(), args.repeat, args.only, compiled=not args.source)
    if args.record:
        runs = now
        if args.only and args.baseline.exists():  # the other runs keep their baseline
            old = json.loads(args.baseline.read_text())
            runs = {**old["runs"], **now}
            args.note = f"{old['note']}; re-recorded {', '.join(now)}: {args.note}"
        doc = {"note": args.note, "load_average": round(os.getloadavg()[0], 2), "runs": runs}
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
