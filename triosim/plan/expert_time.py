"""Expert parallelism in the plan's estimate (an MoE trace, ``--ep``/``--etp``).

One expert rank's profile (:meth:`~triosim.plan.profile.ModelProfile.for_context` with its
``experts`` key) takes the DAG's own split, :func:`~triosim.graph.expert.plan.expert_split`: expert
weights, gradients and optimizer state ÷ (ep · etp), sharded over the expert-data-parallel group
under ZeRO (÷ tp · cp · dp in all), the grouped GEMMs at the busiest rank's load and the
optimizer's share. On it:

- each grouped GEMM's token exchange (dispatch before, combine after, and their gradients) is the
  DAG's list of collectives (:func:`~triosim.graph.expert.dispatch.exchanges`, on the groups of
  GPU 0's expert ranks), each charged in closed form and added to its op: the DAG runs them in
  the compute stream's order (the GEMM waits for its dispatch, the un-permutation for the
  combine), so nothing hides them;
- the buffer each exchange receives into is held while it runs
  (:func:`~triosim.graph.expert.dispatch.exchange_buffer_bytes`), as the DAG's memory plan holds it;
- the expert gradients are reduced (and, at ZeRO-1/2, their updated values gathered) over the
  expert-data-parallel group after the dense ones (:func:`edp_group_of`).

The ZeRO key of the split: which of the expert buffers ZeRO shards depends on the stage (1:
optimizer state; 2: and gradients) and on whether there are data ranks to shard over, not on
their number (the split's divisor is then tp whatever dp · cp is: ep · etp · edp / (dp · cp)).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..graph.expert.dispatch import edp_group, exchange_buffer_bytes, exchanges
from ..graph.expert.plan import expert_ops, expert_split
from ..graph.pipeline.schedules import FORWARD
from ..graph.rank_map import RankMap
from ..trace.precision import gathered_parameter_bytes


def is_moe(profile) -> bool:
    """Whether the profile's trace has grouped expert GEMMs (found once, on the root)."""
    root = profile
    while root.parent is not None:
        root = root.parent
    hit = getattr(root, "_is_moe", None)
    if hit is None:
        hit = root._is_moe = bool(expert_ops(root.raw)[1])
    return hit


def expert_key(c, moe: bool) -> tuple[int, int, int]:
    """The ``experts`` key of candidate ``c``'s profile: (ep, etp, the ZeRO stage that shards
    expert state, 0 without data ranks); (1, 1, 0) on a dense model."""
    if not moe:
        return (1, 1, 0)
    return (c.ep, c.etp, min(c.zero, 2) if c.data > 1 else 0)


def expert_share(profile, batch: int, tpp) -> tuple[object, object]:
    """``tpp`` for one expert rank of ``profile``'s key and its expert plan (the DAG's
    :func:`~triosim.graph.expert.plan.expert_split`, applied where the build applies it: ep or
    etp above 1, or tp above 1); ``(tpp, None)`` elsewhere."""
    ep, etp, zero = profile.experts
    if not (ep > 1 or etp > 1 or tpp.degree > 1) or not is_moe(profile):
        return tpp, None
    dispatcher, imbalance = profile.moe
    # data ranks standing for any number of them (module docstring): ep · etp divides tp · data,
    # and there are some to shard over exactly when the key's ZeRO stage is above 0
    data = 2 * ep * etp if zero else ep * etp
    return expert_split(profile.scaled(batch), tpp, ep, data, zero, profile.roles, dispatcher, imbalance, etp)


@dataclass
class _Stage:
    """What :func:`~triosim.graph.expert.dispatch.exchanges` reads of a composition."""

    trace: object
    tpp: object
    ranks: RankMap
    platform: object

    def size(self, buffer: str, fraction: float) -> int:
        """Bytes of an exchanged (activation) buffer on one GPU, as the composition sizes it."""
        t = self.trace.tensors[buffer].bytes
        if buffer not in self.trace.batch_invariant:
            t = int(round(t * fraction))
        div = self.tpp.shard_divisor.get(buffer, 1)
        return -(-t // div) if div > 1 else t


def _plan_ops(profile, batch: int, tp: int, sp: bool):
    """(expert plan, its exchanged ops in this profile's trace) or (None, {})."""
    plan = profile.expert_plan(batch, tp, sp)
    if plan is None or not plan.ops:
        return plan, {}
    if profile.parent is None:
        return plan, plan.ops
    ops = profile.memo.get(("expert ops", batch))
    if ops is None:  # a rewritten trace (re-runs, offload copies): its own grouped GEMMs, found once
        ops = profile.memo[("expert ops", batch)] = expert_ops(profile.scaled(batch))[0]
    return plan, ops


def exchange_seconds(profile, c, batch: int, micro_batch: int) -> dict[int, tuple[object, float]]:
    """Per grouped GEMM with a token exchange, (its :class:`~triosim.graph.expert.plan.ExpertOp`,
    the exchange's seconds in closed form on the groups of GPU 0's expert ranks); empty where
    there is none."""
    sp = c.sequence_parallel and c.tp > 1
    plan, ops = _plan_ops(profile, batch, c.tp, sp)
    if not ops:
        return {}
    trace = profile.scaled(batch)
    stage = _Stage(trace, profile.tensor_plan(batch, c.tp, sp), c.ranks, profile.platform)
    plan = replace(plan, edp=c.tp * c.data // (c.ep * c.etp))
    frac = micro_batch / trace.batch_size
    return {i: (e, sum(profile.collective_s(kind, group, nbytes) for kind, group, nbytes in
                       exchanges(stage, plan, e, frac, 0))) for i, e in ops.items()}


def with_exchanges(pt, profile, c, batch: int, micro_batch: int, speed: float = 1.0):
    """``pt`` with every grouped GEMM's token exchange added to its position's forward or backward
    time and to the op's seconds (module docstring); ``pt`` itself where there is none. ``speed``:
    the compute's speed beside an exchange (the SMs it holds), for the shared-expert overlap."""
    timed = exchange_seconds(profile, c, batch, micro_batch)
    if not timed:
        return pt
    fwd, bwd, op_s = pt.fwd.copy(), pt.bwd.copy(), pt.op_s.copy()
    early = (profile.parent or profile).overlaps.shared
    for i, (e, extra) in timed.items():
        if early and e.when == "before" and e.source is not None:
            extra = exposed_beside(extra, float(pt.op_s[e.source + 1:i].sum()), speed)
        (fwd if profile.phase[i] == FORWARD else bwd)[profile.pos[i]] += extra
        op_s[i] += extra
    return replace(pt, fwd=fwd, bwd=bwd, op_s=op_s)


def exposed_beside(exchange: float, beside: float, speed: float) -> float:
    """Seconds an exchange of ``exchange`` seconds adds to a GPU's stream when it starts with
    ``beside`` seconds of compute (--moe-shared-expert-overlap: the shared expert and what else
    lies between the permutation and the grouped GEMM) that the GEMM also waits for: the compute
    runs at ``speed`` (the SMs the exchange holds) while the exchange runs. Either the compute is
    done first and the exchange's excess shows, or the exchange ends first and the compute has
    lost ``exchange · (1 − speed)`` to it."""
    return max(exchange - beside, exchange * (1.0 - speed))


def expert_held_bytes(profile, batch: int, tp: int, sp: bool, micro_batch: int) -> dict[int, float]:
    """Per exchanging grouped GEMM, the bytes its exchange receives into on one rank while it
    runs (the DAG's memory plan holds them beside the op); empty without exchanges."""
    key = ("expert held", batch, tp, sp, micro_batch)
    hit = profile.memo.get(key)
    if hit is None:
        plan, ops = _plan_ops(profile, batch, tp, sp)
        trace = profile.scaled(batch)
        stage = _Stage(trace, profile.tensor_plan(batch, tp, sp), RankMap(1, tp, 1), profile.platform)
        frac = micro_batch / trace.batch_size
        hit = profile.memo[key] = {i: float(exchange_buffer_bytes(stage, plan, e, frac)) for i, e in ops.items()}
    return hit


def edp_group_of(c) -> tuple[int, ...]:
    """The expert-data-parallel group of GPU 0 (the ranks holding its expert shards), where the
    expert gradients are reduced."""
    return edp_group(c.ranks, c.ep, 0, 0, 0, c.etp)


def expert_params(profile, batch: int, tp: int, sp: bool) -> frozenset[str]:
    """The expert parameters whose gradients go to the expert-data-parallel group (none where
    the DAG has no expert plan)."""
    plan = profile.expert_plan(batch, tp, sp)
    return plan.params if plan is not None else frozenset()


def expert_param_bytes(profile, batch: int, tp: int, sp: bool) -> np.ndarray:
    """Per forward position, the bytes of the expert parameters it first reads as ZeRO-1/2 gathers
    them (one rank's shard), as the DAG sums them for the experts' all-gather."""
    key = ("expert param bytes", batch, tp, sp)
    hit = profile.memo.get(key)
    if hit is not None:
        return hit
    out = profile.memo[key] = np.zeros(profile.positions)
    experts = expert_params(profile, batch, tp, sp)
    if not experts:
        return out
    trace = profile.scaled(batch)
    shard = profile.tensor_plan(batch, tp, sp).shard_divisor
    for p in experts:
        at = profile.first_reader.get(p)
        if at is not None:
            out[at] += -(-gathered_parameter_bytes(trace, p) // shard.get(p, 1))
    return out


__all__ = ["edp_group_of", "exchange_seconds", "expert_held_bytes", "expert_key", "expert_param_bytes", "expert_params", "expert_share", "is_moe",
           "with_exchanges"]
