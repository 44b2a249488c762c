"""Integer-coded view of a trace's buffers: the per-op buffer lists as flat numpy arrays.

A trace of 200k ops has half a million buffers. Keyed by tensor ID, every pass over them is a
dictionary lookup per buffer, and tables that large miss the processor's caches: a single pass
costs a sizeable fraction of a second. Coded as integers (a buffer's position in
``trace.tensors``), the same pass is one array operation of a few milliseconds. The string-keyed
facts of :class:`triosim.trace.Trace` stay the interface; this is what large passes run on.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np


@dataclass(frozen=True)
class BufferColumns:
    """Buffer ``c`` is tensor ``ids[c]``; ``read_code[k]`` is read by op ``read_op[k]`` (the pairs
    in op order, each op's reads in its list's order), and likewise for writes."""

    ids: list[str]
    index: dict[str, int]
    nbytes: np.ndarray  # int64 per buffer
    read_code: np.ndarray
    read_op: np.ndarray
    write_code: np.ndarray
    write_op: np.ndarray

    def codes(self, buffer_ids) -> np.ndarray:
        """The codes of ``buffer_ids`` (tensor IDs)."""
        return np.fromiter(map(self.index.__getitem__, buffer_ids), dtype=np.int64)

    def mask(self, buffer_ids) -> np.ndarray:
        """A bool per buffer: True for ``buffer_ids``."""
        out = np.zeros(len(self.ids), dtype=bool)
        out[self.codes(buffer_ids)] = True
        return out


def _pairs(lists: list[tuple[str, ...]], index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    codes = np.fromiter(map(index.__getitem__, chain.from_iterable(lists)), dtype=np.int64, count=int(lengths.sum()))
    return codes, np.repeat(np.arange(len(lists), dtype=np.int64), lengths)


def buffer_columns(tensors: dict, reads: list[tuple[str, ...]], writes: list[tuple[str, ...]]) -> BufferColumns:
    """The columns of a trace's tensors and per-op buffer lists."""
    ids = list(tensors)
    index = dict(zip(ids, range(len(ids))))
    nbytes = np.fromiter((t.bytes for t in tensors.values()), dtype=np.int64, count=len(ids))
    read_code, read_op = _pairs(reads, index)
    write_code, write_op = _pairs(writes, index)
    return BufferColumns(ids, index, nbytes, read_code, read_op, write_code, write_op)


def first_op(codes: np.ndarray, ops: np.ndarray, count: int, none: int) -> np.ndarray:
    """Per buffer, the first op among the (code, op) pairs (pairs in op order), else ``none``."""
    out = np.full(count, none, dtype=np.int64)
    seen, at = np.unique(codes, return_index=True)
    out[seen] = ops[at]
    return out


def first_position(codes: np.ndarray, count: int) -> np.ndarray:
    """Per buffer, the position of its first pair (``len(codes)`` if none): sorting by it gives
    the order in which a walk over the ops first meets each buffer."""
    out = np.full(count, len(codes), dtype=np.int64)
    seen, at = np.unique(codes, return_index=True)
    out[seen] = at
    return out


def last_op(codes: np.ndarray, ops: np.ndarray, count: int, none: int) -> np.ndarray:
    """Per buffer, the last op among the (code, op) pairs (pairs in op order), else ``none``."""
    out = np.full(count, none, dtype=np.int64)
    seen, at = np.unique(codes[::-1], return_index=True)
    out[seen] = ops[::-1][at]
    return out
