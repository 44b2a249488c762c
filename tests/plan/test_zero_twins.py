"""A ZeRO-2 configuration whose ZeRO-1 twin (every other flag the same) is DAG-timed with it rides
on the twin's simulation: ZeRO-2 shards the gradient buffers too and changes no task, so the
twin's schedule is its own and only its memory plan is made again
(:func:`triosim.graph.memory.composition.peaks_under_zero`). Each twin's outcome must be, field
by field, the outcome of its own run; a memory plan made with the ZeRO-1 sizes is caught."""

from __future__ import annotations

import argparse
import copy
import importlib
from dataclasses import replace

import pytest

from triosim.cli.console import build_parser
from triosim.cli.plan import plan_inputs
from triosim.plan import Candidate
from triosim.plan.search import Row, candidate_config, dag_time, with_twins
from triosim.sweep.execute import Task, prepare, run_task, run_tasks, with_zero_twins
from triosim.sweep.grid import Point

composed_memory = importlib.import_module("triosim.graph.memory.composition")

LLAMA = ["--model", "llama3-8b", "--num-layers", "4", "--seq-len", "1024", "--gpu", "h100-sxm",
         "--topology", "nvlink-cluster", "--gpus", "8", "--global-batch", "16"]
MOE = ["--model", "qwen3-30b-a3b", "--num-layers", "2", *LLAMA[4:]]  # the same machine and batch
C = Candidate
# (tp, pp, dp, micro-batch, schedule, V, ZeRO, recompute, sequence parallel); ZeRO-1 each
SAMPLE = [
    C(2, 2, 2, 1, "interleaved", 2, 1, "selective", True),
    C(1, 2, 4, 2, "1f1b", 1, 1, "full"),
    C(1, 1, 8, 1, "1f1b", 1, 1, "none", overlaps=True),  # --overlap-param-gather: gathers in the forward
    C(2, 1, 4, 1, "1f1b", 1, 1, "none", True, offload="2"),
]


def _tasks(args: list[str], pairs: list[Candidate]) -> list[Task]:
    i = plan_inputs(build_parser().parse_args(["plan", *args]))
    points = []
    for c in pairs:
        for z in (1, 2):
            config = candidate_config(i.base, replace(c, zero=z), i.settings.global_batch)
            points.append(Point(len(points), (), tuple(sorted(vars(argparse.Namespace(**config)).items()))))
    prepared = prepare(points)
    assert not prepared.settled, [o.reason for o in prepared.settled]
    return prepared.traces, prepared.tasks


@pytest.fixture(scope="module")
def llama_tasks():
    return _tasks(LLAMA, SAMPLE)


def test_each_zero_2_folds_into_its_zero_1_task(llama_tasks) -> None:
    traces, tasks = llama_tasks
    folded = with_zero_twins(tasks)
    assert [t.index for t in folded] == list(range(0, len(tasks), 2))
    assert [[i for i, _ in t.twins] for t in folded] == [[k + 1] for k in range(0, len(tasks), 2)]
    # a ZeRO-2 task without its ZeRO-1 twin, or a twin that differs in more, stays on its own
    assert with_zero_twins(tasks[1:2]) == tasks[1:2]
    other = replace(tasks[1], config=tuple((k, 3 if k == "micro_batch_size" else v) for k, v in tasks[1].config))
    assert [t.twins for t in with_zero_twins([tasks[0], other])] == [(), ()]


@pytest.fixture
def twin_plans(monkeypatch) -> list[int]:
    """The ZeRO stages of the memory twins planned (each call of peaks_under_zero)."""
    made: list[int] = []
    real = composed_memory.peaks_under_zero
    monkeypatch.setattr(composed_memory, "peaks_under_zero", lambda b, zero: made.append(zero) or real(b, zero))
    return made


def test_a_twin_outcome_is_its_own_run(llama_tasks, twin_plans) -> None:
    traces, tasks = llama_tasks
    for task in with_zero_twins(tasks):
        one, two = run_tasks(traces, task)
        alone = run_task(traces, tasks[two.index])
        assert two == alone, task.config
        assert one == run_task(traces, replace(task, twins=()))
        assert two.max_peak_memory_bytes < one.max_peak_memory_bytes  # the gradient buffers sharded over dp
    assert twin_plans == [2] * len(SAMPLE)  # each twin from its ZeRO-1 task's build, none on its own


def test_a_memory_plan_with_the_zero_1_sizes_is_caught(llama_tasks, monkeypatch) -> None:
    traces, tasks = llama_tasks

    def stale(b, zero):  # planted: the twin's plan keeps the buffer sizes ZeRO-1 cached
        twin = copy.copy(b)
        twin.strategy = replace(b.strategy, zero=zero)
        return {r.device: r.peak_bytes for r in composed_memory._plan_memory(twin)}

    monkeypatch.setattr(composed_memory, "peaks_under_zero", stale)
    task = with_zero_twins(tasks)[0]
    _, two = run_tasks(traces, task)
    assert two != run_task(traces, tasks[two.index])


def test_without_its_memory_plan_a_twin_runs_alone(twin_plans) -> None:
    # an expert rank's shards depend on the ZeRO stage: the build records no twin, the twin runs
    traces, tasks = _tasks(MOE, [C(1, 1, 8, 1, "1f1b", 1, 1, "none", ep=8)])
    (task,) = with_zero_twins(tasks)
    one, two = run_tasks(traces, task)
    assert two == run_task(traces, tasks[1]) and one == run_task(traces, tasks[0])
    assert twin_plans == []


def test_only_a_stage_that_shards_more_is_a_memory_twin() -> None:
    b = type("B", (), {"strategy": type("S", (), {"zero": 2})()})()
    with pytest.raises(ValueError, match="ZeRO-1 from ZeRO-2"):
        composed_memory.peaks_under_zero(b, 1)
    b.strategy.zero = 1
    with pytest.raises(ValueError, match="ZeRO-3 from ZeRO-1"):
        composed_memory.peaks_under_zero(b, 3)


def test_the_plan_times_twins_in_one_round() -> None:
    rows = [Row(replace(SAMPLE[0], zero=z)) for z in (0, 1, 2, 3)] + [Row(replace(SAMPLE[1], zero=2))]
    assert [r.candidate.zero for r in with_twins(rows[1:2], rows)] == [1, 2]
    assert [r.candidate.zero for r in with_twins(rows[2:3], rows)] == [2, 1]
    assert with_twins(rows[:1], rows) == rows[:1]  # ZeRO-0 and ZeRO-3 have none
    assert len(with_twins(rows[4:], rows)) == 1  # its ZeRO-1 is not among the rows


def test_dag_time_sets_both_rows() -> None:
    i = plan_inputs(build_parser().parse_args(["plan", *LLAMA]))
    rows = [Row(replace(SAMPLE[0], zero=z)) for z in (1, 2)]
    assert not dag_time(rows, i.base, i.settings.global_batch)
    one, two = (r.dag for r in rows)
    assert one.makespan_ms == two.makespan_ms and two.max_peak_memory_bytes < one.max_peak_memory_bytes
