"""ZeRO-3's gathers inside one block, worked by hand against the DAG's rules
(triosim.plan.zero3_time): unit k + 1's gather issued at unit k's first op (after the op before it
and unit k's gather), the first from when the GPU is free, the compute beside a gather slowed by
its SMs, a TP collective beside a gather on a shared link at half speed each, and the ops before
the one the block's input holds up (re-runs under full recomputation) hidden behind that wait."""

from __future__ import annotations

import numpy as np
import pytest

from triosim.plan.zero3_time import block_times

ONES = np.ones(3)
NO_TP = np.zeros(3)
UNITS = np.array([0, -1, 1])  # op 0 starts unit 0, op 2 unit 1


def test_the_first_gather_is_exposed_from_the_gpu_free_the_next_hidden_behind_op_0() -> None:
    # Dg: gather 0 0..2, op 0 2..3 (gather 1 issued at 2: 2..5), op 1 3..4, op 2 waits: 5..6
    # Dd (input at op 0): gathers 0 and 1 long done: 3 ops back to back
    assert block_times(ONES, NO_TP, UNITS, [2.0, 3.0], 1.0, False) == (6.0, 3.0)


def test_ops_before_the_input_gate_hide_behind_the_wait() -> None:
    # op 0 (a re-run) needs no input: with the input at op 1, ops 1 and 2 are what follows it
    assert block_times(ONES, NO_TP, UNITS, [2.0, 3.0], 1.0, False, gate=1) == (6.0, 2.0)


def test_compute_beside_a_gather_runs_at_the_sms_left() -> None:
    # half the SMs: op 0 2..4 beside gather 1 (2..5), op 1 4..5 at half speed then 5..5.5, op 2 5.5..6.5
    assert block_times(ONES, NO_TP, UNITS, [2.0, 3.0], 0.5, False)[0] == pytest.approx(6.5)


def test_a_tp_collective_beside_a_gather_on_one_link_halves_both() -> None:
    # op 0 2..3, its TP collective (1 s alone) beside gather 1 (2..5): 3..5, the gather ends at 6
    compute, tp, units = np.ones(2), np.array([1.0, 0.0]), np.array([0, 1])
    assert block_times(compute, tp, units, [2.0, 3.0], 1.0, True)[0] == pytest.approx(7.0)
    assert block_times(compute, tp, units, [2.0, 3.0], 1.0, False)[0] == pytest.approx(6.0)
