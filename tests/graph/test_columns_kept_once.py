"""TaskOf and StepLists answer every read as the plain dict and per-GPU lists they replace,
whether an op's tasks were added entry by entry or as a column of every replica's task
(an exact case-3 run adds 4,096 at a time)."""

from __future__ import annotations

import random

import pytest

from triosim.config import configure
from triosim.graph import build_graph
from triosim.graph.step_lists import StepLists
from triosim.graph.task_of import TaskOf

from .lookups import assert_reads_as

REPLICAS = [(0, 0), (0, 1), (1, 0), (1, 1)]
POSITION = {rep: k for k, rep in enumerate(REPLICAS)}


def _task_ofs(seed: int) -> tuple[TaskOf, dict]:
    rng = random.Random(seed)
    lazy, plain = TaskOf(), {}
    first = 100
    for op in range(6):
        for r in range(2):
            if rng.random() < 0.5:  # a column; sometimes added again (a later piece of the op wins)
                for _ in range(rng.randint(1, 2)):
                    lazy.add_column(op, r, POSITION, first)
                    plain.update({(*rep, op, r): first + k for rep, k in POSITION.items()})
                    first += len(REPLICAS)
            else:  # entry by entry, some replicas only
                for rep in rng.sample(REPLICAS, rng.randint(0, len(REPLICAS))):
                    lazy[(*rep, op, r)] = plain[(*rep, op, r)] = first
                    first += 1
    return lazy, plain


@pytest.mark.parametrize("seed", range(6))
def test_task_of_lookups_equal_the_dict_written_entry_by_entry(seed: int) -> None:
    lazy, plain = _task_ofs(seed)
    assert_reads_as(lazy, plain, [(*rep, op, r) for rep in [*REPLICAS, (2, 0)] for op in range(7) for r in range(3)])


def _step_lists(seed: int) -> tuple[StepLists, dict[int, list]]:
    rng = random.Random(seed)
    gpus = [4, 5, 6]
    lazy, plain = StepLists(), {}
    lazy.start(gpus)
    plain.update({gpu: [] for gpu in gpus})
    first = 10
    for step in range(12):
        how = rng.choice(["column", "append", "read-append"])
        ops = (step,)
        if how == "column":
            lazy.add_column(gpus, first, ops, step % 3)
            for k, gpu in enumerate(gpus):
                plain[gpu].append((first + k, ops, step % 3))
            first += len(gpus)
        else:
            gpu = rng.choice(gpus)
            entry = (first, ops, None)
            first += 1
            if how == "append":
                lazy.append(gpu, entry)
            else:  # through the list read out (as BlockReplay and the host copies add)
                lazy[gpu].append(entry)
            plain[gpu].append(entry)
        if rng.random() < 0.3:  # a read in between writes the pending columns out
            gpu = rng.choice(gpus)
            assert lazy[gpu] == plain[gpu]
    return lazy, plain


@pytest.mark.parametrize("seed", range(8))
def test_step_lists_read_as_the_lists_written_step_by_step(seed: int) -> None:
    lazy, plain = _step_lists(seed)
    tasks = {gpu: lazy.tasks(gpu) for gpu in plain}  # read lazily, after more steps may come
    for gpu, steps in plain.items():
        assert lazy[gpu] == steps
        assert tasks[gpu] == tuple(task for task, _ops, _r in steps) and len(tasks[gpu]) == len(steps)
        assert list(tasks[gpu]) == [task for task, _ops, _r in steps] and repr(tasks[gpu]) == repr(tuple(tasks[gpu]))


def test_an_exact_case3_build_keeps_its_columns_once_with_the_same_memory_program() -> None:
    """The 16-GPU tensor-parallel preset: its per-GPU steps are columns, and every GPU's memory
    counter lists that GPU's own compute tasks, in program order."""
    trace, platform, strategy = configure(trace_dir="sample_trace/gpt-h16-cpu-bs8", case=3, gpus=16, exact=True)
    graph = build_graph(trace, platform, strategy)
    memory = graph.meta["memory"]
    for gpu in (0, 5, 15):
        tasks, step_bytes = memory[gpu]["occupancy"]
        assert len(tasks) == len(step_bytes) > 0
        assert all(graph.devices[t] == (gpu,) and graph.kind[t] == "compute" for t in tasks)
        assert list(tasks) == sorted(tasks)
