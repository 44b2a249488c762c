"""Which task ran an op of a micro-batch on a replica: ``(d, t, op, micro-batch) -> task``.

The builders look up the task of an op a later step needs (a crossing buffer's writer, a
bucket's last gradient, the op a tensor-parallel collective follows). An exact case-3 run adds
each such op on 4,096 replicas at once, as one column of consecutive tasks: a dict entry per
replica (a key tuple each) took a twentieth of the run. :class:`TaskOf` is that dict, with a
column kept as one record (the replicas' positions and the column's first task) and found when
looked up.
"""

from __future__ import annotations

from .recorded_dict import RecordedDict

Replica = tuple[int, int]


class TaskOf(RecordedDict):
    """A dict ``(d, t, op, r) -> task`` that also holds columns (:meth:`add_column`): ``[]``,
    :meth:`get` and ``in`` see their entries; iteration and ``len`` see only the entries set
    directly. An op is added either as columns or entry by entry, never both, so no key is in a
    column and set directly; a later column of the same op and micro-batch replaces the earlier
    one, as a later assignment would."""

    def __init__(self) -> None:
        super().__init__()
        # (op, r) -> (replica -> its position in the column, the column's first task)
        self._columns: dict[tuple[int, int], tuple[dict[Replica, int], int]] = {}

    def add_column(self, op: int, r: int, position: dict[Replica, int], first: int) -> None:
        """Replica ``rep`` ran op ``op`` of micro-batch ``r`` as task ``first + position[rep]``."""
        self._columns[(op, r)] = (position, first)

    def column(self, op: int, r: int) -> tuple[dict[Replica, int], int] | None:
        """The column of ``op`` in micro-batch ``r`` (its positions and first task), if added as one."""
        return self._columns.get((op, r))

    def _recorded(self, key) -> int | None:
        if len(key) != 4 or not self._columns:
            return None
        hit = self._columns.get((key[2], key[3]))
        if hit is None:
            return None
        k = hit[0].get((key[0], key[1]))
        return None if k is None else hit[1] + k


__all__ = ["TaskOf"]
