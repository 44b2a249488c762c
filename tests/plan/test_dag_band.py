"""The plan DAG-times only what could beat its best: after the fastest estimates' DAG times, a
candidate whose estimate cuts the stages as the DAG does (``bounded``) is timed only when its
estimate is within TIME_OVER_BOUND of the best DAG time, one only roughly bounded (ZeRO-3, context
parallelism, whole tensors sent beside TP collectives) within ROUGH_OVER_BOUND; the others still
are (no bound on them)."""

from __future__ import annotations

import importlib
import math

import pytest

from triosim.plan import Candidate
from triosim.plan.estimate import (
    OVERLAP_OVER_BOUND,
    ROUGH_OVER_BOUND,
    TIME_OVER_BOUND,
    Estimate,
    PlanSettings,
)
from triosim.plan.search import Row, dag_band, dag_check
from triosim.sweep.execute import OK, Outcome

search_module = importlib.import_module("triosim.plan.search")


def _row(k: int, ms: float, bounded: bool = True, fits: bool = True, peak: int = 10,
         over: float | None = None) -> Row:
    c = Candidate(1, 1, k + 1, 1)
    return Row(c, Estimate(c, ms / 1e3, ms / 1e3, 0.0, 0.0, 0.0, 0.0, peak, fits,
                           None if fits else "memory", bounded, over))


@pytest.fixture
def timed_in_rounds(monkeypatch) -> list[list[float]]:
    """Each dag_time call's estimates (ms); the DAG time is the estimate less 0.1 %."""
    rounds: list[list[float]] = []

    def fake(rows, base, global_batch, jobs=1, progress=None, dask=None) -> bool:
        rounds.append([round(r.estimate.time_s * 1e3, 6) for r in rows])
        for k, r in enumerate(rows):
            r.dag = Outcome(k, OK, makespan_ms=r.estimate.time_s * 1e3 * 0.999, max_peak_memory_bytes=10, fits=True)
        return False

    monkeypatch.setattr(search_module, "dag_time", fake)
    return rounds


def test_only_what_could_beat_the_best_is_timed(timed_in_rounds) -> None:
    best = 100.0 * 0.999  # the DAG time of the fastest estimate
    inside = best * (1 + TIME_OVER_BOUND) * 0.9999
    outside = best * (1 + TIME_OVER_BOUND) * 1.0001
    rows = [_row(0, 100.0), _row(1, 100.0), _row(2, inside), _row(3, outside), _row(4, 130.0),
            _row(5, 140.0, bounded=False), _row(6, 150.0, bounded=False)]
    assert not dag_check(rows, PlanSettings(16, None), {}, top=6, jobs=2, progress=None, dask=None)
    assert timed_in_rounds == [[100.0], [100.0, round(inside, 6), 140.0]]  # the 7th is past --top 6


def test_without_a_bound_the_top_are_all_timed_at_once(timed_in_rounds) -> None:
    rows = [_row(k, 100.0 + 10 * k, bounded=False) for k in range(5)]
    dag_check(rows, PlanSettings(16, None), {}, top=4, jobs=2, progress=None, dask=None)
    assert timed_in_rounds == [[100.0, 110.0, 120.0, 130.0]]


def test_near_the_memory_limit_is_in_the_band_too(timed_in_rounds) -> None:
    cap = 1000
    rows = [_row(0, 100.0), _row(1, 100.5, fits=False, peak=1010), _row(2, 100.7, fits=False, peak=2000),
            _row(3, 120.0), _row(4, 120.5, fits=False, peak=1010)]
    dag_check(rows, PlanSettings(16, cap), {}, top=2, jobs=1, progress=None, dask=None)
    assert timed_in_rounds == [[100.0], [100.5]]


def test_the_band_keeps_unbounded_rows() -> None:
    rows = [_row(0, 100.0), _row(1, 200.0), _row(2, 300.0, bounded=False)]
    assert [r.estimate.time_s for r in dag_band(rows, 0.1)] == [0.1, 0.3]


def test_roughly_bounded_rows_are_timed_within_their_bound(timed_in_rounds) -> None:
    best = 100.0 * 0.999
    rough_in = best * (1 + ROUGH_OVER_BOUND) * 0.9999
    rough_out = best * (1 + ROUGH_OVER_BOUND) * 1.0001
    rows = [_row(0, 100.0), _row(1, 102.0), _row(2, rough_in, bounded=False, over=ROUGH_OVER_BOUND),
            _row(3, rough_out, bounded=False, over=ROUGH_OVER_BOUND), _row(4, 300.0, bounded=False)]
    dag_check(rows, PlanSettings(16, None), {}, top=5, jobs=1, progress=None, dask=None)
    assert timed_in_rounds == [[100.0], [round(rough_in, 6), 300.0]]


def test_bounded_only_on_a_model_card_below_zero_3() -> None:
    from pathlib import Path

    from triosim.cli.console import build_parser
    from triosim.cli.plan import plan_inputs
    from triosim.plan import PipelineTimer, estimate

    gpt = Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-cpu-bs8"
    for argv, card in ((["--model", "llama3-8b", "--num-layers", "4", "--seq-len", "512", "--gpu", "h100-sxm"], True),
                       (["--trace-dir", str(gpt)], False)):
        i = plan_inputs(build_parser().parse_args(["plan", *argv, "--topology", "nvlink-cluster", "--gpus", "8",
                                                   "--global-batch", "16"]))
        timer = PipelineTimer(i.profile.platform)
        # the interleaved schedule's whole-tensor sends beside the TP collectives (TP without
        # sequence parallelism, one node) are approximated: roughly bounded, as ZeRO-3 is
        whole_sends = Candidate(2, 2, 2, 1, "interleaved", 2, 1)
        for c, tight in ((Candidate(1, 1, 8, 1), True), (Candidate(2, 2, 2, 1, "interleaved", 2, 1, "none", True), True),
                         (whole_sends, False), (Candidate(1, 2, 4, 1, zero=3), False)):
            e = estimate(c, i.profile, i.settings, timer)
            want = (TIME_OVER_BOUND if tight else ROUGH_OVER_BOUND) if card else math.inf
            assert (e.bounded, e.over_bound) == (card and tight, want), (argv[1], c)


def test_the_data_parallel_overlaps_have_their_own_bound() -> None:
    """With --overlap-grad-reduce (and --overlap-param-gather) the estimate follows the buckets
    beside the compute without its SM and link sharing: a candidate with data ranks has
    OVERLAP_OVER_BOUND, one without them keeps the tight bound, ZeRO-3 the rough one."""
    from triosim.cli.console import build_parser
    from triosim.cli.plan import plan_inputs
    from triosim.plan import PipelineTimer, estimate

    argv = ["plan", "--model", "llama3-8b", "--num-layers", "4", "--seq-len", "512", "--gpu", "h100-sxm",
            "--topology", "nvlink-cluster", "--gpus", "8", "--global-batch", "16"]
    for flags, want in (([], TIME_OVER_BOUND), (["--overlap-grad-reduce"], OVERLAP_OVER_BOUND),
                        (["--overlap-grad-reduce", "--overlap-param-gather"], OVERLAP_OVER_BOUND)):
        i = plan_inputs(build_parser().parse_args([*argv, *flags]))
        timer = PipelineTimer(i.profile.platform)
        assert estimate(Candidate(1, 1, 8, 1, zero=1), i.profile, i.settings, timer).over_bound == want, flags
        assert estimate(Candidate(1, 1, 8, 1, zero=3), i.profile, i.settings, timer).over_bound == ROUGH_OVER_BOUND
        assert estimate(Candidate(2, 4, 1, 1, sequence_parallel=True), i.profile, i.settings,
                        timer).over_bound == TIME_OVER_BOUND  # no data ranks
        alone = Candidate(8, 1, 1, 1, recompute="none", sequence_parallel=True)  # no data ranks: nothing to overlap
        assert estimate(alone, i.profile, i.settings, timer).over_bound == TIME_OVER_BOUND, flags
