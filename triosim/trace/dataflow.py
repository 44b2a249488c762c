"""A trace's data flow: the :class:`Trace` type and the facts :func:`derive` finds in it.

From the ops' tensor lists it works out which op writes and reads which buffer (a view or an
alias of an earlier tensor is that tensor's buffer), which tensors come from outside the step
(parameters, optimizer state, the input batch), the parameter set, the batch-invariant buffers,
and, on first use, the forward op each backward op belongs to and when a gradient is complete.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import chain
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING

import numpy as np

from .buffer_columns import (
    BufferColumns,
    buffer_columns,
    buffer_lists,
    first_op,
    first_position,
    op_tensor_codes,
    tensor_bytes,
)
from .model import PARAMETER_CATEGORIES, Op, Tensor
from .precision import TrainingPrecision
from .tensor_table import column_or_none

if TYPE_CHECKING:
    from ..compute.op_time import OpTimeModel


@dataclass
class Trace:
    """A validated trace plus the data-flow facts derived from it.

    Buffers: a tensor that is read but never written, and shares its storage with a tensor an
    earlier op wrote (a view such as flatten's output or AccumulateGrad's alias of a gradient), is
    mapped to that tensor; every other tensor is its own buffer. ``reads``/``writes`` are per op,
    in buffer IDs, without repeats.
    """

    path: str
    batch_size: int
    ops: list[Op]
    tensors: Mapping[str, Tensor]  # a dict, or a TensorTable (columns) from the pyarrow reader
    alias: dict[str, str] = field(default_factory=dict)
    reads: list[tuple[str, ...]] = field(default_factory=list)
    writes: list[tuple[str, ...]] = field(default_factory=list)
    producer: dict[str, int] = field(default_factory=dict)
    external: tuple[str, ...] = ()
    parameters: tuple[str, ...] = ()
    batch_invariant: frozenset[str] = frozenset()
    # How op times change with the batch (triosim.compute.op_time); None: linear.
    op_time: OpTimeModel | None = None
    # Where ``batch_size`` came from: "argument" (given), "meta.json", or "assumed" (neither: 128).
    batch_source: str = "argument"
    # The optional meta.json beside the CSVs ({} when there is none): device, time source, …
    info: dict = field(default_factory=dict)
    # The dtype the run trains in when its buffers were resized by role (None: as traced), and
    # the buffers that then exist for the whole iteration though the trace first writes them
    # (the gradient buffer); see triosim.graph.data.precision.
    precision: TrainingPrecision | None = None
    preallocated: frozenset[str] = frozenset()
    # (numerator, denominator): the share of an optimizer-state buffer's bytes that the fp32 copy
    # of a 16-bit gradient adds while the optimizer runs (held then only; 0: none).
    gradient_copy: tuple[int, int] = (0, 1)
    # Derived on first use (``consumers``, ``forward_partner``, ``grad_ready_op``): most runs never ask, and on a trace of
    # hundreds of thousands of ops they took a fifth of the loading time.
    _partner: tuple[int | None, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _consumers: dict[str, tuple[int, ...]] | None = field(default=None, init=False, repr=False, compare=False)
    _grad_ready: dict[str, int] | None = field(default=None, init=False, repr=False, compare=False)
    # (tensors, reads, writes, their columns): an init field, so that ``replace`` hands it on;
    # used only while those three are still the very objects the columns were made from.
    _columns: tuple | None = field(default=None, repr=False, compare=False)
    # (ops, tensors, their OpTensorCodes) from the pyarrow reader, likewise.
    _op_codes: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def buffer_columns(self) -> BufferColumns:
        """The buffers and per-op buffer lists as integer-coded arrays (for passes over every
        buffer of a large trace; see :mod:`triosim.trace.buffer_columns`)."""
        cached = self._columns
        if cached is None or cached[0] is not self.tensors or cached[1] is not self.reads or cached[2] is not self.writes:
            cached = self._columns = (self.tensors, self.reads, self.writes,
                                      buffer_columns(self.tensors, self.reads, self.writes))
        return cached[3]

    @property
    def consumers(self) -> dict[str, tuple[int, ...]]:
        """Buffer -> the ops that read it, in op order (in order of first read)."""
        if self._consumers is None:
            self._consumers = _consumers(self.reads)
        return self._consumers

    @property
    def forward_partner(self) -> tuple[int | None, ...]:
        """Per op: the forward op whose activations or weights a backward op reads (else None)."""
        if self._partner is None:
            self._partner = _forward_partners(self.ops, self.reads, self.writes, set(self.parameters))
        return self._partner

    @property
    def grad_ready_op(self) -> dict[str, int]:
        """Per parameter: the backward op after which its gradient is complete."""
        if self._grad_ready is None:
            self._grad_ready = _grad_ready_ops(self.ops, self.reads, self.parameters, self.forward_partner,
                                               {p: self.consumers[p][0] for p in self.parameters})
        return self._grad_ready

    @property
    def time_source(self) -> str | None:
        """``"cpu"`` when the op times were measured on the CPU (meta.json says so), else the
        recorded source (``"kernels"``, ``"cuda"``) or None when unknown."""
        src = self.info.get("time_source")
        if src is None and str(self.info.get("device", "")).startswith("cpu"):
            src = "cpu"
        return str(src) if src is not None else None

    def op_label(self, op: Op) -> str:
        """``op 10 (aten::mm, trace.csv:11)``, as memory errors and reports name an op. A trace
        built from a model card (meta.json ``model_card``) is no file the user wrote: its ops
        are named without the cached file's line."""
        if "model_card" in self.info:
            return f"op {op.op_id} ({op.name})"
        return f"op {op.op_id} ({op.name}, trace.csv:{op.line})"

    def with_batch_source(self, source: str) -> Trace:
        return replace(self, batch_source=source)

    def base(self, tensor_id: str) -> str:
        return self.alias.get(tensor_id, tensor_id)

    def bytes_of(self, buffer_id: str) -> int:
        return self.tensors[buffer_id].bytes

    @property
    def parameter_bytes(self) -> int:
        return sum(self.tensors[p].bytes for p in self.parameters)

    @property
    def total_time_s(self) -> float:
        return sum(op.duration_s for op in self.ops)

    def stage_ops(self, stage: str) -> list[Op]:
        return [op for op in self.ops if op.stage == stage]

    def last_backward_index(self) -> int:
        """Index of the last backward op (or of the last forward op when there is none)."""
        idx = [op.index for op in self.ops if op.stage == "backward"]
        if not idx:
            idx = [op.index for op in self.ops if op.stage == "forward"] or [len(self.ops) - 1]
        return idx[-1]


# ----------------------------------------------------------------------------- derived facts


def _buffers(lists: list[tuple[str, ...]], alias: dict[str, str]) -> list[tuple[str, ...]]:
    """Each op's tensor IDs as buffer IDs (aliases resolved), without repeats, in order."""
    if alias:
        get, aliased = alias.get, alias.keys()
        lists = [x if aliased.isdisjoint(x) else tuple(map(get, x, x)) for x in lists]
    # Most lists have no repeat: keep those tuples as they are.
    return [x if len(x) < 2 or len(set(x)) == len(x) else tuple(dict.fromkeys(x)) for x in lists]


def _resolve_aliases(ops: list[Op], tensors: dict[str, Tensor]) -> dict[str, str]:
    """Map a read-but-never-written tensor to an earlier tensor of the same storage.

    Ops the tracer dropped (views, AccumulateGrad) leave such tensors behind; without this they
    would look like data fetched from outside the step. Storage IDs can be reused by the
    allocator, so only the latest earlier writer (or a parameter) counts, and it must be at
    least as large.
    """
    # Only a storage shared by two tensors can give an alias: most traces of a plain model
    # have none, and then nothing else needs computing.
    storages = column_or_none(tensors, "storages") or list(map(attrgetter("storage"), tensors.values()))
    distinct = set(storages)
    if len(distinct) + storages.count("") - ("" in distinct) == len(storages):
        return {}
    shared = {st for st, c in Counter(storages).items() if c > 1 and st}
    candidates = {tid for tid, t in tensors.items() if t.storage in shared}
    written = set(chain.from_iterable(op.outputs for op in ops))
    unwritten = set(chain.from_iterable(op.inputs for op in ops)) - written
    # Only the storages of unwritten tensors are looked up, and only one shared with another
    # tensor can give an alias: the walk below skips every op that neither reads an unwritten
    # tensor of such a storage nor writes into one.
    unwritten &= candidates
    wanted = {tensors[t].storage for t in unwritten}
    if not wanted:
        return {}
    unwritten = {t for t in unwritten if tensors[t].storage in wanted}
    writers = {t for t in written & candidates if tensors[t].storage in wanted}
    watch = unwritten | writers
    last_writer_by_storage: dict[str, str] = {}
    alias: dict[str, str] = {}
    seen: set[str] = set()
    for op in ops:
        if watch.isdisjoint(op.inputs) and watch.isdisjoint(op.outputs):
            continue
        for tid in op.inputs:
            # Decide at the first read only: a parameter read again after some op wrote a
            # view of its storage (a transposed weight) is still the parameter.
            if tid in seen or tid not in unwritten:
                continue
            seen.add(tid)
            t = tensors[tid]
            base = last_writer_by_storage.get(t.storage) if t.storage else None
            if base is not None and tensors[base].bytes >= t.bytes:
                alias[tid] = base
            elif t.storage and t.category in PARAMETER_CATEGORIES:
                # Parameters live for the whole run, so their storage is never reused:
                # a later unwritten tensor of that storage is a view of the parameter.
                last_writer_by_storage.setdefault(t.storage, tid)
        for tid in op.outputs:
            if tid in writers:
                last_writer_by_storage[tensors[tid].storage] = tid
    return alias


def _consumers(reads: list[tuple[str, ...]]) -> dict[str, tuple[int, ...]]:
    """Buffer -> the ops that read it, in op order; the dictionary is in order of first read."""
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(reads):
        for t in r:
            consumers[t].append(i)
    return dict(zip(consumers.keys(), map(tuple, consumers.values())))


def derive(trace: Trace) -> Trace:
    """Compute the data-flow facts of a trace (idempotent)."""
    ops, tensors = trace.ops, trace.tensors
    n = len(ops)
    given = trace._op_codes
    if given is not None and given[0] is ops and given[1] is tensors:
        codes = given[2]
    else:
        codes = op_tensor_codes(tensors, ops)
    alias = _resolve_aliases(ops, tensors)
    base = np.arange(len(tensors), dtype=np.int64)
    ids, count = codes.ids, len(codes.ids)
    if alias:
        index = dict(zip(ids, range(count)))
        base[list(map(index.__getitem__, alias))] = list(map(index.__getitem__, alias.values()))

    def resolve(lists: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
        return _buffers(lists, alias)

    # The passes over every buffer run on integer codes (see triosim.trace.buffer_columns).
    reads, read_code, read_op = buffer_lists(list(map(attrgetter("inputs"), ops)), codes.input_code, codes.input_op,
                                             base, resolve)
    writes, write_code, write_op = buffer_lists(list(map(attrgetter("outputs"), ops)), codes.output_code,
                                                codes.output_op, base, resolve)
    nbytes = tensor_bytes(tensors)
    first_read = first_op(read_code, read_op, count, n)
    write_position = first_position(write_code, count)
    first_write = first_op(write_code, write_op, count, n, write_position)
    # External: read before (or by the same op as) its first write, or never written; ordered
    # by first read, then ID.
    ext = np.flatnonzero((first_read < n) & (first_write >= first_read))
    ordered = sorted(zip(first_read[ext].tolist(), map(ids.__getitem__, ext.tolist()), ext.tolist()))
    external = list(map(itemgetter(1), ordered))
    # Produced inside the step: written before its first read; in order of first write.
    made = np.flatnonzero((first_write < n) & (first_read > first_write))
    made = made[np.argsort(write_position[made], kind="stable")]
    producer = dict(zip(map(ids.__getitem__, made.tolist()), first_write[made].tolist()))
    # (Column by column: a Python step per external tensor was a noticeable part of a large load.)
    ext_code = np.fromiter(map(itemgetter(2), ordered), dtype=np.int64, count=len(ordered))
    categories = column_or_none(tensors, "categories") or list(map(attrgetter("category"), tensors.values()))
    parameter_like = np.fromiter(map(PARAMETER_CATEGORIES.__contains__, map(categories.__getitem__, ext_code.tolist())),
                                 dtype=bool, count=len(ext_code))
    is_param = np.flatnonzero(parameter_like & (nbytes[ext_code] > 0))
    params = tuple(map(external.__getitem__, is_param.tolist()))
    external_ids = tuple(external)

    # Batch-invariant buffers: parameters, anything an optimizer op touches (gradients,
    # optimizer state) and aliases of those.
    optimizer = np.fromiter(map("optimizer".__eq__, map(attrgetter("stage"), ops)), dtype=bool, count=n)
    touched = np.zeros(count, dtype=bool)
    touched[read_code[optimizer[read_op]]] = True
    touched[write_code[optimizer[write_op]]] = True
    invariant: set[str] = set(params)
    invariant.update(map(ids.__getitem__, np.flatnonzero(touched).tolist()))
    invariant.update(tid for tid, base in alias.items() if base in invariant)

    derived = replace(
        trace,
        alias=alias,
        reads=reads,
        writes=writes,
        producer=producer,
        external=external_ids,
        parameters=params,
        batch_invariant=frozenset(invariant),
    )
    cols = BufferColumns(ids, nbytes, read_code, read_op, write_code, write_op,
                         known=((external_ids, ext_code), (params, ext_code[is_param])))
    derived._columns = (tensors, reads, writes, cols)
    return derived


def _forward_partners(
    ops: list[Op], reads: list[tuple[str, ...]], writes: list[tuple[str, ...]], params: set[str]
) -> tuple[int | None, ...]:
    """For each backward op, the forward op whose activations or weights it reads (else None).

    A backward op reads what its forward op saved: the forward's inputs/outputs (last written by
    that forward op or the one before it) or the forward op's weights. The latest such forward
    op is the partner, which pairs ReluBackward with relu_ and ConvolutionBackward with conv2d.
    A backward op that reads none of these but an input nothing wrote and only one forward op
    read pairs with that op: EmbeddingBackward reads only the token ids and its incoming
    gradient, and goes with the embedding (on the embedding's pipeline stage, not the next
    layer's). An input many forward ops read (rotary tables, masks) names none of them.
    """
    last_fwd_writer: dict[str, int] = {}
    first_fwd_reader: dict[str, int] = {}
    fwd_readers: dict[str, int] = {}  # how many forward ops read each tensor
    partner: list[int | None] = []
    for i, op in enumerate(ops):
        if op.stage == "forward":
            for t in reads[i]:
                first_fwd_reader.setdefault(t, i)
                fwd_readers[t] = fwd_readers.get(t, 0) + 1
            for t in writes[i]:
                last_fwd_writer[t] = i
            partner.append(None)
            continue
        if op.stage != "backward":
            partner.append(None)
            continue
        best: int | None = None
        for t in reads[i]:
            cand = last_fwd_writer.get(t)
            if t in params or cand is None:
                cand = first_fwd_reader.get(t) if t in params else cand
            if cand is not None and (best is None or cand > best):
                best = cand
        if best is None:
            only = [first_fwd_reader[t] for t in reads[i] if t not in last_fwd_writer and t not in params
                    and fwd_readers.get(t) == 1]
            best = max(only, default=None)
        partner.append(best)
    return tuple(partner)


def _grad_ready_ops(
    ops: list[Op],
    reads: list[tuple[str, ...]],
    params: tuple[str, ...],
    partner: tuple[int | None, ...],
    first_read: dict[str, int],
) -> dict[str, int]:
    """The backward op after which each parameter's gradient is complete.

    That is the first backward op that reads the parameter (it computes the weight gradient);
    when none does, the backward op paired with the parameter's first forward reader; else the
    last backward op.
    """
    backward = [i for i, op in enumerate(ops) if op.stage == "backward"]
    last = backward[-1] if backward else len(ops) - 1
    by_partner: dict[int, int] = {}
    for i in backward:
        p = partner[i]
        if p is not None:
            by_partner[p] = max(by_partner.get(p, -1), i)
    first_backward_reader: dict[str, int] = {}  # one pass, not one scan per parameter
    for i in backward:
        for k in reads[i]:
            first_backward_reader.setdefault(k, i)
    ready: dict[str, int] = {}
    for p in params:
        if p in first_backward_reader:
            ready[p] = first_backward_reader[p]
        else:
            ready[p] = by_partner.get(first_read.get(p, -1), last)
    return ready


__all__ = ["Trace", "derive"]
