"""Mutation check: plant each of three known bugs in a copy of the source and run its test.

    python bench/mutation_check.py          # every mutation; exit 1 if a test misses its bug

The three bugs once went unnoticed by the whole suite:

1. the memory planner's re-fetch does not wait for the write-back of its own buffer;
2. a DDP bucket closes at ``>`` its size instead of ``>=``;
3. pipeline parameters (batch-invariant buffers) scaled by the micro-batch fraction.

For each, the source file is copied into a scratch directory with one line changed, and the
matching property test of ``tests/test_mutations.py`` runs against that copy: it must fail.
The failure's summary lines are printed. (The suite itself checks the same with planted bugs
patched in at run time; this script shows the tests failing on the changed source.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    before: str
    after: str
    test: str


MUTATIONS = (
    # The fetch keeps the other buffers' write-backs it waits for, but not its own (the
    # explicit dependency and the one among the write-backs that made room at its start).
    Mutation("re-fetch without waiting for its own write-back", "triosim/graph/memory/plan.py",
             "            after.extend(writebacks_at.get(b, ()))\n            if wb_own is not None:\n"
             "                after.append(wb_own)\n",
             "            after.extend(w for w in writebacks_at.get(b, ()) if w != wb_own)\n",
             "tests/test_mutations.py::test_refetch_waits_for_its_own_writeback"),
    Mutation("DDP bucket closing at > instead of >=", "triosim/graph/data/data_parallel.py",
             "        if size >= bucket_bytes:", "        if size > bucket_bytes:",
             "tests/test_mutations.py::test_ddp_bucket_closes_when_it_reaches_its_size"),
    # Every buffer of a stage that is not per micro-batch (parameters, gradients, optimizer
    # state: keys without the "mb<r>:" prefix) sized at the micro-batch fraction.
    Mutation("pipeline parameters scaled by the micro-batch fraction", "triosim/graph/pipeline/builder.py",
             "    return plan_memory(graph, platform, plan.gpus[rank], steps, sizes,",
             "    sizes = {k: v if k.startswith('mb') else int(round(v * fractions[0])) for k, v in sizes.items()}\n"
             "    return plan_memory(graph, platform, plan.gpus[rank], steps, sizes,",
             "tests/test_mutations.py::test_pipeline_parameters_are_not_scaled_by_the_micro_batch"),
)


def run(mutation: Mutation, scratch: Path) -> bool:
    """True when the test fails on the mutated copy (the bug is caught)."""
    copy = scratch / mutation.name.replace(" ", "-").replace(">", "gt")
    for part in ("triosim", "tests", "sample_trace"):
        shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.cfg", "ruff.toml"):
        if (REPO / name).is_file():
            shutil.copy(REPO / name, copy / name)
    if (REPO / "tracer").is_dir():
        shutil.copytree(REPO / "tracer", copy / "tracer", ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / mutation.file
    text = target.read_text()
    if text.count(mutation.before) != 1:
        print(f"  the source no longer has the line to change in {mutation.file}: update this script")
        return False
    target.write_text(text.replace(mutation.before, mutation.after))
    env = {**os.environ, "PYTHONPATH": str(copy)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", mutation.test],
                          cwd=copy, env=env, capture_output=True, text=True)
    lines = proc.stdout.splitlines()
    shown = [ln for ln in lines if ln.startswith(("E ", "FAILED", "Falsifying")) or " failed" in ln or " passed" in ln]
    for ln in shown[:8]:
        print(f"  {ln[:160]}")
    return proc.returncode != 0


def main() -> int:
    missed = 0
    with tempfile.TemporaryDirectory(prefix="triosim-mutants-") as tmp:
        for i, m in enumerate(MUTATIONS, 1):
            print(f"{i}. {m.name} ({m.file}); {m.test}")
            caught = run(m, Path(tmp))
            print(f"  -> {'caught: the test fails on the bug' if caught else 'MISSED: the test passes on the bug'}")
            missed += not caught
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
