"""Which task completes each tensor-parallel collective: ``(op, micro-batch, replica) -> {GPU: task}``.

The pipeline builders look up, for an op's TP collective in a micro-batch, the task after which
its result is there (the ops reading it wait for that task, a send of it leaves after it). A
1T run has 6.5 * 10^5 such collectives, almost all in blocks added from a template
(:mod:`triosim.graph.pipeline.block_replay`): a dict entry and a one-GPU dict each took a
quarter of a second to make and as long to free. :class:`TpDone` is that dict, with the
replayed blocks' entries kept as one record per block and spelled out when looked up.
"""

from __future__ import annotations

from itertools import count

from .recorded_dict import RecordedDict


class TpDone(RecordedDict):
    """A dict ``(op, r, d) -> {gpu: task}`` whose entries of replayed blocks (replica row 0) are
    found from their block's template: :meth:`get`, ``in`` and ``[]`` see them, iteration and
    ``len`` see only the entries set directly (what a block built op by op adds). An op belongs
    to one block and a block of a micro-batch is added once, so no key is in both."""

    def __init__(self) -> None:
        super().__init__()
        self._ids = count()
        self._where: dict[int, list[tuple[int, int, int]]] = {}  # op -> [(template, its GPU, task offset)]
        self._first: dict[tuple[int, int], int] = {}  # (template, micro-batch) -> the block's first task

    def template(self, entries: list[tuple[int, int, int]]) -> int:
        """Register a template's (op, gpu, offset of its task in the block) entries; its number."""
        number = next(self._ids)
        for op, gpu, k in entries:
            self._where.setdefault(op, []).append((number, gpu, k))
        return number

    def add_block(self, template: int, r: int, first: int) -> None:
        """Template ``template``'s block of micro-batch ``r`` was added from task ``first`` on."""
        self._first[(template, r)] = first

    def _recorded(self, key: tuple[int, int, int]) -> dict[int, int] | None:
        op, r, d = key
        if d != 0:
            return None
        found, first = None, -1
        for number, gpu, k in self._where.get(op, ()):
            base = self._first.get((number, r), -1)
            if base > first:  # the block added last wins, as dict.update would have it
                found, first = (gpu, base + k), base
        return None if found is None else {found[0]: found[1]}

__all__ = ["TpDone"]
