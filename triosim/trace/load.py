"""The single-GPU operator trace: loading, validation, derived data-flow facts and batch scaling.

A trace directory holds TrioSim's ``trace.csv`` (one row per operator, in execution order) and
``tensor.csv`` (one row per operator/tensor-argument occurrence). This module reads both, checks
them, and derives what the graph builders need: which op writes and reads which buffer, which
tensors come from outside the step (parameters, optimizer state, the input batch), the parameter
set, and the forward op each backward op belongs to.
"""

from __future__ import annotations

import csv
import gc
import io
import os
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import chain
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..checks import MAX_BYTES, cell_int, cell_time_us, json_int
from ..checks import whole_number as _whole_number
from ..errors import ConfigError, TraceError
from .buffer_columns import (
    BufferColumns,
    buffer_columns,
    buffer_lists,
    first_op,
    first_position,
    op_tensor_codes,
    tensor_bytes,
)
from .plain_reader import fast_load
from .tensor_table import column_or_none

if TYPE_CHECKING:
    from ..compute.op_time import OpTimeModel

TRACE_COLUMNS = (
    "OperatorID",
    "OperatorName",
    "Operator_input",
    "Operator_output",
    "Operator_cudatime",
    "Operator_cudatimenooverlap",
    "InputSize",
    "OutputSize",
    "gpuid",
    "stage",
    "tpflag",
)
TENSOR_COLUMNS = (
    "Index",
    "TensorID",
    "TensorShape",
    "TensorNumElement",
    "TensorEachByte",
    "TensorType",
    "TensorStorgeid",
    "gpuid",
)
STAGES = ("forward", "backward", "optimizer")
PARAMETER_CATEGORIES = frozenset({"weight", "bias"})

# Higher wins when one tensor ID appears with several categories: a tensor that is ever a
# weight or bias is a parameter, whatever else it is called elsewhere.
_CATEGORY_RANK = {
    "weight": 5,
    "bias": 5,
    "running_mean": 4,
    "running_var": 4,
    "mean": 4,
    "grad": 3,
    "grad_output": 3,
    "input": 1,
    "self": 1,
    "output": 1,
    "other": 1,
    "": 0,
}


# Tensor and Op are named tuples: a 200k-op trace has half a million tensors, and a tuple is
# built several times faster than a dataclass instance (in bulk, by ``tuple.__new__`` in C).
# They are read-only; ``obj._replace(field=value)`` makes a changed copy.


class Tensor(NamedTuple):
    """One tensor of the trace (all tensor.csv rows of one ID merged)."""

    id: str
    bytes: int
    numel: int
    each_byte: int
    category: str
    storage: str
    shape: tuple[int, ...] | None


class Op(NamedTuple):
    """One operator row of trace.csv."""

    index: int
    op_id: int
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    duration_s: float
    span_s: float
    stage: str
    tpflag: bool
    line: int


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
    tensors: Mapping[str, Tensor]  # a dict, or a TensorTable (columns) from the plain reader
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
    # Derived on first use (``consumers``, ``forward_partner``, ``grad_ready_op``): most runs never ask, and on a trace of
    # hundreds of thousands of ops they took a fifth of the loading time.
    _partner: tuple[int | None, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _consumers: dict[str, tuple[int, ...]] | None = field(default=None, init=False, repr=False, compare=False)
    _grad_ready: dict[str, int] | None = field(default=None, init=False, repr=False, compare=False)
    # (tensors, reads, writes, their columns): an init field, so that ``replace`` hands it on;
    # used only while those three are still the very objects the columns were made from.
    _columns: tuple | None = field(default=None, repr=False, compare=False)
    # (ops, tensors, their OpTensorCodes) from the fast reader, likewise.
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


# ----------------------------------------------------------------------------- parsing helpers


def parse_id_list(text: str) -> tuple[str, ...]:
    """Parse the original's list syntax, ``[4; 6; 8]`` or ``[]`` (quotes and spaces ignored)."""
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ValueError(f"expected a list like [4; 6], got {text!r}")
    body = body[1:-1].replace(" ", "")
    if not body:
        return ()
    items = tuple(tok.strip("'\"") for tok in body.split(";"))
    if any(not tok for tok in items):
        raise ValueError(f"empty element in list {text!r}")
    return items


def parse_int_list(text: str) -> tuple[int, ...]:
    """Parse a list of sizes, ``[4; 6]``: whole numbers >= 0 (``1.5``, ``inf``, ``nan`` are errors)."""
    items = parse_id_list(text)
    values = []
    for tok in items:
        value = _whole_number(tok)
        if value is None:
            raise ValueError(f"not a whole number: {tok!r} in {text!r}")
        if value < 0:
            raise ValueError(f"negative size in {text!r}")
        if value >= MAX_BYTES:
            raise ValueError(f"size {tok} too large in {text!r} (limit {MAX_BYTES:,})")
        values.append(value)
    return tuple(values)


def _parse_shape(text: str) -> tuple[int, ...] | None:
    body = text.strip().strip("[]").replace(" ", "")
    if not body:
        return ()
    try:
        return tuple(int(tok) for tok in body.replace(";", ",").split(",") if tok)
    except ValueError:
        return None


def normalize_category(raw: str) -> str:
    """Schema argument name without default: ``bias=None`` -> ``bias``."""
    return raw.split("=", 1)[0].strip().lower()


# The csv module's default field limit; a longer cell is a broken file, not a tensor list.
FIELD_LIMIT = 128 * 1024


def _decode(path: Path) -> str:
    """The file's text; undecodable bytes are reported with the line they are on."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(str(path), f"cannot read file ({exc.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(path.name, f"not UTF-8 text (byte 0x{data[exc.start]:02x})", row=line) from None


def _read_rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """Rows as (line number, column -> stripped text); every problem names file and line."""
    name = path.name
    text = _decode(path)
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise TraceError(name, "contains a NUL byte (a binary file?)", row=line)
    reader = csv.reader(io.StringIO(text, newline=""), skipinitialspace=True)
    try:
        try:
            header = next(reader)
        except StopIteration:
            raise TraceError(name, "file is empty (no header row)") from None
        header = [h.strip().lstrip("\ufeff") for h in header]
        missing = [c for c in columns if c not in header]
        if missing:
            raise TraceError(name, f"missing column {missing[0]!r}", row=1)
        pos = {c: header.index(c) for c in columns}
        width = max(pos.values()) + 1
        rows = []
        for rec in reader:
            line_no = reader.line_num
            if not rec or all(not x.strip() for x in rec):
                continue
            if len(rec) < width:
                short = next(c for c, i in pos.items() if i >= len(rec))
                raise TraceError(name, "row has too few fields", row=line_no, field=short)
            rows.append((line_no, {c: rec[i].strip() for c, i in pos.items()}))
        return rows
    except csv.Error as exc:
        raise TraceError(name, f"malformed CSV ({exc})", row=max(1, reader.line_num)) from None


def _int_field(name: str, line: int, col: str, text: str, minimum: int = 0) -> int:
    return cell_int(text, name, line, col, minimum=minimum)


def _time_field(line: int, col: str, text: str) -> float:
    return cell_time_us(text, "trace.csv", line, col)


def _load_tensors(path: Path) -> dict[str, Tensor]:
    tensors: dict[str, Tensor] = {}
    first_line: dict[str, int] = {}
    total = 0
    for line, row in _read_rows(path, TENSOR_COLUMNS):
        tid = row["TensorID"].strip("'\"")
        if not tid:
            raise TraceError("tensor.csv", "empty tensor ID", row=line, field="TensorID")
        numel = _int_field("tensor.csv", line, "TensorNumElement", row["TensorNumElement"])
        each = _int_field("tensor.csv", line, "TensorEachByte", row["TensorEachByte"])
        if numel * each >= MAX_BYTES:
            raise TraceError("tensor.csv", f"tensor of {numel} x {each} bytes is larger than the limit "
                             f"of {MAX_BYTES:,} bytes", row=line, field="TensorNumElement")
        category = normalize_category(row["TensorType"])
        storage = row["TensorStorgeid"].strip()
        prev = tensors.get(tid)
        if prev is not None:
            # Rows of one ID must agree on size; keep the most specific category seen.
            if prev.numel != numel or prev.each_byte != each:
                raise TraceError(
                    "tensor.csv",
                    f"tensor {tid} has {numel} x {each} bytes here but {prev.numel} x {prev.each_byte} "
                    f"on line {first_line[tid]}",
                    row=line, field="TensorNumElement",
                )
            if _CATEGORY_RANK.get(category, 2) <= _CATEGORY_RANK.get(prev.category, 2):
                category = prev.category
            tensors[tid] = prev._replace(category=category)
            continue
        total += numel * each
        if total >= MAX_BYTES:
            raise TraceError("tensor.csv", f"the tensors add up to more than {MAX_BYTES:,} bytes",
                             row=line, field="TensorNumElement")
        first_line[tid] = line
        tensors[tid] = Tensor(
            id=tid,
            bytes=numel * each,
            numel=numel,
            each_byte=each,
            category=category,
            storage=storage if storage not in ("", "0") else "",
            shape=_parse_shape(row["TensorShape"]),
        )
    return tensors


def _load_ops(path: Path, tensors: dict[str, Tensor], time_column: str) -> list[Op]:
    ops: list[Op] = []
    for line, row in _read_rows(path, TRACE_COLUMNS):
        ids = {}
        for col in ("Operator_input", "Operator_output"):
            try:
                ids[col] = parse_id_list(row[col])
            except ValueError as exc:
                raise TraceError("trace.csv", str(exc), row=line, field=col) from None
            for tid in ids[col]:
                if tid not in tensors:
                    raise TraceError(
                        "trace.csv",
                        f"references tensor {tid}, which tensor.csv does not define",
                        row=line,
                        field=col,
                    )
        for col in ("InputSize", "OutputSize"):
            try:
                parse_int_list(row[col])
            except ValueError as exc:
                raise TraceError("trace.csv", str(exc), row=line, field=col) from None
        stage = row["stage"].strip().lower()
        if stage not in STAGES:
            raise TraceError(
                "trace.csv", f"unknown stage {row['stage']!r} (expected forward, backward or optimizer)",
                row=line, field="stage",
            )
        tp = row["tpflag"].strip()
        if tp not in ("0", "1", ""):
            raise TraceError("trace.csv", f"tpflag must be 0 or 1, got {tp!r}", row=line, field="tpflag")
        span = _time_field(line, "Operator_cudatime", row["Operator_cudatime"])
        busy = _time_field(line, "Operator_cudatimenooverlap", row["Operator_cudatimenooverlap"])
        ops.append(
            Op(
                index=len(ops),
                op_id=_int_field("trace.csv", line, "OperatorID", row["OperatorID"]),
                name=row["OperatorName"],
                inputs=ids["Operator_input"],
                outputs=ids["Operator_output"],
                duration_s=(busy if time_column == "nooverlap" else span) / 1e6,
                span_s=span / 1e6,
                stage=stage,
                tpflag=tp == "1",
                line=line,
            )
        )
    if not ops:
        raise TraceError("trace.csv", "the trace has no operators")
    return ops


DEFAULT_TRACE_BATCH = 128  # the batch assumed for a trace with neither meta.json nor a given batch


def trace_batch_size(path: str | os.PathLike) -> tuple[int, str]:
    """The batch a trace directory was recorded at, and where that number comes from:
    ``(n, "meta.json")`` from its meta.json, else ``(128, "assumed")``."""
    info = read_trace_info(path)
    raw = info.get("batch_size")
    if raw is None:
        return DEFAULT_TRACE_BATCH, "assumed"
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TraceError(str(Path(path) / "meta.json"), f"batch_size must be an integer, got {raw!r}")
    return raw, "meta.json"


# Below this many bytes of trace.csv + tensor.csv the row-by-row reader finishes before pandas
# would even be imported (a 96-layer GPT trace of 1.2 MB: 0.41 s against 0.23 s + 0.59 s import);
# the plain reader (no pandas) is tried first at any size.
FAST_MIN_BYTES = 4_000_000


def load_trace(path: str | os.PathLike, batch_size: int | None = None, time_column: str = "nooverlap",
               fast: bool | None = None) -> Trace:
    """Read and validate a trace directory; ``batch_size`` is the batch it was recorded at.

    ``batch_size`` None reads it from the directory's meta.json (written by ``triosim trace``);
    without one, 128 is assumed, with a ``UserWarning`` saying so (``trace.batch_source`` is then
    ``"assumed"``): pass the batch your trace was recorded at. ``time_column`` picks the op
    duration: ``nooverlap`` (sum of kernel times, the original's choice) or ``span`` (first
    kernel start to last kernel end). ``fast`` reads the files column by column
    (:mod:`triosim.trace.fast_reader`: split on their bytes when they are plain, else with pandas' C
    parser), falling back to the row-by-row checker on anything unusual (same result;
    ``fast=False`` always uses the checker; ``None``, the default: the plain reader at any size,
    pandas for files of ``FAST_MIN_BYTES`` or more only, since importing it takes longer than the
    checker's whole read of a smaller file). A plain trace's tensors are
    then a :class:`~triosim.trace.tensor_table.TensorTable` (a read-only mapping kept as columns)
    rather than a dict.
    """
    source = "argument"
    if batch_size is None:
        batch_size, source = trace_batch_size(path)
        if source == "assumed":
            import warnings

            warnings.warn(
                f"{path}: no meta.json gives the batch the trace was recorded at; assuming "
                f"{DEFAULT_TRACE_BATCH} (pass batch_size=...)", UserWarning, stacklevel=2,
            )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ConfigError(f"-batch-size must be a positive integer, got {batch_size}")
    if time_column not in ("nooverlap", "span"):
        raise ConfigError(f"unknown time column {time_column!r} (nooverlap or span)")
    root = Path(path)
    if not root.is_dir():
        raise TraceError(str(root), "trace directory does not exist")
    for name in ("trace.csv", "tensor.csv"):
        if not (root / name).is_file():
            raise TraceError(str(root / name), "file not found")
    with collector_paused():
        loaded = None
        if fast is not False:
            # The plain reader is quicker than the checker at any size; pandas only pays for
            # its import on large files.
            with_pandas = fast or sum((root / n).stat().st_size for n in ("trace.csv", "tensor.csv")) >= FAST_MIN_BYTES
            # The checker's limit on a cell is the csv module's, whatever it is set to now.
            loaded = fast_load(root, TENSOR_COLUMNS, TRACE_COLUMNS, csv.field_size_limit(), time_column, with_pandas)
        codes = None
        if loaded is not None:
            tensors, ops, op_codes = loaded
            codes = (ops, tensors, op_codes)
        else:  # the row-by-row checker: slower, and names the line of any problem
            tensors = _load_tensors(root / "tensor.csv")
            ops = _load_ops(root / "trace.csv", tensors, time_column)
        trace = Trace(path=str(root), batch_size=batch_size, ops=ops, tensors=tensors, batch_source=source,
                      info=read_trace_info(root), _op_codes=codes)
        return derive(trace)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was before, after it).

    Loading a large trace makes millions of objects (cells, tuples, Tensor and Op objects) that
    all stay alive; the collector, triggered every few hundred allocations, walked them again
    and again, which took about a third of the load time. Nothing made here is cyclic garbage.
    When the collector comes back on, the objects made meanwhile join the oldest generation
    directly (freeze, then unfreeze) instead of all being walked by the first collection after
    the block (a third of a second after loading a 200k-op trace).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.enable()
            gc.unfreeze()


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
    """
    last_fwd_writer: dict[str, int] = {}
    first_fwd_reader: dict[str, int] = {}
    partner: list[int | None] = []
    for i, op in enumerate(ops):
        if op.stage == "forward":
            for t in reads[i]:
                first_fwd_reader.setdefault(t, i)
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


# ----------------------------------------------------------------------------- batch scaling


def scale_trace(trace: Trace, batch_size_sim: int, reference_compat: bool = False) -> Trace:
    """Scale a trace recorded at ``trace.batch_size`` to a per-GPU batch of ``batch_size_sim``.

    Op times follow the trace's op-time model (``trace.op_time``, see
    :mod:`triosim.compute.op_time`; linear when it has none, and always linear under
    ``reference_compat``). Default model: activation and input bytes scale, parameters,
    gradients and optimizer state do not (a tensor scales when its leading dimension is the
    batch, or its shape is unknown). ``reference_compat``: every tensor scales, with the
    original's truncation ``int(size / (batch / batch_sim))``.
    """
    if batch_size_sim <= 0:
        raise ConfigError(f"-batch-size-sim must be a positive integer, got {batch_size_sim}")
    if batch_size_sim == trace.batch_size:
        return trace
    ratio_sim = batch_size_sim / trace.batch_size
    bs_ratio = trace.batch_size / batch_size_sim
    tensors = {}
    for tid, t in trace.tensors.items():
        if reference_compat:
            new_bytes = int(float(t.bytes) / bs_ratio)
        elif tid in trace.batch_invariant or trace.base(tid) in trace.batch_invariant:
            new_bytes = t.bytes
        elif t.shape is None or (t.shape and t.shape[0] == trace.batch_size):
            new_bytes = int(round(t.bytes * ratio_sim))
        else:
            new_bytes = t.bytes
        tensors[tid] = t if new_bytes == t.bytes else _with(t, bytes=new_bytes)
    if trace.op_time is None and not reference_compat:
        # The command line's default op-time model, so that the Python API agrees with it.
        from ..compute.op_time import attach_op_time_model

        trace = attach_op_time_model(trace)
    model = None if reference_compat else trace.op_time
    ops = [
        _with(op, duration_s=op.duration_s / bs_ratio, span_s=op.span_s / bs_ratio)
        if model is None
        else _with(op, duration_s=model.seconds(op.index, batch_size_sim),
                   span_s=op.span_s * model.seconds(op.index, batch_size_sim) / op.duration_s
                   if op.duration_s > 0 else op.span_s / bs_ratio)
        for op in trace.ops
    ]
    scaled = replace(trace, ops=ops, tensors=tensors, batch_size=batch_size_sim)
    cached = trace._columns
    if cached is not None and cached[0] is trace.tensors and cached[1] is trace.reads and cached[2] is trace.writes:
        # Same buffers and lists, new sizes: only the size column changes.
        scaled._columns = (tensors, trace.reads, trace.writes, replace(cached[3], nbytes=tensor_bytes(tensors)))
    return scaled


def _with(obj, **changes):
    """A copy of ``obj`` (a Tensor or an Op) with ``changes``."""
    return obj._replace(**changes)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def read_trace_info(path: str | os.PathLike) -> dict:
    """Optional ``meta.json`` beside the CSVs (written by our tracer): batch size, device…"""
    import json

    info = Path(path) / "meta.json"
    if not info.is_file():
        return {}
    try:
        # NaN/Infinity are not JSON; refuse them here rather than as a batch of NaN later.
        data = json.loads(info.read_text(encoding="utf-8"), parse_constant=_reject_constant)
    except (OSError, ValueError) as exc:
        raise TraceError(str(info), f"unreadable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TraceError(str(info), "expected a JSON object")
    if data.get("batch_size") is not None:  # null: the converter did not know the batch
        data["batch_size"] = json_int(data["batch_size"], str(info), "batch_size")
    return data

