"""The vectorised stage occupancy (graph/memory/stage.py) against a step-by-step reference on
small random programs: runs that share an ops tuple object, runs with equal ops in distinct
tuples, and optimizer shares (micro-batch None) running the same ops tuple as a micro-batch."""

from __future__ import annotations

import random

import numpy as np
import pytest

from triosim.graph.memory import stage
from triosim.graph.memory.stage import stage_occupancy

NB = 12  # buffer ids 0..11


def _reference(runs, template_of, size_of, fractions, nb, delivered, persistent, capacity, resident):
    """Each key's lifetime found step by step with dicts (what the numpy code computes)."""
    first: dict[int, tuple[int, bool]] = {}
    last: dict[int, int] = {}
    step = 0
    for _task, ops, r in runs:
        for i in ops:
            ids, reads, keyed = template_of(i, r)
            for k, is_read, per_mb in zip(ids, reads, keyed):
                key = (r + 1) * nb + k if per_mb else k
                first.setdefault(key, (step, is_read))
                last[key] = step
            step += 1
    n = step
    if n == 0 or not first:
        return np.zeros(n, dtype=np.int64), 0
    sizes = {key: size_of(key % nb, 1.0 if key < nb else fractions[key // nb - 1]) for key in first}
    total = sum(sizes.values())
    if total > capacity:
        return None
    occ = np.zeros(n, dtype=np.int64)
    for key, (begin, is_read) in first.items():
        raw = key < nb
        if (is_read and key not in delivered) or (raw and key in resident):
            begin = 0
        end = n - 1 if raw and key in persistent else last[key]
        occ[begin:end + 1] += sizes[key]
    return occ, total


def _program(rng: random.Random):
    """A random program: ops with random reads/writes, runs drawn from a few shared tuples."""
    n_ops = rng.randint(1, 8)
    reads = {i: rng.sample(range(NB), rng.randint(0, 3)) for i in range(n_ops)}
    writes = {i: rng.sample(range(NB), rng.randint(0, 2)) for i in range(n_ops)}
    invariant = set(rng.sample(range(NB), 3))
    pool = [tuple(rng.choice(range(n_ops)) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 4))]
    fractions = [rng.choice([0.25, 0.5, 1.0]) for _ in range(rng.randint(1, 4))]
    runs = []
    for task in range(rng.randint(1, 25)):
        ops = rng.choice(pool)
        if rng.random() < 0.3:
            ops = tuple(list(ops))  # equal ops, a distinct tuple object
        r = None if rng.random() < 0.2 else rng.randrange(len(fractions))
        runs.append((task, ops, r))

    def template_of(i, r):
        rd, wr = reads[i], writes[i]
        keyed = [False] * (len(rd) + len(wr)) if r is None else [k not in invariant for k in (*rd, *wr)]
        return [*rd, *wr], [True] * len(rd) + [False] * len(wr), keyed

    def size_of(k, frac):
        return int((k + 1) * 1000 * frac)

    delivered = {rng.randrange(NB * (len(fractions) + 1)) for _ in range(rng.randint(0, 6))}
    persistent = set(rng.sample(range(NB), rng.randint(0, 3)))
    resident = set(rng.sample(range(NB), rng.randint(0, 2)))
    capacity = rng.choice([10**9, rng.randint(0, 60000)])
    return runs, template_of, size_of, fractions, NB, delivered, persistent, capacity, resident


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a[1] == b[1] and np.array_equal(a[0], b[0])


@pytest.mark.parametrize("keys", [True, False], ids=["keys in a table", "keys sorted"])
@pytest.mark.parametrize("dense", [True, False], ids=["pairs in a table", "pairs sorted"])
@pytest.mark.parametrize("seed", range(150))
def test_vectorised_occupancy_equals_step_by_step(seed, dense, keys, monkeypatch):
    if not dense:
        monkeypatch.setattr(stage, "DENSE_PAIRS", 0)
    if not keys:
        monkeypatch.setattr(stage, "DENSE_KEYS", 0)
        monkeypatch.setattr(stage, "KEY_SLOTS_PER_ENTRY", 0)
    args = _program(random.Random(seed))
    assert _same(stage_occupancy(*args[:8], resident=args[8]), _reference(*args))


def test_an_ops_tuple_run_as_a_micro_batch_and_as_an_optimizer_share():
    """The same tuple object, once with micro-batch 0 (buffer 1 keyed) and once as an optimizer
    share (nothing keyed): two templates, not one."""
    ops = (0,)

    def template_of(i, r):
        return [1], [False], [r is not None]

    args = ([(0, ops, 0), (1, ops, None)], template_of, lambda k, f: 10, [1.0], NB, set(), set(), 10**9, set())
    got = stage_occupancy(*args[:8], resident=args[8])
    assert _same(got, _reference(*args)) and got[1] == 20
