"""The planner's shortcuts give the very numbers of the long way: batched collective costs equal
the one-at-a-time closed forms, the per-rank DDP buckets equal ``make_buckets``, the DP sync is
worked out once for ZeRO-1/2/3, estimates on forked workers equal one process's; and the DAG
timing on a process pool (the default, one worker per CPU) ranks as in-process; both keep what
they did when interrupted."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from triosim.cli.console import build_parser
from triosim.cli.plan import plan_inputs
from triosim.config import configure
from triosim.config.build import load_recorded_trace
from triosim.graph.data.data_parallel import make_buckets
from triosim.plan import Candidate, ModelProfile, PipelineTimer, PlanSettings, estimate
from triosim.plan.search import search

estimate_module = importlib.import_module("triosim.plan.estimate")
search_module = importlib.import_module("triosim.plan.search")
ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "sample_trace" / "gpt-cpu-bs8"


@pytest.fixture(scope="module")
def gpt_profile() -> ModelProfile:
    _, platform, _ = configure(trace_dir=str(GPT), num_layers=4, dp=32, topology="nvlink-cluster")
    return ModelProfile(load_recorded_trace(GPT, 8, "nooverlap", 4, "linear-floor", 2.0), platform)


@pytest.mark.parametrize("group", [tuple(range(0, 32, 2)), tuple(range(8)), (0, 1)], ids=["16", "8", "2"])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_collective_many_equals_one_at_a_time(gpt_profile: ModelProfile, group, op: str) -> None:
    rng = np.random.default_rng(7)
    sizes = np.concatenate(([0, 1, 2, 3, 1 << 20, (1 << 20) + 1, (1 << 21) - 1, 26_214_400],
                            rng.integers(1, 1 << 31, 40)))
    many = gpt_profile.collective_many(op, group, sizes)
    one = [gpt_profile.collective_s(op, group, int(n)) for n in sizes]
    assert many.tolist() == one  # the same floats, not merely close


@pytest.mark.parametrize("bucket_bytes", [1.0, 40_000.5, 25 * 2**20, None])
def test_rank_buckets_pack_as_make_buckets(gpt_profile: ModelProfile, bucket_bytes: float | None) -> None:
    batch, tp = 4, 2
    trace = gpt_profile.scaled(batch)
    shard = gpt_profile.tensor_plan(batch, tp, False).shard_divisor
    if bucket_bytes is None:  # two gradients' bytes: a bucket that closes at exactly its size
        first, second = gpt_profile.gradient_order[:2]
        bucket_bytes = float(sum(-(-trace.tensors[p].bytes // shard.get(p, 1)) for p in (first, second)))
    n = gpt_profile.positions
    for owned in (np.ones(n, dtype=bool), np.arange(n) < n // 2, np.arange(n) % 3 == 1):
        sizes, ready = gpt_profile.rank_buckets(batch, tp, False, owned, bucket_bytes)
        params = [p for p in gpt_profile.gradient_order if owned[gpt_profile.first_reader.get(p, 0)]]
        want = make_buckets(trace, bucket_bytes, params, lambda p: -(-trace.tensors[p].bytes // shard.get(p, 1)))
        assert sizes.tolist() == [b.nbytes for b in want]
        assert ready.tolist() == [b.ready_op for b in want]


def test_dp_sync_once_for_zero_1_2_3(gpt_profile: ModelProfile, monkeypatch) -> None:
    """ZeRO-1 and 2 reduce-scatter the same buckets after the same pipeline: one DP-sync pass
    serves both; ZeRO-3's gathers lengthen its blocks, so it has a pass of its own (on the same
    buckets and costs, found once)."""
    calls = []
    real = estimate_module._dp_synced_all
    monkeypatch.setattr(estimate_module, "_dp_synced_all", lambda *a: calls.append(a[1]) or real(*a))
    timer, settings = PipelineTimer(gpt_profile.platform), PlanSettings(16, None, bucket_bytes=2**20)
    times = [estimate(Candidate(tp=2, pp=2, dp=4, micro_batch=1, zero=z), gpt_profile, settings, timer).time_s
             for z in (0, 1, 2, 3)]
    assert calls == ["all_reduce", "reduce_scatter", "reduce_scatter"]
    fresh = [estimate(Candidate(tp=2, pp=2, dp=4, micro_batch=1, zero=z), gpt_profile, settings,
                      PipelineTimer(gpt_profile.platform)).time_s for z in (0, 1, 2, 3)]
    assert times == fresh


def _inputs():
    args = build_parser().parse_args(["plan", "--trace-dir", str(GPT), "--topology", "switch", "--gpus", "8",
                                      "--global-batch", "16"])
    return plan_inputs(args)


def _search(jobs: int, progress=None):
    i = _inputs()
    return search(i.candidates, i.profile, i.settings, i.base, top=4, jobs=jobs, progress=progress)


def test_pool_ranks_as_in_process() -> None:
    one, pool = _search(1), _search(2)
    assert not one.interrupted and not pool.interrupted
    assert [(r.candidate, r.dag) for r in one.ranked] == [(r.candidate, r.dag) for r in pool.ranked]
    timed = [r for r in pool.rows if r.dag is not None]
    # at most the 4 best estimates, then at most 4 of the refinements and overlap variants
    assert 1 <= len(timed) <= 8 and [r.candidate for r in timed] == [r.candidate for r in one.rows if r.dag is not None]


def test_ctrl_c_in_the_pool_keeps_what_was_timed() -> None:
    def stop_after_two(phase: str, done: int, total: int) -> None:
        if phase == "DAG-timing" and done == 2:
            raise KeyboardInterrupt

    out = _search(2, stop_after_two)
    assert out.interrupted
    timed = [r for r in out.rows if r.dag is not None]
    assert len(timed) == 2 and all(r.dag.makespan_ms for r in timed)
    assert all(r.estimate is not None for r in out.rows)


def test_jobs_default_is_the_cpu_count(tmp_path: Path, monkeypatch) -> None:
    from triosim.cli.console import main

    plan_pkg = importlib.import_module("triosim.plan")
    seen = []
    real = plan_pkg.search
    monkeypatch.setattr("triosim.sweep.execute.default_jobs", lambda: 3)
    monkeypatch.setattr(plan_pkg, "search", lambda *a, **k: seen.append(a[5]) or real(*a, **k))
    for extra in ([], ["--jobs", "1"]):
        code = main(["plan", "-trace-dir", str(GPT), "--gpus", "2", "--global-batch", "4", "--top", "0", "-q", *extra])
        assert code == 0
    assert seen == [3, 1]


def test_one_timer_keeps_the_recompute_modes_apart(gpt_profile: ModelProfile) -> None:
    """The re-runs shift the backward ops' indices: a bucket's ready op found on one mode's trace
    must not be looked up on another's (one timer serves every candidate of a plan)."""
    settings = PlanSettings(16, None, bucket_bytes=2**20)
    shared = PipelineTimer(gpt_profile.platform)
    for rc in ("none", "selective", "full"):
        c = Candidate(tp=1, pp=1, dp=4, micro_batch=1, recompute=rc)
        assert estimate(c, gpt_profile, settings, shared) == \
            estimate(c, gpt_profile, settings, PipelineTimer(gpt_profile.platform))


def test_forked_estimates_equal_one_process(monkeypatch) -> None:
    """Groups by dp on forked workers: the same rows, in enumeration order, as one process."""
    monkeypatch.setattr(search_module, "FORK_MIN", 0)
    # a pool thread an earlier test left winding down must not send this one down the one-process path
    monkeypatch.setattr(search_module, "can_fork", lambda: True)
    forks = []
    real = search_module.estimate_forked
    monkeypatch.setattr(search_module, "estimate_forked", lambda *a: forks.append(1) or real(*a))
    i = _inputs()
    assert len({c.dp for c in i.candidates}) > 2
    one, _ = search_module.estimate_all(i.candidates, i.profile, i.settings)
    assert not forks
    forked, interrupted = search_module.estimate_all(i.candidates, _inputs().profile, i.settings, jobs=2)
    assert not interrupted and forks == [1]
    assert [(r.candidate, r.estimate, r.error) for r in forked] == [(r.candidate, r.estimate, r.error) for r in one]


def test_ctrl_c_while_forked_keeps_the_groups_done(monkeypatch) -> None:
    monkeypatch.setattr(search_module, "FORK_MIN", 0)
    monkeypatch.setattr(search_module, "can_fork", lambda: True)
    i = _inputs()

    def stop_after_first_group(phase: str, done: int, total: int) -> None:
        raise KeyboardInterrupt

    rows, interrupted = search_module.estimate_all(i.candidates, i.profile, i.settings, stop_after_first_group, 2)
    assert interrupted
    dps = {r.candidate.dp for r in rows}
    assert len(dps) == 1 and len(rows) == sum(1 for c in i.candidates if c.dp in dps)
    assert all(r.estimate is not None or r.error for r in rows)
    assert [r.candidate for r in rows] == [c for c in i.candidates if c.dp in dps]  # enumeration order


def test_progress_bar_starts_no_thread(monkeypatch) -> None:
    """In a terminal the progress bar is drawn on updates: a refresh thread would stop the plan
    from forking its estimate workers (it estimates in one process then)."""
    import sys
    import threading

    from triosim.cli import plan as plan_cli

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    prog, update = plan_cli._progress(False)
    assert prog is not None
    before = set(threading.enumerate())  # threads an earlier test's pool left may end meanwhile
    with prog:
        update("estimating", 1, 10)
        assert not set(threading.enumerate()) - before
