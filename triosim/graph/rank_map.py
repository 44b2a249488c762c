"""Rank mapping of a hybrid run: which GPU holds data-parallel replica d, context-parallel rank c,
tensor-parallel rank t and pipeline stage s, and the GPU groups each collective runs on.

The rank is a mixed-radix number whose digits are the coordinates; ``order`` lists the axes
innermost (fastest-varying) first. With the default ``tp,pp,dp`` the T GPUs of a
tensor-parallel group are consecutive ranks, so on ``nvlink-cluster`` with T dividing the GPUs
per node they sit inside one NVSwitch node; pipeline neighbours come next and data-parallel
replicas are farthest apart. The context-parallel axis sits right after tp unless the order
names it (``tp,cp,pp,dp``), as in Megatron-Core's default order ``tp-cp-ep-dp-pp``.

**Data ranks.** Context-parallel ranks share each sample (each holds 1/cp of its sequence) and
reduce gradients together with the data-parallel replicas (Megatron-Core's data-parallel group
"with context parallelism"). The composition therefore numbers the ``dp × cp`` GPUs of a
(tensor rank, stage) as *data ranks* ``d = replica · cp + c``: :attr:`RankMap.data` of them,
every one a replica of the model, one gradient group (:meth:`RankMap.dp_group`). Without
context parallelism a data rank is a data-parallel replica.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .strategy import AXES, Strategy, with_context_axis


@dataclass(frozen=True)
class RankMap:
    """GPU of every (data rank, tp, pp) coordinate for degrees ``dp × tp × pp × cp``."""

    dp: int
    tp: int
    pp: int
    order: tuple[str, ...] = AXES
    cp: int = 1

    @property
    def size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def data(self) -> int:
        """Data ranks per (tensor rank, stage): dp × cp, the gradient group's size."""
        return self.dp * self.cp

    @cached_property
    def _strides(self) -> dict[str, int]:
        degree = {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp}
        strides, step = {}, 1
        for axis in with_context_axis(self.order):
            strides[axis] = step
            step *= degree[axis]
        return strides

    def rank(self, d: int, t: int, s: int) -> int:
        """GPU of data rank ``d`` (replica d // cp, context rank d % cp), tensor-parallel rank
        ``t``, pipeline stage ``s``."""
        st = self._strides
        if self.cp == 1:
            return d * st["dp"] + t * st["tp"] + s * st["pp"]
        replica, c = divmod(d, self.cp)
        return replica * st["dp"] + c * st["cp"] + t * st["tp"] + s * st["pp"]

    def coords(self, gpu: int) -> tuple[int, int, int]:
        """(d, t, s) of ``gpu`` (``d`` its data rank); the inverse of :meth:`rank`."""
        degree = {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp}
        out = {}
        for axis in with_context_axis(self.order):
            gpu, out[axis] = divmod(gpu, degree[axis])
        return out["dp"] * self.cp + out["cp"], out["tp"], out["pp"]

    def tp_group(self, d: int, s: int) -> tuple[int, ...]:
        """The tensor-parallel peers of data rank ``d`` on stage ``s``, in TP-rank order."""
        return tuple(self.rank(d, t, s) for t in range(self.tp))

    @cached_property
    def _dp_groups(self) -> dict[tuple[int, int], tuple[int, ...]]:
        return {}

    def dp_group(self, t: int, s: int) -> tuple[int, ...]:
        """Every data rank of TP rank ``t`` on stage ``s`` (dp × cp GPUs): gradients meet here,
        and ZeRO shards over them."""
        # Kept per (t, s): a ZeRO-3 build asks for the same group at every unit and micro-batch.
        groups = self._dp_groups
        group = groups.get((t, s))
        if group is None:
            group = groups[(t, s)] = tuple(self.rank(d, t, s) for d in range(self.data))
        return group

    def cp_group(self, d: int, t: int, s: int) -> tuple[int, ...]:
        """The context-parallel peers of data rank ``d`` (same replica, TP rank and stage), in
        context-rank order: the ring that passes keys and values."""
        first = d - d % self.cp
        return tuple(self.rank(first + c, t, s) for c in range(self.cp))

    def stage_gpus(self, d: int, t: int) -> tuple[int, ...]:
        """GPU of each pipeline stage of data rank ``d``, TP rank ``t``."""
        return tuple(self.rank(d, t, s) for s in range(self.pp))


def rank_map(strategy: Strategy, num_gpus: int) -> RankMap:
    """The rank map of ``strategy``'s degrees on ``num_gpus`` GPUs (its order shown with cp only
    when there is context parallelism)."""
    dp, tp, pp = strategy.degrees(num_gpus)
    cp = strategy.context_degree
    order = tuple(strategy.rank_order)
    if cp > 1:
        order = with_context_axis(order)
    elif "cp" in order:
        order = tuple(a for a in order if a != "cp")
    return RankMap(dp, tp, pp, order, cp)
