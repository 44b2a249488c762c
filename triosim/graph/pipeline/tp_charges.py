"""How a pipeline rank's tensor-parallel collectives are charged in a representative build: a
collective's charge (its time on the links, in closed form) found once per op, kind and bytes and
reused for every micro-batch of that size (:mod:`triosim.graph.pipeline.rank_program`)."""

from __future__ import annotations

from ..collectives.group_comm import Charge, GroupComm, wire_bytes_per_gpu
from ..composition_state import CompositionState
from ..rank_map import RankMap


def charges_once(b: CompositionState, comm: GroupComm, tp_group: tuple[int, ...]) -> bool:
    """Whether a stage's TP collectives are added from a charge found once per (op, bytes): in a
    representative build (replica (0, 0) alone, collectives in closed form) on TP groups of 2 or more."""
    return b.replicas == [(0, 0)] and not comm.exact and len(tp_group) > 1


def tp_charge(comm: GroupComm, charged: dict, c, nbytes: int, group: tuple[int, ...],
               parallel) -> tuple[Charge, float]:
    """The charge of TP collective ``c`` with ``nbytes`` on ``group`` and the bytes each GPU
    sends, found once per (op, kind, bytes) (``charged`` keeps them): micro-batches of one size
    repeat the same collective; one op may carry a reduce-scatter and an all-gather."""
    key = (c.op, c.kind, nbytes)
    hit = charged.get(key)
    if hit is None:
        charge = comm.charge(c.kind, group, nbytes, parallel)
        assert charge is not None  # representative, group of 2 or more (charges_once)
        hit = charged[key] = (charge, wire_bytes_per_gpu(c.kind, len(group), nbytes))
    return hit


def tp_groups_of(ranks: RankMap, s: int):
    """The TP groups of pipeline stage ``s``, one per data rank (in order)."""
    return (ranks.tp_group(d, s) for d in range(ranks.data))


__all__ = ["charges_once", "tp_charge", "tp_groups_of"]
