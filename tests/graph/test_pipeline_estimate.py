"""The planner's fast paths against their reference definitions: the batched block-level estimate
(``pipeline_estimate``) equals ``estimate_partition`` bit for bit, and the all-bounds cut
programme (``pipeline_cuts``) equals the one-bound ``_min_cut_starts``, ties included; each
property is shown to catch a planted bug."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triosim.graph.pipeline.cuts as pc
import triosim.graph.pipeline.estimate as pe
import triosim.graph.pipeline.partition as part
import triosim.graph.pipeline.recurrence as rec
import triosim.graph.pipeline.schedules as sch
import triosim.graph.pipeline.stage_costs as sc
import triosim.graph.pipeline.stages as ps
from triosim import build_platform, load_trace
from triosim.graph.strategy import Strategy

from .test_pipeline_planner import synthetic

GPT = Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-cpu-bs8"


def planner_costs(trace, sizes) -> tuple[sc.StageCosts, int]:
    phase = ps.op_phases(trace)
    fops = [i for i, p in enumerate(phase) if p == ps.FORWARD]
    return sc.stage_costs(trace, phase, fops, ps._positions(trace, phase, fops), sizes), len(fops)


def random_starts(rng: random.Random, nf: int, n: int) -> tuple[int, ...]:
    return (0, *sorted(rng.sample(range(1, nf), n - 1)))


def check_batch_matches_reference(trace, platform, schedule: str, gpus: tuple[int, ...], virtual: int,
                                  sizes: tuple[int, ...], seed: int, count: int = 6) -> None:
    costs, nf = planner_costs(trace, sizes)
    layout = sch.Layout(gpus, virtual)
    n = layout.num_stages
    rng = random.Random(seed)
    partitions = [tuple(part.count_starts(nf, n))] + [random_starts(rng, nf, n) for _ in range(count)]
    fast = part.estimate_many(partitions, pe.BatchEstimator(costs, platform, schedule, layout))
    for p, got in zip(partitions, fast):
        ref = rec.estimate_partition(p, costs, platform, schedule, layout)
        assert (got.seconds, got.max_stage_s, got.crossing_bytes) == (ref.seconds, ref.max_stage_s,
                                                                      ref.crossing_bytes), \
            f"batched estimate differs for starts {p}: {got} != {ref}"


@pytest.mark.parametrize("schedule,gpus,virtual,sizes", [
    ("1f1b", (0, 8, 9, 17), 1, (2, 2, 2, 2)),  # across NVSwitch nodes: two kinds of route
    ("gpipe", (3, 1, 2), 1, (3, 3, 2)),  # uneven micro-batches
    ("interleaved", (0, 9), 2, (2, 2, 2, 2)),  # a route carries forward and backward boundaries
])
def test_batched_estimate_equals_reference_on_the_gpt_sample(schedule, gpus, virtual, sizes):
    trace = load_trace(GPT)
    platform = build_platform(24, topology="nvlink-cluster", ptp_bandwidth_gbps=5.0)
    check_batch_matches_reference(trace, platform, schedule, gpus, virtual, sizes, seed=len(gpus))


def test_the_search_finds_the_same_partitions_as_with_the_reference_estimate(monkeypatch):
    trace = synthetic(6, 3)
    platform = build_platform(4, ptp_bandwidth_gbps=0.05)
    strategy = Strategy(case=4, micro_batch_size=2, schedule="1f1b")
    fast = ps.candidate_plans(trace, platform, strategy, [0.25] * 4)

    def reference(partitions, estimator):  # one estimate_partition per partition
        return [rec.estimate_partition(p, estimator.costs, platform, "1f1b", sch.Layout((0, 1, 2, 3)))
                for p in partitions]

    monkeypatch.setattr(part, "estimate_many", reference)
    slow = ps.candidate_plans(trace, platform, strategy, [0.25] * 4)
    assert [(p.starts, p.estimate_s) for p in fast] == [(p.starts, p.estimate_s) for p in slow]
    first = ps.candidate_plans(trace, platform, strategy, [0.25] * 4, first_only=True)
    assert [p.starts for p in first] == [slow[0].starts]


@st.composite
def estimate_cases(draw):
    layers = draw(st.integers(2, 6))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved"]))
    ranks = draw(st.integers(2 if schedule == "interleaved" else 1, 4))
    virtual = 2 if schedule == "interleaved" else 1
    if schedule == "interleaved":
        micro = ranks * draw(st.integers(1, 2))
        sizes = (2,) * micro
    else:
        sizes = tuple(draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=6)))
    return (layers, draw(st.integers(0, 10_000)), draw(st.sampled_from([16, 256])), schedule, ranks, virtual, sizes,
            draw(st.sampled_from([0.001, 0.05, 65.0])), draw(st.integers(0, 10_000)))


def check_estimate_case(layers, trace_seed, width, schedule, ranks, virtual, sizes, ptp, seed) -> None:
    trace = synthetic(layers, trace_seed, width=width)
    nf = sum(1 for p in ps.op_phases(trace) if p == ps.FORWARD)
    if ranks * virtual > nf:
        return
    platform = build_platform(ranks, ptp_bandwidth_gbps=ptp)
    check_batch_matches_reference(trace, platform, schedule, tuple(range(ranks)), virtual, sizes, seed, count=3)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(estimate_cases())
def test_batched_estimate_equals_reference(case):
    check_estimate_case(*case)


# Slow links and GPipe: transfers queue on their route, so the queue matters.
PLANTED_ESTIMATE = (4, 1, 256, "gpipe", 2, 1, (2, 2, 2, 2), 0.001, 5)


def test_planted_estimate_case_passes():
    check_estimate_case(*PLANTED_ESTIMATE)


def test_estimate_property_catches_transfers_that_ignore_their_route_queue(monkeypatch):
    real = pe.compile_program

    def buggy(*args, **kwargs):  # every transfer starts as soon as its block ends
        prog = real(*args, **kwargs)
        zero = 2 * prog.num_blocks
        levels = tuple(dataclasses.replace(lv, wait_route=np.full_like(lv.wait_route, zero)) for lv in prog.levels)
        return dataclasses.replace(prog, levels=levels)

    monkeypatch.setattr(pe, "compile_program", buggy)
    with pytest.raises(AssertionError, match="batched estimate differs"):
        check_estimate_case(*PLANTED_ESTIMATE)


# ----------------------------------------------------------------------------- cut programme


@st.composite
def cut_cases(draw):
    nf = draw(st.integers(1, 24))
    n = draw(st.integers(1, min(nf, 5)))
    weight = st.sampled_from([0.0, 1.0, 2.0, 0.3, 1.7])
    cost = st.sampled_from([0.0, 1.0, 2.0, math.inf, 0.5])
    weights = draw(st.lists(weight, min_size=nf, max_size=nf))
    costs = [draw(st.lists(cost, min_size=nf, max_size=nf)) for _ in range(n)]
    need = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=nf, max_size=nf)))
    bounds = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 4.5, 8.0, 40.0]), min_size=1, max_size=4))
    return weights, costs, need, bounds


def check_cut_case(weights, costs, need, bounds) -> None:
    prefix = part._prefix(weights)
    n = len(costs)
    # Cost of stage j starting after position k under bound b: the drawn cost, forbidden above 2·b.
    table = [np.array([[c if c <= 2 * b else math.inf for c in costs[j]] for b in bounds]) for j in range(n)]
    got = pc.min_cut_starts_many(prefix, lambda j: table[j], n, bounds, need)
    for b, bound in enumerate(bounds):
        ref = part._min_cut_starts(prefix, lambda j, k, b=b: float(table[j][b, k]), n, bound, need)
        assert got[b] == ref, f"cut programme differs at bound {bound}: {got[b]} != {ref}"


@settings(max_examples=100, deadline=None)
@given(cut_cases())
def test_all_bounds_cut_programme_equals_reference(case):
    check_cut_case(*case)


# Zero weights and equal cut costs: many equally cheap starts, the reference takes the last.
PLANTED_CUTS = ([1.0, 0.0, 0.0, 1.0, 0.0, 1.0], [[0.0] * 6, [1.0] * 6], None, [2.0])


def test_planted_cut_case_passes():
    check_cut_case(*PLANTED_CUTS)


def test_cut_property_catches_the_leftmost_of_equal_starts(monkeypatch):
    monkeypatch.setattr(pc, "rightmost", lambda hit: np.argmax(hit, axis=1))  # the first instead
    with pytest.raises(AssertionError, match="cut programme differs"):
        check_cut_case(*PLANTED_CUTS)


def test_first_feasible_start_is_the_references_window_start():
    prefix = np.array(part._prefix([0.1] * 50 + [0.0, 0.2] * 10))
    limits = np.array([0.3, 0.30000000000000004, 1.0, 1e-3])
    lo = pc.first_feasible_start(prefix, limits)
    for b, limit in enumerate(limits):
        for i in range(len(prefix)):
            expected = min(a for a in range(i + 1) if prefix[i] - prefix[a] <= limit)
            assert lo[b, i] == expected


def test_a_local_search_cut_short_by_its_budget_is_said_in_the_warnings(monkeypatch):
    trace = synthetic(6, 3)
    platform = build_platform(4, ptp_bandwidth_gbps=0.05)
    strategy = Strategy(case=4, micro_batch_size=2, schedule="1f1b")
    plans = ps.candidate_plans(trace, platform, strategy, [0.25] * 4)
    assert not any("budget" in w for p in plans for w in p.warnings)
    monkeypatch.setattr(part, "LOCAL_SEARCH_BLOCKS", 16 * 3)  # one estimate from each start
    plans = ps.candidate_plans(trace, platform, strategy, [0.25] * 4)
    notes = [w for w in plans[0].warnings if "budget" in w]
    assert notes and "1 estimate(s) from each of 3 starting partition(s)" in notes[0]


def test_unsorted_prefix_sums_fall_back_to_the_one_bound_programme():
    # A negative weight (not from a real trace) breaks the sorted prefix sums the vectorised
    # programme relies on; the search then runs the reference bound by bound.
    weights = [1.0, -0.5, 2.0, 1.0, 0.5]
    prefix = part._prefix(weights)
    costs = np.array([[0.0, 1.0, 0.0, 2.0, 0.0]] * 2)
    got = part._cut_search(prefix, lambda j: costs, 3, [2.0, 3.0], None)
    ref = [part._min_cut_starts(prefix, lambda j, k: float(costs[0, k]), 3, b, None) for b in (2.0, 3.0)]
    assert got == ref and any(r is not None for r in ref)
