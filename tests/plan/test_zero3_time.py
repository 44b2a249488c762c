"""ZeRO-3's gathers inside one block, worked by hand against the DAG's rules
(triosim.plan.zero3_time): unit k + 1's gather issued at unit k's first op (after the op before it
and unit k's gather), the first from when the GPU is free, the compute beside a gather slowed by
its SMs, a TP collective beside a gather at the speeds their shared links leave each, and the ops before
the one the block's input holds up (re-runs under full recomputation) hidden behind that wait."""

from __future__ import annotations

import numpy as np
import pytest

from triosim.plan.zero3_time import block_times

ONES = np.ones(3)
NO_TP = np.zeros(3)
UNITS = np.array([0, -1, 1])  # op 0 starts unit 0, op 2 unit 1
APART, HALVES = (1.0, 1.0), (0.5, 0.5)  # a TP collective and a gather: on no common link, on one link


def test_the_first_gather_is_exposed_from_the_gpu_free_the_next_hidden_behind_op_0() -> None:
    # Dg: gather 0 0..2, op 0 2..3 (gather 1 issued at 2: 2..5), op 1 3..4, op 2 waits: 5..6
    # Dd (input at op 0): gathers 0 and 1 long done: 3 ops back to back
    assert block_times(ONES, NO_TP, UNITS, [2.0, 3.0], 1.0, APART) == (6.0, 3.0)


def test_ops_before_the_input_gate_hide_behind_the_wait() -> None:
    # op 0 (a re-run) needs no input: with the input at op 1, ops 1 and 2 are what follows it
    assert block_times(ONES, NO_TP, UNITS, [2.0, 3.0], 1.0, APART, gate=1) == (6.0, 2.0)


def test_compute_beside_a_gather_runs_at_the_sms_left() -> None:
    # half the SMs: op 0 2..4 beside gather 1 (2..5), op 1 4..5 at half speed then 5..5.5, op 2 5.5..6.5
    assert block_times(ONES, NO_TP, UNITS, [2.0, 3.0], 0.5, APART)[0] == pytest.approx(6.5)


def test_a_tp_collective_beside_a_gather_on_one_link_halves_both() -> None:
    # op 0 2..3, its TP collective (1 s alone) beside gather 1 (2..5): 3..5, the gather ends at 6
    compute, tp, units = np.ones(2), np.array([1.0, 0.0]), np.array([0, 1])
    assert block_times(compute, tp, units, [2.0, 3.0], 1.0, HALVES)[0] == pytest.approx(7.0)
    assert block_times(compute, tp, units, [2.0, 3.0], 1.0, APART)[0] == pytest.approx(6.0)


def test_a_gather_held_up_at_a_nic_leaves_the_tp_collective_more() -> None:
    # op 0 2..3 starts unit 0 and issues unit 1's gather (2..5 alone); op 2 starts unit 1.
    # TP at 3/4 speed, the gather at full: TP 3..4.333, op 1 ..5.333, op 2 ..6.333 (apart: 6)
    tp, units = np.array([1.0, 0.0, 0.0]), np.array([0, -1, 1])
    assert block_times(ONES, tp, units, [2.0, 3.0], 1.0, (0.75, 1.0))[0] == pytest.approx(3 + 1 / 0.75 + 2)
    assert block_times(ONES, tp, units, [2.0, 3.0], 1.0, APART)[0] == pytest.approx(6.0)
    # both slowed, TP at 0.5 and the gather at 0.65: TP 3..5, the gather's 2 s left lose 0.7 s
    # meanwhile (ends 5.7); op 1 5..5.1, op 2 waits for it: 5.7..6.7 (halves: the gather ends at 6, 7)
    compute = np.array([1.0, 0.1, 1.0])
    assert block_times(compute, tp, units, [2.0, 3.0], 1.0, (0.5, 0.65))[0] == pytest.approx(6.7)
    assert block_times(compute, tp, units, [2.0, 3.0], 1.0, HALVES)[0] == pytest.approx(7.0)


def test_beside_speeds_are_the_flow_models_shares() -> None:
    from triosim.hardware.presets import build_platform
    from triosim.plan.zero3_time import beside_speeds

    platform = build_platform(16, topology="nvlink-cluster", gpus_per_node=8)
    # one ring over both nodes crosses GPU 0's NVLink port and a NIC: the TP pair gets half the
    # port; the gather, held at the NIC, loses less
    tp, g = beside_speeds(platform, (0, 1), (0, 4, 8, 12), True)
    assert tp == pytest.approx(0.5) and 0.5 < g < 1.0
    assert beside_speeds(platform, (0, 1), (0, 2), False) == pytest.approx((0.5, 0.5))  # one port, both
    assert beside_speeds(platform, (0, 1), (0, 8), False) == (1.0, 1.0)  # the NIC's own path


def test_a_context_rings_send_beside_the_gathers_moves_at_its_shared_speed() -> None:
    from triosim.hardware.platform import gpu_node
    from triosim.hardware.presets import build_platform
    from triosim.plan.zero3_time import send_speed

    platform = build_platform(16, topology="nvlink-cluster", gpus_per_node=8)
    route = tuple(platform.route(gpu_node(3), gpu_node(0)))  # cp rank 3 -> 0 of the ring (0, 1, 2, 3)
    # the gather over dp 2 × cp 4 (0-3 and 8-11) crosses the same NVLink ports, and the NICs:
    # max-min shares leave the exchange 4/7 of its speed alone
    assert send_speed(platform, route, (0, 1, 2, 3, 8, 9, 10, 11)) == pytest.approx(4 / 7)
    assert send_speed(platform, route, (4, 12)) == 1.0  # a gather elsewhere
    assert send_speed(platform, route, ()) == 1.0  # no ZeRO-3


def test_the_gathers_share_of_a_block_is_at_most_all_of_it() -> None:
    from triosim.plan.zero3_time import gathering_share

    assert gathering_share([1.0, 2.0], np.array([2.0, 4.0])) == pytest.approx(0.5)
    assert gathering_share([5.0, 2.0], np.array([2.0, 4.0])) == 1.0
