"""Checks of ``triosim plan`` that print figures (no timed assertions):

1. speed at 1,024 GPUs: the GPT-3 175B card on the DGX H100 SuperPOD topology, H100 roofline
   times, global batch 1536 — candidates estimated and the wall and CPU time of the estimator,
   then of DAG-timing the best ``--top``;
   with the estimate against the DAG (time and peak memory) on those rows;
2. the ranking at 64 GPUs: the 4-layer GPT sample on an NVLink cluster, global batch 64 — every
   feasible candidate DAG-timed; the plan's best (the best of its top 20 by DAG time) against
   the exhaustive best, which must be within 2 %;
3. ``--cards``: GPT-3 175B and Llama 3 70B on 64 and 256 H100s of the SuperPOD (and the 1,024-GPU
   case with ``--cards 1024``): the plan's best against a DAG timing of every candidate that
   fits — all of them with ``--exhaustive``, else every one whose estimate is within
   ``--within`` (6 %) of the plan's best DAG time: with the estimate within 5 % of the DAG
   (tests/plan/test_estimate_vs_dag.py), no candidate outside that band can beat it.

    python bench/plan_check.py [--skip-1024] [--skip-64] [--jobs 2] [--top 20]
    python bench/plan_check.py --skip-1024 --skip-64 --cards 64,256 [--exhaustive [--sample K] | --within 0.06]
        [--overlaps]

``--overlaps``: the plan's whole search, its overlap variants too, against every candidate with
and without Megatron-Core's data-parallel overlaps (the variants of those with a tight bound:
the overlaps' own bound is what it measures). ``--sample K`` with ``--exhaustive``: every
candidate within ``--within`` of the plan's best and one in K of the rest (by the CRC of its
key: the same ones on every run), the fastest first.

An exhaustive card check takes hours of CPU. ``--journal DIR`` keeps each DAG outcome as it
arrives (one JSON line per candidate, in a file per model, GPU count and batch), so a run that is
stopped goes on where it left off. A line is reused only while the ``triosim/`` package is the
same git tree as when it was written (``--reuse-other-code`` reuses lines of other trees too).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from triosim.cli.console import build_parser  # noqa: E402
from triosim.cli.plan import plan_inputs  # noqa: E402
from triosim.plan.estimate import ROUGH_OVER_BOUND, TIME_OVER_BOUND, estimate  # noqa: E402
from triosim.plan.pipeline_time import PipelineTimer  # noqa: E402
from triosim.plan.report import dag_seconds  # noqa: E402
from triosim.plan.search import Row, dag_check, dag_time, estimate_all, refine_and_time  # noqa: E402
from triosim.sweep.execute import Outcome  # noqa: E402


def _args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["plan", *argv])


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def check_1024(jobs: int, top: int) -> None:
    argv = ["--model", "gpt3-175b", "--gpu", "h100-sxm", "--topology-file",
            str(ROOT / "topologies" / "dgx-h100-superpod.yaml"), "--gpus", "1024", "--global-batch", "1536"]
    print("1,024 GPUs: triosim plan " + " ".join(argv))
    w0, c0 = time.perf_counter(), _cpu()
    inputs = plan_inputs(_args(argv))
    w1, c1 = time.perf_counter(), _cpu()
    rows, _ = estimate_all(inputs.candidates, inputs.profile, inputs.settings, jobs=jobs)
    w2, c2 = time.perf_counter(), _cpu()
    print(f"  load + enumerate: {w1 - w0:.1f} s wall, {c1 - c0:.1f} s CPU")
    print(f"  {len(rows):,} candidates estimated (--jobs {jobs}): {w2 - w1:.1f} s wall, {c2 - c1:.1f} s CPU "
          f"({sum(r.feasible for r in rows):,} fit)")
    w5, c5 = time.perf_counter(), _cpu()
    dag_check(rows, inputs.settings, inputs.base, top, jobs, None, None)
    w3, c3 = time.perf_counter(), _cpu()
    print(f"  {sum(r.dag is not None for r in rows)} of the top {top} DAG-timed (those that could beat the best; "
          f"--jobs {jobs}): {w3 - w5:.1f} s wall, {c3 - c5:.1f} s CPU")
    more, _, _, _ = refine_and_time(rows, inputs.profile, inputs.settings, inputs.base, top, jobs)
    rows += more
    w6, c6 = time.perf_counter(), _cpu()
    print(f"  {len(more):,} refinements and variants (partial recomputation, offload, the overlaps) estimated, {sum(r.dag is not None for r in more)}"
          f" DAG-timed: {w6 - w3:.1f} s wall, {c6 - c3:.1f} s CPU ({sum(r.feasible for r in more):,} fit)")
    best = [r for r in rows if r.dag is not None]
    errors = [r.estimate.time_s / dag_seconds(r) - 1 for r in best if dag_seconds(r)]
    if errors:
        print(f"  estimate vs DAG on the top {len(errors)}: median {statistics.median(errors) * 100:+.1f} %, "
              f"range {min(errors) * 100:+.1f} % .. {max(errors) * 100:+.1f} %")
    _memory_rows(best)
    timed = sorted((r for r in best if dag_seconds(r) and r.reason is None), key=dag_seconds)
    if timed:
        c = timed[0].candidate
        print(f"  best: {c.mesh} micro-batch {c.micro_batch} {c.schedule_label} ZeRO-{c.zero} {c.recompute_label}"
              f"{' SP' if c.sequence_parallel else ''}: DAG {dag_seconds(timed[0]) * 1e3:.2f} ms")
    total_wall = (w2 - w0) + (w6 - w5)
    total_cpu = (c2 - c0) + (c6 - c5)
    print(f"  plan total (load, estimate all, DAG top {len(best)} with the refinements): {total_wall:.1f} s wall, {total_cpu:.1f} s CPU; "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (this process)")


def _memory_rows(rows) -> None:
    """Peak memory per GPU, estimate against DAG, on the DAG-timed rows (fastest first)."""
    timed = sorted((r for r in rows if dag_seconds(r) and r.dag.max_peak_memory_bytes), key=dag_seconds)
    if not timed:
        return
    errors = [r.estimate.peak_bytes / r.dag.max_peak_memory_bytes - 1 for r in timed]
    print(f"  peak memory, estimate vs DAG on the {len(timed)} DAG-timed: median {statistics.median(errors) * 100:+.2f} %, "
          f"range {min(errors) * 100:+.2f} % .. {max(errors) * 100:+.2f} %")
    for r in timed[:5]:
        c = r.candidate
        print(f"    {c.mesh} mb{c.micro_batch} {c.schedule_label} ZeRO-{c.zero} {c.recompute_label}"
              f"{' SP' if c.sequence_parallel else ''}: DAG {dag_seconds(r) * 1e3:,.2f} ms (estimate "
              f"{r.estimate.time_s * 1e3:,.2f}), memory DAG {r.dag.max_peak_memory_bytes / 1e9:.2f} GB, "
              f"estimate {r.estimate.peak_bytes / 1e9:.2f} GB")


def _code_tree() -> str:
    """The git tree of the package: a journal line is valid while it is the same."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD:triosim"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip() + ("+dirty" if _package_dirty() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _package_dirty() -> bool:
    out = subprocess.run(["git", "status", "--porcelain", "--", "triosim"], cwd=ROOT, capture_output=True, text=True)
    return bool(out.stdout.strip())


class Journal:
    """DAG outcomes of one card check, one JSON line each, appended and flushed as they arrive."""

    def __init__(self, path: Path, reuse_other_code: bool) -> None:
        self.path, self.code = path, _code_tree()
        self.known: dict[str, dict] = {}
        other = 0
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short when a run was killed
                if entry.get("code") == self.code or reuse_other_code:
                    self.known[entry["candidate"]] = entry["outcome"]
                else:
                    other += 1
        print(f"  journal {path}: {len(self.known):,} outcomes reused"
              + (f", {other:,} of other package trees ignored" if other else ""))
        path.parent.mkdir(parents=True, exist_ok=True)
        self.out = path.open("a")

    def restore(self, rows: list) -> list:
        """Sets ``dag`` on the rows the journal has; returns the others."""
        left = []
        for r in rows:
            entry = self.known.get(journal_key(r.candidate))
            if entry is None:
                left.append(r)
            else:
                r.dag = Outcome(**entry)
        return left

    def write(self, row) -> None:
        self.out.write(json.dumps({"candidate": journal_key(row.candidate), "code": self.code,
                                   "outcome": dataclasses.asdict(row.dag)}) + "\n")
        self.out.flush()


def journal_key(c) -> str:
    """A candidate's key in the journal: its repr, without the fields added after the journals
    began where they have their defaults."""
    return repr(c).replace(", fp8_recipe=None", "").replace(", overlaps=False", "")


def overlap_rows(rows: list, inputs) -> list:
    """Every feasible candidate with data ranks and a tight bound (TIME_OVER_BOUND: the overlaps'
    own bound is what is measured; the others are roughly bounded with or without them) again
    with Megatron-Core's data-parallel overlaps (``Candidate.overlaps``), estimated: the
    exhaustive set of ``--overlaps``."""
    timer = PipelineTimer(inputs.profile.platform)
    out = []
    for r in rows:
        if r.feasible and r.candidate.data > 1 and not r.candidate.overlaps \
                and r.estimate.over_bound == TIME_OVER_BOUND:
            row = Row(dataclasses.replace(r.candidate, overlaps=True))
            row.estimate = estimate(row.candidate, inputs.profile, inputs.settings, timer)
            out.append(row)
    return out


def check_card(model: str, gpus: int, global_batch: int, jobs: int, top: int, exhaustive: bool, within: float,
               journal_dir: Path | None = None, reuse_other_code: bool = False, overlaps: bool = False,
               sample: int = 1) -> None:
    """The plan's best against the DAG's best over every candidate that fits (or those within
    ``within`` of the plan's best by estimate; with ``sample`` K > 1, one in K of the others); with ``overlaps``, the plan's whole search (its
    overlap variants too) against every candidate with and without the data-parallel overlaps."""
    argv = ["--model", model, "--gpu", "h100-sxm", "--topology-file", str(ROOT / "topologies" / "dgx-h100-superpod.yaml"),
            "--gpus", str(gpus), "--global-batch", str(global_batch)]
    print(f"{model} on {gpus:,} GPUs, global batch {global_batch:,}:")
    w0, c0 = time.perf_counter(), _cpu()
    inputs = plan_inputs(_args(argv))
    rows, _ = estimate_all(inputs.candidates, inputs.profile, inputs.settings, jobs=jobs)
    dag_check(rows, inputs.settings, inputs.base, top, jobs, None, None)
    if overlaps:
        more, *_ = refine_and_time(rows, inputs.profile, inputs.settings, inputs.base, top, jobs)
        rows = rows + more
    best = [r for r in rows if r.dag is not None]
    w1, c1 = time.perf_counter(), _cpu()
    timed = [r for r in best if dag_seconds(r) and r.reason is None]
    plans = min(timed, key=dag_seconds)
    print(f"  plan: {len(rows):,} candidates, {sum(r.feasible for r in rows):,} fit; best of {len(best)} DAG-timed: "
          f"{_label(plans)} {dag_seconds(plans) * 1e3:,.2f} ms ({w1 - w0:.0f} s wall, {c1 - c0:.0f} s CPU)")
    done = {id(r) for r in best}
    bound = dag_seconds(plans) * (1 + within)
    known = {repr(r.candidate) for r in rows}
    pool = rows + ([r for r in overlap_rows(rows, inputs) if repr(r.candidate) not in known] if overlaps else [])
    rest = [r for r in pool if r.feasible and id(r) not in done and (exhaustive or r.estimate.time_s <= bound)]
    if sample > 1:  # every one within the band, and one in ``sample`` of the others by their key's
        # CRC (the same ones whatever else the pool holds, so a journal's picks are picked again)
        rest = [r for r in rest if r.estimate.time_s <= bound
                or zlib.crc32(journal_key(r.candidate).encode()) % sample == 0]
    rest.sort(key=lambda r: r.estimate.time_s)  # the fastest first: a stopped run has checked those
    if journal_dir is None:
        dag_time(rest, inputs.base, global_batch, jobs)
    else:
        journal = Journal(journal_dir / f"{model}-{gpus}-gpus-batch-{global_batch}.jsonl", reuse_other_code)
        left = journal.restore(rest)
        print(f"  {len(rest) - len(left):,} of {len(rest):,} from the journal, {len(left):,} to DAG-time")
        dag_time(left, inputs.base, global_batch, jobs, on_row=journal.write)
    w2, c2 = time.perf_counter(), _cpu()
    all_timed = [r for r in [*best, *rest] if dag_seconds(r) and r.reason is None]
    top_row = min(all_timed, key=dag_seconds)
    scope = "every candidate that fits" if exhaustive else f"every one that fits estimated within {within:.0%} of it"
    if sample > 1:
        scope += f" (beyond {within:.0%} of it, every {sample}th)"
    gap = dag_seconds(plans) / dag_seconds(top_row) - 1
    print(f"  DAG over {scope}: {len(rest) + len(best):,} timed ({w2 - w1:.0f} s wall, {c2 - c1:.0f} s CPU); best "
          f"{_label(top_row)} {dag_seconds(top_row) * 1e3:,.2f} ms; the plan's best is {gap * 100:.2f} % slower")
    errors = [abs(r.estimate.time_s / dag_seconds(r) - 1) for r in all_timed]
    over, rough = (max((r.estimate.time_s / dag_seconds(r) - 1 for r in all_timed if r.estimate.over_bound == bound),
                       default=float("nan")) for bound in (TIME_OVER_BOUND, ROUGH_OVER_BOUND))
    if overlaps:
        for kind, rough_too in (("ZeRO 0-2 without cp", False), ("ZeRO-3 or cp", True)):
            errs = [r.estimate.time_s / dag_seconds(r) - 1 for r in all_timed if r.candidate.overlaps
                    and (r.candidate.zero == 3 or r.candidate.cp > 1) == rough_too]
            print(f"  estimate / DAG - 1 of the {len(errs):,} with the overlaps, {kind}: "
                  f"{min(errs, default=float('nan')) * 100:+.2f} … {max(errs, default=float('nan')) * 100:+.2f} %")
    mem = [abs(r.estimate.peak_bytes / r.dag.max_peak_memory_bytes - 1) for r in all_timed if r.dag.max_peak_memory_bytes]
    print(f"  |estimate / DAG - 1| over those: time max {max(errors) * 100:.1f} % (median "
          f"{statistics.median(errors) * 100:.1f} %), peak memory max {max(mem) * 100:.2f} %; "
          f"bounded estimates at most {over * 100:+.2f} % of the DAG (TIME_OVER_BOUND {TIME_OVER_BOUND:.0%}), "
          f"roughly bounded ones at most {rough * 100:+.2f} % (ROUGH_OVER_BOUND {ROUGH_OVER_BOUND:.0%})")


def _label(r) -> str:
    c = r.candidate
    return (f"{c.mesh} mb{c.micro_batch} {c.schedule_label} ZeRO-{c.zero} {c.recompute_label}"
            f"{' SP' if c.sequence_parallel else ''}")


def check_64(jobs: int, top: int) -> None:
    argv = ["--trace-dir", str(ROOT / "sample_trace" / "gpt-cpu-bs8"), "--topology", "nvlink-cluster", "--gpus", "64",
            "--global-batch", "64"]
    print("64 GPUs, exhaustive: triosim plan " + " ".join(argv[2:]))
    inputs = plan_inputs(_args(argv))
    rows, _ = estimate_all(inputs.candidates, inputs.profile, inputs.settings)
    feasible = [r for r in rows if r.feasible]
    w0 = time.perf_counter()
    dag_time(feasible, inputs.base, inputs.space.global_batch, jobs)
    print(f"  {len(rows)} candidates, {len(feasible)} feasible, all DAG-timed in {time.perf_counter() - w0:.0f} s wall")
    timed = [r for r in feasible if dag_seconds(r)]
    exhaustive = min(timed, key=dag_seconds)
    plan_top = sorted(feasible, key=lambda r: r.estimate.time_s)[:top]
    plans_best = min((r for r in plan_top if dag_seconds(r)), key=dag_seconds)
    gap = dag_seconds(plans_best) / dag_seconds(exhaustive) - 1
    errors = sorted(abs(r.estimate.time_s / dag_seconds(r) - 1) for r in timed)
    by_estimate = sorted(feasible, key=lambda r: r.estimate.time_s)
    where = by_estimate.index(exhaustive) + 1
    for label, r in (("exhaustive best", exhaustive), (f"plan's best (of its top {top})", plans_best)):
        c = r.candidate
        print(f"  {label}: {c.mesh} micro-batch {c.micro_batch} {c.schedule_label} ZeRO-{c.zero}"
              f"{' SP' if c.sequence_parallel else ''}: DAG {dag_seconds(r) * 1e3:.3f} ms, "
              f"estimate {r.estimate.time_s * 1e3:.3f} ms")
    print(f"  plan's best is {gap * 100:.2f} % slower than the exhaustive best (target <= 2 %): "
          f"{'PASS' if gap <= 0.02 else 'FAIL'}")
    print(f"  the exhaustive best is #{where} by estimate; |estimate / DAG - 1| over {len(errors)} candidates: "
          f"median {statistics.median(errors) * 100:.2f} %, 90th percentile "
          f"{errors[int(0.9 * (len(errors) - 1))] * 100:.2f} %, max {errors[-1] * 100:.2f} %")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip-1024", action="store_true")
    p.add_argument("--skip-64", action="store_true")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--cards", default="", help="GPU counts of the model-card checks: 64, 256 and/or 1024")
    p.add_argument("--models", default="gpt3-175b,llama3-70b")
    p.add_argument("--exhaustive", action="store_true", help="DAG-time every candidate that fits")
    p.add_argument("--within", type=float, default=0.06)
    p.add_argument("--journal", type=Path, default=None,
                   help="a folder keeping each card check's DAG outcomes, so a stopped run goes on where it left off")
    p.add_argument("--sample", type=int, default=1, metavar="K",
                   help="with --exhaustive, every candidate within --within of the plan's best and one in K of the rest (by the CRC of its key)")
    p.add_argument("--overlaps", action="store_true",
                   help="the card checks with the plan's overlap variants, and every candidate also with the overlaps")
    p.add_argument("--reuse-other-code", action="store_true",
                   help="reuse journal lines written by another tree of the triosim package")
    a = p.parse_args()
    if not a.skip_1024:
        check_1024(a.jobs, a.top)
    if not a.skip_64:
        check_64(a.jobs, a.top)
    batch = {64: 256, 256: 512, 1024: 1536}
    for gpus in [int(g) for g in a.cards.split(",") if g]:
        for model in a.models.split(","):
            check_card(model, gpus, batch[gpus], a.jobs, a.top, a.exhaustive, a.within, a.journal,
                       a.reuse_other_code, a.overlaps, a.sample)
    return 0


if __name__ == "__main__":
    sys.exit(main())
