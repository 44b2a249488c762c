"""Rank mapping of a hybrid run: which GPU holds data-parallel replica d, tensor-parallel rank t
and pipeline stage s, and the GPU groups each collective runs on.

The rank is a mixed-radix number whose digits are the three coordinates; ``order`` lists the
axes innermost (fastest-varying) first. With the default ``tp,pp,dp`` the T GPUs of a
tensor-parallel group are consecutive ranks, so on ``nvlink-cluster`` with T dividing the GPUs
per node they sit inside one NVSwitch node; pipeline neighbours come next and data-parallel
replicas are farthest apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .strategy import AXES


@dataclass(frozen=True)
class RankMap:
    """GPU of every (dp, tp, pp) coordinate for degrees ``dp × tp × pp``."""

    dp: int
    tp: int
    pp: int
    order: tuple[str, ...] = AXES

    @property
    def size(self) -> int:
        return self.dp * self.tp * self.pp

    @cached_property
    def _strides(self) -> dict[str, int]:
        degree = {"dp": self.dp, "tp": self.tp, "pp": self.pp}
        strides, step = {}, 1
        for axis in self.order:
            strides[axis] = step
            step *= degree[axis]
        return strides

    def rank(self, d: int, t: int, s: int) -> int:
        """GPU of data-parallel replica ``d``, tensor-parallel rank ``t``, pipeline stage ``s``."""
        st = self._strides
        return d * st["dp"] + t * st["tp"] + s * st["pp"]

    def coords(self, gpu: int) -> tuple[int, int, int]:
        """(d, t, s) of ``gpu``; the inverse of :meth:`rank`."""
        degree = {"dp": self.dp, "tp": self.tp, "pp": self.pp}
        out = {}
        for axis in self.order:
            gpu, out[axis] = divmod(gpu, degree[axis])
        return out["dp"], out["tp"], out["pp"]

    def tp_group(self, d: int, s: int) -> tuple[int, ...]:
        """The tensor-parallel peers of replica ``d`` on stage ``s``, in TP-rank order."""
        return tuple(self.rank(d, t, s) for t in range(self.tp))

    def dp_group(self, t: int, s: int) -> tuple[int, ...]:
        """The data-parallel replicas of TP rank ``t`` on stage ``s`` (gradients meet here)."""
        return tuple(self.rank(d, t, s) for d in range(self.dp))

    def stage_gpus(self, d: int, t: int) -> tuple[int, ...]:
        """GPU of each pipeline stage of replica ``d``, TP rank ``t``."""
        return tuple(self.rank(d, t, s) for s in range(self.pp))
