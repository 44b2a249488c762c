"""Megatron-Core's combined 1F1B (``--moe-a2a-overlap``) and delayed weight gradients
(``--delay-wgrad-compute``) in the plan's estimate.

The DAG builds a block as a chain of tasks in the trace's order (:mod:`triosim.graph.expert.dispatch`,
:mod:`triosim.graph.pipeline.combined`); here a block is the same chain as *steps*, each
``(compute seconds, communication seconds)`` started together and done when both are:

- an op's compute (its GEMMs at the DAG's shapes) is a step of its own, the TP collectives after
  it another, and a grouped GEMM's token exchange one before or after it, as the DAG places them;
- with ``--delay-wgrad-compute`` a backward grouped GEMM runs half its time (its data gradient)
  in place; the second grouped GEMM of the layer runs its data gradient, then the weight
  gradients of both *beside* its exchange: one step with both parts.

Paired blocks (one micro-batch's forward with another's backward) start together on one GPU
(:func:`run_chains`): the GPU runs one compute step at a time, the earliest ready first (ties:
the pair's first block, built first); communication runs beside it, the active token exchanges
sharing the links equally (a TP collective's links are another group's), and the compute runs slower by the SMs each active one holds (1 − k·S/N, as
:mod:`triosim.schedule.sm_sharing`). A block alone runs the same way, on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..graph.pipeline.schedules import BACKWARD, FORWARD

# (compute seconds at full speed, communication seconds alone, whether that is a token exchange),
# started together
Step = tuple[float, float, bool]


@dataclass(frozen=True)
class MoeOverlaps:
    """The MoE overlaps a plan's candidates all run with (the user's flags)."""

    shared: bool = False  # --moe-shared-expert-overlap
    a2a: bool = False  # --moe-a2a-overlap (combined 1F1B)
    delay_wgrad: bool = False  # --delay-wgrad-compute


def block_chain(ops: Sequence[int], compute: np.ndarray, comm: np.ndarray, exchange: dict[int, tuple[str, float]],
                delay_wgrad: bool) -> tuple[Step, ...]:
    """One block's steps: ``ops`` in trace order, each op's ``compute`` and the TP collectives
    after it (``comm``), and ``exchange`` (op -> ("before" or "after", seconds) for a grouped
    GEMM's token exchange); ``delay_wgrad``: a backward block under --delay-wgrad-compute."""
    steps: list[Step] = []

    def add(c: float, x: float, token: bool = False) -> None:
        if c <= 0.0 and x <= 0.0:
            return
        if steps and c <= 0.0 and steps[-1][0] <= 0.0 and steps[-1][2] == token:  # one communication step
            steps[-1] = (0.0, steps[-1][1] + x, token)
            return
        steps.append((max(c, 0.0), max(x, 0.0), token))  # each op's compute its own step, as the DAG's tasks

    deferred = 0.0
    for i in ops:
        c, m = float(compute[i]), float(comm[i])
        when, x = exchange.get(i, ("", 0.0))
        if when == "before":
            add(0.0, x, True)
            if delay_wgrad:  # the data gradient now, the weight gradient with the layer's last exchange
                deferred += c / 2
                c /= 2
            add(c, 0.0)
            add(0.0, m)
        elif when == "after" and delay_wgrad:
            add(c / 2, 0.0)
            steps.append((c / 2 + deferred, x, True))  # the weight gradients beside the exchange
            deferred = 0.0
            add(0.0, m)
        else:
            add(c, 0.0)
            add(0.0, m)
            add(0.0, x, True)
    if deferred:
        add(deferred, 0.0)
    return tuple(steps)


def run_alone(chain: Sequence[Step], speed_of: Callable[[int], float]) -> float:
    """When one chain ends run alone (:func:`run_chains` of it, in closed form): each step takes
    its compute or its communication, or, both at once, the communication and what the compute
    has left after it at full speed (it ran at ``speed_of(1)`` beside it)."""
    t = 0.0
    slow = speed_of(1)
    for c, x, _ in chain:
        if c <= 0.0 or x <= 0.0:
            t += c + x
        else:
            t += x + max(0.0, c - x * slow) if c > x * slow else x
    return t


def run_chains(chains: Sequence[Sequence[Step]], speed_of: Callable[[int], float]) -> list[float]:
    """When each chain ends, all started at 0 on one GPU (module docstring); ``speed_of(k)``:
    the compute's speed while k communication steps are active."""
    n = len(chains)
    at = [0] * n
    comp = [0.0] * n
    comm = [0.0] * n
    token = [False] * n
    ready = [0.0] * n
    end = [0.0] * n
    done = [False] * n

    def begin(k: int, t: float) -> None:
        while at[k] < len(chains[k]):
            c, x, tok = chains[k][at[k]]
            if c > 0.0 or x > 0.0:
                comp[k], comm[k], token[k], ready[k] = c, x, tok, t
                return
            at[k] += 1
        done[k], end[k] = True, t

    for k in range(n):
        begin(k, 0.0)
    t = 0.0
    running = -1
    while not all(done):
        if running < 0:
            waiting = [k for k in range(n) if not done[k] and comp[k] > 0.0]
            if waiting:
                running = min(waiting, key=lambda k: (ready[k], k))
        active = [k for k in range(n) if not done[k] and comm[k] > 0.0]
        speed = speed_of(len(active))
        exchanging = sum(1 for k in active if token[k])
        rate = [1.0 / exchanging if token[k] and exchanging else 1.0 for k in range(n)]  # exchanges share the links
        dt = comp[running] / speed if running >= 0 else float("inf")
        for k in active:
            dt = min(dt, comm[k] / rate[k])
        t += dt
        if running >= 0:
            left = comp[running] - dt * speed
            if left <= comp[running] * 1e-12:
                left = 0.0
            comp[running] = left
            if left == 0.0:
                running = -1
        for k in active:
            left = comm[k] - dt * rate[k]
            comm[k] = 0.0 if left <= comm[k] * 1e-12 else left
        for k in range(n):
            if not done[k] and comp[k] == 0.0 and comm[k] == 0.0:
                at[k] += 1
                begin(k, t)
    return end


def stage_chains(ops_f: np.ndarray, pos_f: np.ndarray, ops_b: np.ndarray, pos_b: np.ndarray,
                 bounds: Sequence[tuple[int, int]], compute: np.ndarray, comm: np.ndarray,
                 exchange: dict[int, tuple[str, float]], delay_wgrad: bool) -> list[dict[str, tuple[Step, ...]]]:
    """Per stage (``bounds``: its forward positions [a, b)), its forward and backward block as
    steps (:func:`block_chain`); ``ops_f``/``ops_b`` the forward and backward ops in trace order
    with their positions."""
    out = []
    for a, b in bounds:
        fwd = ops_f[(pos_f >= a) & (pos_f < b)]
        bwd = ops_b[(pos_b >= a) & (pos_b < b)]
        out.append({FORWARD: block_chain(fwd.tolist(), compute, comm, exchange, False),
                    BACKWARD: block_chain(bwd.tolist(), compute, comm, exchange, delay_wgrad)})
    return out


__all__ = ["MoeOverlaps", "Step", "block_chain", "run_alone", "run_chains", "stage_chains"]
