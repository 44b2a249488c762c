"""The two-chain model of plan's combined 1F1B estimate (triosim/plan/combined_time.py) in closed
form: the GPU runs one compute step at a time, earliest ready first (ties: the first chain),
communication beside it slows it by its SMs, and token exchanges running together share their
links; and a block's steps with and without the delayed weight gradients."""

from __future__ import annotations

import numpy as np

from triosim.plan.combined_time import block_chain, run_chains


def speed(k: int) -> float:
    return 1.0 - 0.25 * k  # each active communication step takes a quarter of the SMs


def test_one_chain_runs_its_steps_one_after_another() -> None:
    assert run_chains([[(1.0, 0.0, False), (0.0, 2.0, True), (0.5, 0.0, False)]], speed) == [3.5]


def test_compute_beside_an_exchange_runs_slower() -> None:
    # A computes 0-1 (the tie is the first chain's), then exchanges 1-3; B waits for the GPU,
    # computes from 1 beside the exchange at 0.75: its 1.5 s take 2 s, to 3.
    a, b = run_chains([[(1.0, 0.0, False), (0.0, 2.0, True)], [(1.5, 0.0, False)]], speed)
    assert a == 3.0 and abs(b - 3.0) < 1e-12


def test_two_exchanges_share_their_links_a_tp_collective_does_not() -> None:
    both = run_chains([[(0.0, 1.0, True)], [(0.0, 1.0, True)]], speed)
    assert both == [2.0, 2.0]  # each at half rate
    apart = run_chains([[(0.0, 1.0, True)], [(0.0, 1.0, False)]], speed)
    assert apart == [1.0, 1.0]


def test_the_earliest_ready_compute_goes_first() -> None:
    # B's second step is ready at 1 (after its 1 s exchange); A's second at 2 (after its compute):
    # the GPU runs A 0-2, then B's 1 s step (ready since 1) before A's next one.
    a, b = run_chains([[(2.0, 0.0, False), (1.0, 0.0, False)], [(0.0, 1.0, True), (1.0, 0.0, False)]],
                      lambda k: 1.0)
    assert (a, b) == (4.0, 3.0)


def test_delayed_weight_gradients_run_beside_the_last_exchange() -> None:
    compute = np.array([4.0, 2.0, 6.0, 1.0])
    comm = np.zeros(4)
    exchange = {0: ("before", 3.0), 2: ("after", 5.0)}
    plain = block_chain([0, 1, 2, 3], compute, comm, exchange, False)
    assert plain == ((0.0, 3.0, True), (4.0, 0.0, False), (2.0, 0.0, False), (6.0, 0.0, False), (0.0, 5.0, True),
                     (1.0, 0.0, False))
    delayed = block_chain([0, 1, 2, 3], compute, comm, exchange, True)
    # op 0 runs half in place, op 2 its half, then both weight halves (2 + 3) beside the exchange
    assert delayed == ((0.0, 3.0, True), (2.0, 0.0, False), (2.0, 0.0, False), (3.0, 0.0, False), (5.0, 5.0, True),
                       (1.0, 0.0, False))
    assert sum(c for c, _, _ in delayed) == sum(c for c, _, _ in plain)


def test_a_chain_alone_in_closed_form_is_the_event_loops() -> None:
    """run_alone sums its steps (a step with both parts: the exchange, and what the compute beside
    it at speed_of(1) has left) where run_chains steps through events: the same ends on random
    chains (a planted bug, the compute beside an exchange at full speed, is caught)."""
    from triosim.plan.combined_time import run_alone

    rng = np.random.default_rng(7)
    for _ in range(200):
        parts = rng.random((6, 2)) * (rng.random((6, 2)) < 0.6)
        chain = [(float(c), float(x), bool(t)) for (c, x), t in zip(parts, rng.random(6) < 0.5) if c or x]
        assert abs(run_alone(chain, speed) - run_chains([chain], speed)[0]) < 1e-12
    fork = [(2.0, 1.0, True)]
    assert run_alone(fork, speed) == 1.0 + (2.0 - 0.75) and run_alone(fork, lambda k: 1.0) != run_alone(fork, speed)
