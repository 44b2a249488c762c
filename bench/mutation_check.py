"""Mutation check: plant each of ten known bugs in a copy of the source and run its test.

    python bench/mutation_check.py          # every mutation; exit 1 if a test misses its bug

The bugs once went unnoticed by the whole suite (4-8 and 10 are issue 24's six):

1. the memory planner's re-fetch does not wait for the write-back of its own buffer;
2. a DDP bucket closes at ``>`` its size instead of ``>=``;
3. pipeline parameters (batch-invariant buffers) scaled by the micro-batch fraction;
4. the flow network freezing flows at a link residual of 1e-3 instead of 1e-12;
5. a transfer's solo rate from its route's widest link instead of its bottleneck;
6. replica symmetry without the DP-group check;
7. the fitted op-time model's kernel floor 10x too small;
8. the checker's count limit ``>=`` written as ``>``;
9. the pyarrow reader's time limit ``<`` written as ``<=``;
10. megatron's collectives sorted by op only (the order of the two on one op lost).

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
    Mutation("pipeline parameters scaled by the micro-batch fraction", "triosim/graph/composition_state.py",
             "        if buffer not in self.trace.batch_invariant:\n            t = int(round(t * fraction))\n",
             "        t = int(round(t * (fraction if buffer not in self.trace.batch_invariant else self.fractions[0])))\n",
             "tests/test_mutations.py::test_pipeline_parameters_are_not_scaled_by_the_micro_batch"),
    # Issue 24: six planted bugs the suite missed (tests/test_planted_bugs.py; the sixth,
    # megatron's collectives sorted by op only, is the last below).
    Mutation("flows frozen at a residual of 1e-3", "triosim/hardware/flow_network.py",
             "if d > 0 and residual[r] <= 1e-12:", "if d > 0 and residual[r] <= 1e-3:",
             "tests/test_planted_bugs.py::test_a_link_with_a_little_capacity_left_is_not_full"),
    Mutation("solo rate from the widest link", "triosim/schedule/flows.py",
             "    bw = min(bandwidth[r] for r in rids)", "    bw = max(bandwidth[r] for r in rids)",
             "tests/test_planted_bugs.py::test_a_transfer_alone_runs_at_its_bottleneck"),
    Mutation("replica symmetry without the DP-group check", "triosim/graph/replica_symmetry.py",
             "    return _alike(pipelines) and _alike(tp_groups) and _alike(dp_groups)",
             "    return _alike(pipelines) and _alike(tp_groups)",
             "tests/test_planted_bugs.py::test_replicas_with_unalike_dp_groups_are_not_alike"),
    Mutation("fitted model's kernel floor 10x too small", "triosim/compute/op_time.py",
             "_floors(measured, floor_us * 1e-6)", "_floors(measured, floor_us * 1e-7)",
             "tests/test_planted_bugs.py::test_fitted_model_floor_is_the_kernel_floor"),
    Mutation("count limit >= written as >", "triosim/checks.py",
             "    if value >= maximum:\n        raise TraceError(file, f\"too large: {text}",
             "    if value > maximum:\n        raise TraceError(file, f\"too large: {text}",
             "tests/test_planted_bugs.py::test_an_operator_id_at_the_count_limit_is_refused"),
    Mutation("pyarrow reader's time limit < written as <=", "triosim/trace/arrow_reader.py",
             "values.max() < MAX_TIME_US", "values.max() <= MAX_TIME_US",
             "tests/test_planted_bugs.py::test_an_op_time_at_the_time_limit_is_refused"),
    # No shipped trace has two collectives on one op; blocks back to back under sequence
    # parallelism do (a reduce-scatter, then the next block's all-gather of its result).
    Mutation("megatron's collectives sorted by op only", "triosim/graph/tensor/megatron.py",
             "    colls.sort(key=lambda c: (c[0], -c[1]))", "    colls.sort(key=lambda c: c[0])",
             "tests/graph/test_megatron_chained.py::test_reduce_scatter_before_the_all_gather_of_its_result"),
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
    print(f"{len(MUTATIONS) - missed}/{len(MUTATIONS)} planted bugs caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
