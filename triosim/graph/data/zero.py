"""ZeRO / FSDP facts a hybrid build needs: which buffers are weights, gradients and optimizer
state, how much of each a GPU keeps, and the FSDP units parameters are gathered in.

Per GPU, with N_dp data-parallel ranks: ZeRO-1 keeps 1/N_dp of the optimizer state, ZeRO-2 also
of the gradients, ZeRO-3 also of the weights — ``(W + G + O)/N_dp`` at stage 3, the
``(2+2+K)·Ψ/N_dp`` of the ZeRO paper in the trace's own dtype sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...trace import Trace
from ..pipeline.stages import BACKWARD, FORWARD, OPTIMIZER, PipelinePlan


@dataclass(frozen=True)
class BufferRoles:
    """Batch-invariant buffers by role."""

    weights: frozenset[str]
    gradients: frozenset[str]
    optimizer: frozenset[str]

    def role(self, buffer: str) -> str | None:
        if buffer in self.weights:
            return "weights"
        if buffer in self.gradients:
            return "gradients"
        if buffer in self.optimizer:
            return "optimizer"
        return None


def buffer_roles(trace: Trace) -> BufferRoles:
    """Weights: the trace's parameters. Optimizer state: buffers that exist before the iteration
    and only the optimizer touches besides weights. Gradients: batch-invariant buffers the
    backward pass writes that are not weights."""
    params = frozenset(trace.parameters)
    external = set(trace.external)
    by_optimizer: set[str] = set()
    outside: set[str] = set()
    grads: set[str] = set()
    for i, op in enumerate(trace.ops):
        touched = (*trace.reads[i], *trace.writes[i])
        if op.stage == "optimizer":
            by_optimizer.update(touched)
        else:
            outside.update(touched)
            if op.stage == "backward":
                grads.update(k for k in trace.writes[i] if k in trace.batch_invariant and k not in params)
    state = frozenset(k for k in by_optimizer if k in external and k not in params and k not in outside)
    return BufferRoles(params, frozenset(grads - state), state)


def zero_divisor(roles: BufferRoles, buffer: str, zero: int, dp: int) -> int:
    """How many DP ranks share ``buffer`` at ZeRO stage ``zero`` (1: every rank holds it all)."""
    if dp <= 1 or zero <= 0:
        return 1
    role = roles.role(buffer)
    if role == "optimizer" or (role == "gradients" and zero >= 2) or (role == "weights" and zero >= 3):
        return dp
    return 1


@dataclass(frozen=True)
class Unit:
    """Parameters gathered together (an FSDP unit) and the op that first needs them."""

    first_op: int
    params: tuple[str, ...]
    nbytes: int


def fsdp_units(trace: Trace, plan: PipelinePlan, params: Sequence[str], stage: int, cap_bytes: float,
               full_bytes: Callable[[str], int]) -> dict[str, list[Unit]]:
    """Stage ``stage``'s parameters cut into units of at least ``cap_bytes`` in the order the
    forward (resp. backward) pass first uses them; parameters first used by the same op stay
    together. ``full_bytes(p)``: the bytes gathered for ``p`` (its TP shard, whole over DP)."""
    mine = set(params)
    out: dict[str, list[Unit]] = {}
    for phase in (FORWARD, BACKWARD):
        first: dict[str, int] = {}
        for i, (ph, s) in enumerate(zip(plan.phase, plan.stage)):
            if ph != phase or s != stage or ph == OPTIMIZER:
                continue
            for k in trace.reads[i]:
                if k in mine:
                    first.setdefault(k, i)
        if phase == BACKWARD:
            for p in mine:
                ready = trace.grad_ready_op.get(p)
                if p not in first and ready is not None and plan.stage[ready] == stage:
                    first[p] = ready
        by_op: dict[int, list[str]] = {}
        for p in params:
            if p in first:
                by_op.setdefault(first[p], []).append(p)
        units: list[Unit] = []
        cur: list[str] = []
        cur_op = -1
        size = 0
        for op in sorted(by_op):
            if not cur:
                cur_op = op
            cur.extend(by_op[op])
            size += sum(full_bytes(p) for p in by_op[op])
            if size >= cap_bytes:
                units.append(Unit(cur_op, tuple(cur), size))
                cur, size = [], 0
        if cur:
            units.append(Unit(cur_op, tuple(cur), size))
        out[phase] = units
    return out


@dataclass(frozen=True)
class GatheredCopies:
    """ZeRO-3's transient full parameters on one stage, as memory keys of its program.

    ``steps[(op, micro_batch)]`` = (keys freed after that step, keys allocated by it): unit k's
    gathered copy is allocated when its gather starts — at the first op of unit k − 1 (prefetch:
    two units are whole at once), or at its own first op for unit 0 — and freed after the last
    op of the pass that uses one of its parameters. ``sizes``: each key's bytes."""

    steps: dict[tuple[int, int], tuple[tuple[str, ...], tuple[str, ...]]]
    sizes: dict[str, int]


def gathered_copies(trace: Trace, plan: PipelinePlan, units: dict[str, list[Unit]], stage: int,
                    micro_batches: int) -> GatheredCopies:
    """The gathered copies of ``units`` (from :func:`fsdp_units`) in every micro-batch."""
    frees: dict[tuple[int, int], list[str]] = {}
    allocs: dict[tuple[int, int], list[str]] = {}
    sizes: dict[str, int] = {}
    for phase, unit_list in units.items():
        owner = {p: k for k, u in enumerate(unit_list) for p in u.params}
        last = [u.first_op for u in unit_list]
        for i, (ph, s) in enumerate(zip(plan.phase, plan.stage)):
            if ph != phase or s != stage:
                continue
            for k in {owner[p] for p in trace.reads[i] if p in owner}:
                last[k] = max(last[k], i)
        if phase == BACKWARD:  # a gradient's producer needs its weight whole too
            for p, k in owner.items():
                ready = trace.grad_ready_op.get(p)
                if ready is not None and plan.stage[ready] == stage:
                    last[k] = max(last[k], ready)
        for k, u in enumerate(unit_list):
            start = unit_list[k - 1].first_op if k else u.first_op
            for r in range(micro_batches):
                key = f"mb{r}:zero3 gathered {phase} stage{stage} unit{k}"
                sizes[key] = u.nbytes
                allocs.setdefault((start, r), []).append(key)
                if last[k] != start:  # allocated and freed by one step: a write alone spans it
                    frees.setdefault((last[k], r), []).append(key)
    steps = {at: (tuple(frees.get(at, ())), tuple(allocs.get(at, ()))) for at in {*frees, *allocs}}
    return GatheredCopies(steps, sizes)


def bytes_per_step(program: Sequence[tuple[Sequence[str], Sequence[str]]], sizes: dict[str, int]) -> list[int]:
    """Bytes of the keys in ``sizes`` alive at each step of ``program`` ((reads, writes) per
    step), each from its first to its last appearance."""
    span: dict[str, list[int]] = {}
    for j, (reads, writes) in enumerate(program):
        for k in (*reads, *writes):
            if k in sizes:
                span.setdefault(k, [j, j])[1] = j
    return alive_bytes(span, sizes, len(program))


def alive_bytes(span: dict[str, list[int]], sizes: dict[str, int], steps: int) -> list[int]:
    """Bytes alive at each of ``steps`` steps, key k (``sizes[k]`` bytes) from step ``span[k][0]``
    to step ``span[k][1]``."""
    alive = np.zeros(steps + 1, dtype=np.int64)
    for k, (first, last) in span.items():
        alive[first] += sizes[k]
        alive[last + 1] -= sizes[k]
    return np.cumsum(alive[:-1]).tolist()
