"""Each GPU's program as its memory plan reads it: ``gpu -> [(task, ops, micro-batch or None)]``.

A step is a task and the ops it runs. The GPUs of a pipeline rank run the same steps, so the
memory plan reads one GPU's list for the ops and each GPU's tasks only for the timeline's memory
counter. An exact case-3 run adds each step on 4,096 GPUs at once, as one column of consecutive
tasks: an entry per GPU took a twentieth of the run. :class:`StepLists` keeps such a column as
one record and writes a GPU's entries out when its list is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import count

Step = tuple[int, tuple[int, ...], "int | None"]


class StepLists(dict):
    """A dict ``gpu -> list of steps`` whose columns (:meth:`add_column`) are written into each
    GPU's list when ``[gpu]`` reads it, in the order the steps were added. Add a GPU's steps
    through ``[gpu]`` (its list, written out) or :meth:`append`; a list taken with ``[gpu]`` is
    only current until the next column that includes the GPU."""

    def __init__(self) -> None:
        super().__init__()
        self._stamp = count()
        # per GPU: (its columns' (stamp, first task, ops, mb) list, its position there, how many it has written out)
        self._in: dict[int, list] = {}
        self._later: dict[int, list[tuple[int, Step]]] = {}  # steps appended while columns were pending

    def start(self, gpus: Sequence[int]) -> None:
        """Empty programs for ``gpus`` (a pipeline rank's built GPUs, in column order)."""
        columns: list[tuple[int, int, tuple[int, ...], int | None]] = []
        for k, gpu in enumerate(gpus):
            dict.__setitem__(self, gpu, [])
            self._in[gpu] = [columns, k, 0]
            self._later.pop(gpu, None)

    def add_column(self, gpus: Sequence[int], first: int, ops: tuple[int, ...], r: int | None) -> None:
        """The step running ``ops`` of micro-batch ``r`` on every GPU of ``gpus`` (those of the
        last :meth:`start`, in its order), as tasks ``first``, ``first + 1``, …"""
        self._in[gpus[0]][0].append((next(self._stamp), first, ops, r))

    def append(self, gpu: int, step: Step) -> None:
        """One more step of ``gpu``."""
        where = self._in.get(gpu)
        if where is not None and where[2] < len(where[0]):  # after columns not yet written out
            self._later.setdefault(gpu, []).append((next(self._stamp), step))
        else:
            dict.__getitem__(self, gpu).append(step)

    def __getitem__(self, gpu: int) -> list[Step]:
        steps = dict.__getitem__(self, gpu)
        where = self._in.get(gpu)
        if where is not None and where[2] < len(where[0]):
            columns, k, done = where
            later = self._later.pop(gpu, None)
            if later:  # steps appended between the columns: merged in the order they came
                pending = [(stamp, (first + k, ops, r)) for stamp, first, ops, r in columns[done:]]
                steps.extend(step for _stamp, step in sorted(pending + later))
            else:
                steps.extend([(first + k, ops, r) for _stamp, first, ops, r in columns[done:]])
            where[2] = len(columns)
        return steps

    def tasks(self, gpu: int) -> StepTasks:
        """``gpu``'s step tasks, written out only when read (the timeline's memory counter)."""
        return StepTasks(self, gpu)


class StepTasks(Sequence):
    """The tasks of one GPU's steps, read from its :class:`StepLists` list on first use."""

    def __init__(self, lists: StepLists, gpu: int) -> None:
        self._lists, self._gpu = lists, gpu
        self._tasks: tuple[int, ...] | None = None

    def _all(self) -> tuple[int, ...]:
        if self._tasks is None:
            self._tasks = tuple(task for task, _ops, _r in self._lists[self._gpu])
        return self._tasks

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, k):
        return self._all()[k]

    def __iter__(self) -> Iterator[int]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:  # as the tuple it stands for
        return isinstance(other, Sequence) and self._all() == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._all())


__all__ = ["StepLists", "StepTasks"]
