"""Closed-form collective times on a platform's links, as the planner's profile charges them:
exact at every size on small groups, a straight line between the powers of two around a size on
large ones (:class:`CollectiveCosts`, a base of :class:`~triosim.plan.profile.ModelProfile`)."""

from __future__ import annotations

import numpy as np

from ..graph.collectives.cost import collective_cost

EXACT_GROUP = 8  # collectives on groups up to this size are costed exactly at every size


class CollectiveCosts:
    """Collective seconds on ``self.platform``, cached per (op, group) in ``self._coll``."""

    def collective_s(self, op: str, group: tuple[int, ...], nbytes: int) -> float:
        """Seconds of one collective on ``group``'s links: its closed form (cached per size) on
        groups of up to ``EXACT_GROUP`` GPUs. On larger groups, where one closed form takes tens
        of milliseconds to work out, the closed forms at the powers of two around ``nbytes``,
        joined by a straight line: exact while both use the same algorithm and protocol (the
        time is then latency + bytes / bandwidth), a chord of the faster one's curve where the
        choice changes in between."""
        if len(group) < 2 or nbytes <= 0:
            return 0.0
        exact = self._exact_costs(op, group)
        if len(group) <= EXACT_GROUP:
            return exact(nbytes)
        k = max(0, int(nbytes).bit_length() - 1)
        lo, hi = 1 << k, 1 << (k + 1)
        if lo == nbytes:
            return exact(lo)
        a, b = exact(lo), exact(hi)
        return a + (b - a) * (nbytes - lo) / (hi - lo)

    def collective_many(self, op: str, group: tuple[int, ...], sizes: np.ndarray) -> np.ndarray:
        """:meth:`collective_s` of every size in ``sizes`` (integer bytes), the same floats: the
        group is looked up once (hashing a 1,000-GPU tuple per bucket was a hot spot) and, on
        large groups, the straight lines are drawn with numpy."""
        sizes = np.asarray(sizes, dtype=np.int64)
        out = np.zeros(len(sizes))
        live = sizes > 0
        if len(group) < 2 or not live.any():
            return out
        exact = self._exact_costs(op, group)
        if len(group) <= EXACT_GROUP:
            return np.array([exact(int(n)) if n > 0 else 0.0 for n in sizes.tolist()])
        n = sizes[live]
        k = np.frexp(n.astype(float))[1] - 1  # bit_length - 1, exact below 2**53
        lo = np.left_shift(np.int64(1), k.astype(np.int64))
        between = n != lo  # a power of two is its own closed form: no line to draw
        a_of = {int(e): exact(1 << int(e)) for e in np.unique(k)}
        b_of = {int(e): exact(1 << (int(e) + 1)) for e in np.unique(k[between])}
        a = np.array([a_of[e] for e in k.tolist()])
        b = np.array([b_of[e] if inside else a_of[e] for e, inside in zip(k.tolist(), between.tolist())])
        # the same operations, in the same order, as the scalar form (n - lo is 0 at a power of two)
        out[live] = a + (b - a) * (n - lo).astype(float) / lo.astype(float)
        return out

    def _exact_costs(self, op: str, group: tuple[int, ...]):
        """The exact closed form on ``group`` as a function of bytes, cached per size."""
        key = (op, group)
        costs = self._coll.get(key)
        if costs is None:
            costs = self._coll[key] = {}
        platform = self.platform

        def exact(nbytes: int) -> float:
            hit = costs.get(nbytes)
            if hit is None:
                hit = costs[nbytes] = collective_cost(platform, group, op, int(nbytes)).seconds
            return hit

        return exact


__all__ = ["EXACT_GROUP", "CollectiveCosts"]
