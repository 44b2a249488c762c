"""Integer-coded view of a trace's buffers: the per-op buffer lists as flat numpy arrays.

A trace of 200k ops has half a million buffers. Keyed by tensor ID, every pass over them is a
dictionary lookup per buffer, and tables that large miss the processor's caches: a single pass
costs a sizeable fraction of a second. Coded as integers (a buffer's position in
``trace.tensors``), the same pass is one array operation of a few milliseconds. The string-keyed
facts of :class:`triosim.trace.dataflow.Trace` stay the interface; this is what large passes run on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain, repeat
from operator import attrgetter

import numpy as np

from .tensor_table import column_or_none


@dataclass(frozen=True)
class BufferColumns:
    """Buffer ``c`` is tensor ``ids[c]``; ``read_code[k]`` is read by op ``read_op[k]`` (the pairs
    in op order, each op's reads in its list's order), and likewise for writes. ``known``: ID
    tuples whose codes are at hand already, as (that very tuple, its codes): the trace's external
    buffers and parameters, which :func:`triosim.trace.dataflow.derive` finds as codes."""

    ids: list[str]
    nbytes: np.ndarray  # int64 per buffer
    read_code: np.ndarray
    read_op: np.ndarray
    write_code: np.ndarray
    write_op: np.ndarray
    known: tuple[tuple[tuple[str, ...], np.ndarray], ...] = field(default=(), repr=False, compare=False)

    @cached_property
    def index(self) -> dict[str, int]:
        """Tensor ID -> code (built on first use: half a million entries take a while)."""
        return dict(zip(self.ids, range(len(self.ids))))

    def codes(self, buffer_ids) -> np.ndarray:
        """The codes of ``buffer_ids`` (tensor IDs)."""
        for ids, codes in self.known:
            if ids is buffer_ids:
                return codes
        return np.fromiter(map(self.index.__getitem__, buffer_ids), dtype=np.int64)

    def mask(self, buffer_ids) -> np.ndarray:
        """A bool per buffer: True for ``buffer_ids``."""
        out = np.zeros(len(self.ids), dtype=bool)
        out[self.codes(buffer_ids)] = True
        return out


@dataclass(frozen=True)
class OpTensorCodes:
    """The ops' own tensor lists (``op.inputs``, ``op.outputs``) coded (tensor ``ids[c]`` has code
    ``c``): what the fast trace reader finds while checking that every ID is a tensor, and
    ``derive`` turns into the buffer columns without looking the IDs up again."""

    ids: list[str]
    input_code: np.ndarray
    input_op: np.ndarray
    output_code: np.ndarray
    output_op: np.ndarray


def coded_pairs(lists: list[tuple[str, ...]], index: dict[str, int]) -> tuple[np.ndarray, np.ndarray] | None:
    """(code, op) of every ID of ``lists`` in order; None when an ID is not in ``index``."""
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    codes = np.fromiter(map(index.get, chain.from_iterable(lists), repeat(-1)), dtype=np.int64,
                        count=int(lengths.sum()))
    if len(codes) and int(codes.min()) < 0:
        return None
    return codes, np.repeat(np.arange(len(lists), dtype=np.int64), lengths)


def op_tensor_codes(tensors: dict, ops) -> OpTensorCodes:
    index = dict(zip(tensors, range(len(tensors))))
    inputs = coded_pairs([op.inputs for op in ops], index)
    outputs = coded_pairs([op.outputs for op in ops], index)
    if inputs is None or outputs is None:
        raise KeyError("an op lists a tensor the trace does not define")
    return OpTensorCodes(list(tensors), *inputs, *outputs)


def _pairs(lists: list[tuple[str, ...]], index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    pairs = coded_pairs(lists, index)
    if pairs is None:
        raise KeyError("a buffer list holds an ID that is not a tensor")
    return pairs


def buffer_lists(lists: list[tuple[str, ...]], code: np.ndarray, op: np.ndarray, base: np.ndarray,
                 resolve) -> tuple[list[tuple[str, ...]], np.ndarray, np.ndarray]:
    """Each op's buffer list and the coded (buffer, op) pairs, from the op's own tensor list and
    its codes: aliases resolved (``base``: a tensor's code -> its buffer's), repeats dropped
    (the first kept). Only the lists that change go through ``resolve`` (the per-list Python
    rule, :func:`triosim.trace.dataflow._buffers`); the others are kept as they are."""
    count = len(base)
    buffer = base[code]
    changed = np.zeros(len(lists), dtype=bool)
    changed[op[buffer != code]] = True  # lists with an aliased tensor
    # A repeat inside an op is a repeated (op, buffer) key; keep each key's first pair.
    _, first = np.unique(op * count + buffer, return_index=True)
    if len(first) < len(code):
        repeated = np.ones(len(code), dtype=bool)
        repeated[first] = False
        changed[op[repeated]] = True
        keep = np.sort(first)
        buffer, op = buffer[keep], op[keep]
    out = list(lists)
    fix = np.flatnonzero(changed).tolist()
    for i, x in zip(fix, resolve([lists[i] for i in fix])):
        out[i] = x
    return out, buffer, op


def buffer_columns(tensors: dict, reads: list[tuple[str, ...]], writes: list[tuple[str, ...]]) -> BufferColumns:
    """The columns of a trace's tensors and per-op buffer lists."""
    ids = list(tensors)
    index = dict(zip(ids, range(len(ids))))
    nbytes = tensor_bytes(tensors)
    read_code, read_op = _pairs(reads, index)
    write_code, write_op = _pairs(writes, index)
    return BufferColumns(ids, nbytes, read_code, read_op, write_code, write_op)


def tensor_bytes(tensors: dict) -> np.ndarray:
    """Each tensor's bytes, in the order of ``tensors`` (the size column)."""
    column = column_or_none(tensors, "nbytes")
    if column is not None:
        return column
    return np.fromiter(map(attrgetter("bytes"), tensors.values()), dtype=np.int64, count=len(tensors))


def first_position(codes: np.ndarray, count: int) -> np.ndarray:
    """Per buffer, the position of its first pair (``len(codes)`` if none): sorting by it gives
    the order in which a walk over the ops first meets each buffer."""
    out = np.full(count, len(codes), dtype=np.int64)
    seen, at = np.unique(codes, return_index=True)
    out[seen] = at
    return out


def first_op(codes: np.ndarray, ops: np.ndarray, count: int, none: int,
             position: np.ndarray | None = None) -> np.ndarray:
    """Per buffer, the first op among the (code, op) pairs (pairs in op order), else ``none``;
    ``position``: :func:`first_position` of ``codes`` when already at hand."""
    pos = first_position(codes, count) if position is None else position
    found = pos < len(codes)
    out = np.full(count, none, dtype=np.int64)
    out[found] = ops[pos[found]]
    return out


def last_op(codes: np.ndarray, ops: np.ndarray, count: int, none: int) -> np.ndarray:
    """Per buffer, the last op among the (code, op) pairs (pairs in op order), else ``none``."""
    out = np.full(count, none, dtype=np.int64)
    seen, at = np.unique(codes[::-1], return_index=True)
    out[seen] = ops[::-1][at]
    return out
