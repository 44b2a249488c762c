"""SIGKILL ``triosim trace repeat --out DIR`` right after its first rename and check that DIR is
always the old or the new trace directory, never a mix.

    python bench/sigkill_repeat.py [--kills 30] [--random 10]

DIR starts as the output of ``--layers 2``; each run writes ``--layers 3`` over it and kills
itself (SIGKILL, no clean-up) right after the first rename of the directory write:

- ``exchange``: the one ``renameat2(RENAME_EXCHANGE)`` that swaps the new directory with the old;
- ``fallback``: where the exchange is unavailable, the first of the two renames (the old
  directory renamed away): DIR is then missing, with the old and the new directory whole beside
  it; the next write of DIR (:func:`triosim.output.recover_dir`) puts the old one back;
- ``random``: a SIGKILL from outside at a random moment of the run.

Each row counts what DIR held right after the kill and after the next run's recovery: the old
files, the new files, nothing (fallback only), or a mix (must be 0). Every leftover sibling
directory is checked to be whole too.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "sample_trace" / "gpt-cpu-bs8"
FILES = ("trace.csv", "tensor.csv", "meta.json")

KILLER = r"""
import os, signal, sys
import triosim.output as o
mode = sys.argv[1]
def die():
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "exchange":
    real = o._exchange
    def swap(a, b):
        done = real(a, b)
        if done:
            die()
        return done
    o._exchange = swap
elif mode == "fallback":
    o._exchange = lambda a, b: False
    real_rename = os.rename
    def rename(a, b):
        real_rename(a, b)
        die()
    o.os.rename = rename
from triosim.cli.console import main
sys.exit(main(sys.argv[2:]))
"""


def digest(d: Path) -> tuple | None:
    """The directory's files and their hashes (None when it does not exist)."""
    if not d.is_dir():
        return None
    return tuple(sorted((p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in d.iterdir()))


def classify(d: Path, old: tuple, new: tuple) -> str:
    got = digest(d)
    return "missing" if got is None else "old" if got == old else "new" if got == new else "MIXED"


def python() -> str:
    return sys.executable


def make(dst: Path, layers: int) -> None:
    subprocess.run([python(), "-m", "triosim.cli", "trace", "repeat", "--layers", str(layers), "--in", str(SRC),
                    "--out", str(dst)], check=True, capture_output=True)


def run_kills(mode: str, kills: int, work: Path, old_dir: Path, old: tuple, new: tuple) -> Counter:
    """``kills`` runs of ``mode``; counts of what DIR and its siblings held."""
    from triosim.output import recover_dir

    counts: Counter = Counter()
    for k in range(kills):
        case = work / f"{mode}{k}"
        case.mkdir()
        out = case / "out"
        shutil.copytree(old_dir, out)
        argv = ["trace", "repeat", "--layers", "3", "--in", str(SRC), "--out", str(out)]
        if mode == "random":
            proc = subprocess.Popen([python(), "-m", "triosim.cli", *argv], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(random.uniform(0.3, 2.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            counts["killed" if proc.returncode == -signal.SIGKILL else "finished first"] += 1
        else:
            proc = subprocess.run([python(), "-c", KILLER, mode, *argv], capture_output=True)
            counts["killed" if proc.returncode == -signal.SIGKILL else f"exit {proc.returncode}"] += 1
        counts[f"after kill: {classify(out, old, new)}"] += 1
        for sibling in case.iterdir():
            if sibling.name != "out":
                counts[f"leftover: {classify(sibling, old, new)}"] += 1
        recover_dir(out)
        counts[f"after recovery: {classify(out, old, new)}"] += 1
        counts["leftovers after recovery"] += sum(1 for s in case.iterdir() if s.name != "out")
        shutil.rmtree(case)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=30, help="kills per mode right after the first rename")
    ap.add_argument("--random", type=int, default=10, help="kills at random moments")
    args = ap.parse_args(argv)
    random.seed(2026)
    with tempfile.TemporaryDirectory(prefix="triosim-sigkill-") as tmp:
        work = Path(tmp)
        old_dir, new_dir = work / "old", work / "new"
        make(old_dir, 2)
        make(new_dir, 3)
        old, new = digest(old_dir), digest(new_dir)
        assert old != new
        rows = [(mode, run_kills(mode, n, work, old_dir, old, new))
                for mode, n in (("exchange", args.kills), ("fallback", args.kills), ("random", args.random))]
    keys = ["killed", "after kill: old", "after kill: new", "after kill: missing", "after kill: MIXED",
            "leftover: old", "leftover: new", "leftover: MIXED", "after recovery: old", "after recovery: new",
            "after recovery: MIXED", "leftovers after recovery"]
    print("| mode | runs | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 2) + "|")
    bad = 0
    for mode, c in rows:
        runs = sum(v for k, v in c.items() if k.startswith("after recovery: "))
        print(f"| {mode} | {runs} | " + " | ".join(str(c[k]) for k in keys) + " |")
        bad += c["after kill: MIXED"] + c["leftover: MIXED"] + c["after recovery: MIXED"] + c["after recovery: missing"]
    print("mixed or missing after recovery:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
