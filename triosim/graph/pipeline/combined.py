"""Megatron-Core's combined 1F1B schedule (``--moe-a2a-overlap``, Megatron-LM's
``--overlap-moe-expert-parallel-comm``) in a pipeline rank's program: the blocks that run as
forward-backward pairs (:func:`~triosim.graph.pipeline.schedules.combined_pairs`) are built as
two chains from the same start, both done before the next block, so that the GPU computes one
block's ops while the other's all-to-alls run (Megatron-Core's two streams,
``TransformerLayerSchedulePlan.run``: one's attention beside the other's combine, one's experts
beside the other's dispatch) and the scheduler runs whichever compute is ready. On the last
stage a pair is one micro-batch's forward and its own backward, which needs the forward's loss:
its chain starts when the forward's ends."""

from __future__ import annotations

from ...errors import ConfigError
from ..composition_state import CompositionState
from .schedules import combined_pairs, interleaved_warmup


class CombinedPairs:
    """The pairs of one rank's block ``order`` (none without the flag), and the chains' ends
    while a pair is built."""

    def __init__(self, b: CompositionState, order: list, p: int) -> None:
        self.replicas = b.replicas
        self.pairs = _pairs(b, order, p)
        # The last stage pairs a micro-batch's forward with its own backward (Megatron-Core's
        # combined step there): the backward needs the forward's loss, so its chain starts when
        # the forward's ends, not beside it.
        self.chained = {pos for pos, role in self.pairs.items()
                        if role == 1 and order[pos][1:] == order[pos - 1][1:]}
        self.start: dict = {}  # replica -> what the pair's blocks start after
        self.first_end: dict = {}  # replica -> what the pair's first block ended with

    def before(self, pos: int, last: dict) -> None:
        """Set ``last`` (replica -> the tasks the next block waits for) for block ``pos``: after a
        pair, both its chains' ends; for a pair's second block, the pair's start."""
        if self.pairs.get(pos - 1) == 1:
            last.update({rep: list(dict.fromkeys([*self.first_end[rep], *last[rep]])) for rep in self.replicas})
        role = self.pairs.get(pos)
        if role == 0:
            self.start = {rep: list(last[rep]) for rep in self.replicas}
        elif role == 1:
            self.first_end = {rep: list(last[rep]) for rep in self.replicas}
            if pos not in self.chained:
                last.update({rep: list(self.start[rep]) for rep in self.replicas})


def _pairs(b: CompositionState, order: list, p: int) -> dict[int, int]:
    if not getattr(b.strategy, "moe_a2a_overlap", False) or b.preset is not None:
        return {}
    ranks, plan = b.ranks, b.plan
    if plan.virtual > 1:
        return combined_pairs(order, interleaved_warmup(ranks.pp, len(b.fractions), p, plan.virtual))
    if ranks.pp > 1:
        raise ConfigError("--moe-a2a-overlap with --pp 2 or more needs --schedule interleaved (Megatron-Core: the "
                          "virtual pipeline size must be given)")
    if b.strategy.schedule == "gpipe":
        raise ConfigError("--moe-a2a-overlap pairs each backward with the next forward: not with --schedule gpipe")
    return combined_pairs(order, None)


__all__ = ["CombinedPairs"]
