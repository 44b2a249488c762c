"""The plain reader of traces: tensors kept as columns, trace.csv read on a second core.

For plain files (see :mod:`triosim.trace.csv_bytes`: the form every TrioSim tracer writes) this
reader returns what the row-by-row checker returns, column by column: ``tensor.csv`` becomes a
:class:`~triosim.trace.tensor_table.TensorTable` (no Tensor object per tensor until one is asked
for), tensor IDs are matched as integers, and, for a large trace, ``trace.csv``'s columns are
checked and parsed in a forked child (:mod:`triosim.trace.forked_call`) while this process reads
``tensor.csv``. Anything else returns None: pandas' reader or the checker decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checks import MAX_BYTES
from .buffer_columns import OpTensorCodes
from .csv_bytes import (
    MAX_DIGITS,
    MAX_SIZE_DIGITS,
    Declined,
    NumberLists,
    number_lists,
    split_fields,
)
from .fast_reader import (
    Unusual,
    bytes_in_range,
    category_rows,
    op_objects,
    pandas_load,
    times_us,
    whole_counts,
)
from .forked_call import ForkedCall
from .tensor_table import TensorTable


def plain_tensors(path: Path, columns: tuple[str, ...], field_limit: int) -> tuple[TensorTable, np.ndarray, np.ndarray]:
    """tensor.csv of a plain file (see :mod:`triosim.trace.csv_bytes`): ({ID: Tensor}, the distinct
    IDs as integers, sorted, and each one's place in the dictionary)."""
    fields = split_fields(path.read_bytes(), columns, field_limit)
    ids, numbers = fields.plain_ids("TensorID")
    numel, each = whole_counts(fields.whole_numbers("TensorNumElement")), whole_counts(fields.whole_numbers("TensorEachByte"))
    nbytes = bytes_in_range(numel, each)
    by_number, first, inverse = np.unique(numbers, return_index=True, return_inverse=True)
    raw_cats, storages, shapes = (fields.texts(c) for c in ("TensorType", "TensorStorgeid", "TensorShape"))
    if len(by_number) == len(numbers):  # one row per tensor
        if int(nbytes.sum()) >= MAX_BYTES:
            raise Unusual
        return _table(ids, nbytes, numel, each, raw_cats, storages, shapes), by_number, first
    # A tensor on several rows (one per op that takes it): the rows must agree on its size; its
    # category is the first of the highest rank; the rest comes from its first row.
    if (numel != numel[first][inverse]).any() or (each != each[first][inverse]).any():
        raise Unusual
    appearance = np.argsort(first, kind="stable")  # the distinct IDs in order of first row
    place = np.empty_like(appearance)
    place[appearance] = np.arange(len(appearance))
    rows = first[appearance]
    if int(nbytes[rows].sum()) >= MAX_BYTES:
        raise Unusual
    cat_rows = category_rows(raw_cats, place[inverse])
    pick = rows.tolist()
    tensors = _table(list(map(ids.__getitem__, pick)), nbytes[rows], numel[rows], each[rows],
                     list(map(raw_cats.__getitem__, cat_rows)), list(map(storages.__getitem__, pick)),
                     list(map(shapes.__getitem__, pick)))
    return tensors, by_number, place


def _table(ids: list[str], nbytes: np.ndarray, numel: np.ndarray, each: np.ndarray, raw_cats: list[str],
           storages: list[str], shape_texts: list[str]) -> TensorTable:
    """The tensors of one row each as a :class:`TensorTable` (the checker's rules for each cell)."""
    from .load import normalize_category

    norm = {raw: normalize_category(raw) for raw in set(raw_cats)}
    return TensorTable(ids, nbytes, numel, each, list(map(norm.__getitem__, raw_cats)),
                       storages if "0" not in storages else [s if s != "0" else "" for s in storages], shape_texts)


@dataclass(frozen=True)
class PlainOpColumns:
    """trace.csv of a plain file, checked, before its tensor IDs are matched to tensors: arrays
    and joined text only, quick to send from a child process."""

    inputs: NumberLists
    outputs: NumberLists
    op_ids: np.ndarray
    span_us: np.ndarray
    busy_us: np.ndarray
    names: bytes  # each cell followed by a line end
    stages: bytes
    tpflags: bytes


def read_plain_ops(path: Path, columns: tuple[str, ...], field_limit: int) -> PlainOpColumns:
    fields = split_fields(path.read_bytes(), columns, field_limit)
    for column in ("InputSize", "OutputSize"):
        number_lists(fields, column, MAX_SIZE_DIGITS, parse=False)  # checked, not kept
    inputs, outputs = (number_lists(fields, c, MAX_DIGITS) for c in ("Operator_input", "Operator_output"))
    if inputs.leading_zero or outputs.leading_zero:
        raise Declined  # "07" is not tensor "7": the checker reports it
    return PlainOpColumns(inputs, outputs, fields.whole_numbers("OperatorID"),
                          times_us(fields.texts("Operator_cudatime")), times_us(fields.texts("Operator_cudatimenooverlap")),
                          fields.joined("OperatorName"), fields.joined("stage"), fields.joined("tpflag"))


def _lines(joined: bytes) -> list[str]:
    return joined[:-1].decode("ascii").split("\n")


def _matched(lists: NumberLists, by_number: np.ndarray, order: np.ndarray,
             ids: list[str]) -> tuple[list[tuple[str, ...]], np.ndarray, np.ndarray]:
    """Each row's tensor IDs (the tensors' own strings) and the (code, op) pairs of a column."""
    at = np.minimum(np.searchsorted(by_number, lists.values), len(by_number) - 1)
    if not (by_number[at] == lists.values).all():
        raise Declined  # not a tensor: the checker names it
    code = order[at]
    flat = list(map(ids.__getitem__, code.tolist()))
    bounds = lists.bounds.tolist()
    tuples = list(map(tuple, map(flat.__getitem__, map(slice, bounds[:-1], bounds[1:]))))
    return tuples, code, np.repeat(np.arange(len(lists.counts), dtype=np.int64), lists.counts)


def plain_ops(cols: PlainOpColumns, tensors: TensorTable, by_number: np.ndarray, order: np.ndarray, time_column: str):
    """(ops, their tensor lists coded) from the columns of a plain trace.csv."""
    ids = tensors.ids
    inputs, input_code, input_op = _matched(cols.inputs, by_number, order, ids)
    outputs, output_code, output_op = _matched(cols.outputs, by_number, order, ids)
    ops = op_objects(_lines(cols.names), _lines(cols.stages), _lines(cols.tpflags), cols.op_ids, cols.span_us,
                     cols.busy_us, inputs, outputs, time_column)
    return ops, OpTensorCodes(ids, input_code, input_op, output_code, output_op)


# From this size of trace.csv on, its columns are read in a forked child while tensor.csv is read
# here (see triosim.trace.forked_call); below it, forking costs more than it saves.
FORK_MIN_BYTES = 8_000_000


def plain_load(root: Path, tensor_columns: tuple[str, ...], trace_columns: tuple[str, ...], field_limit: int,
               time_column: str, fork_min_bytes: int = FORK_MIN_BYTES):
    """(tensors, ops, the ops' tensor lists coded) of a plain trace (see :mod:`triosim.trace.csv_bytes`),
    or None when the files are not plain or the checker must decide."""
    trace_csv = root / "trace.csv"
    try:
        forked = trace_csv.stat().st_size >= fork_min_bytes
        op_columns = (ForkedCall if forked else _RunHere)(read_plain_ops, trace_csv, trace_columns, field_limit)
        try:
            tensors, by_number, order = plain_tensors(root / "tensor.csv", tensor_columns, field_limit)
        except BaseException:
            if forked:
                op_columns.cancel()
            raise
        ops, codes = plain_ops(op_columns.result(), tensors, by_number, order, time_column)
    except (Declined, Unusual, OSError):
        return None
    return tensors, ops, codes


class _RunHere:
    """:class:`ForkedCall`'s interface, run here."""

    def __init__(self, fn, *args) -> None:
        self._value = fn(*args)

    def result(self):
        return self._value


def fast_load(root: Path, tensor_columns: tuple[str, ...], trace_columns: tuple[str, ...], field_limit: int,
              time_column: str, with_pandas: bool = True):
    """(tensors, ops, the ops' tensor lists coded) read the fast way: split on the bytes when the
    files are plain, else (``with_pandas``) through pandas; None when the row-by-row checker must
    decide."""
    loaded = plain_load(root, tensor_columns, trace_columns, field_limit, time_column)
    if loaded is None and with_pandas:
        loaded = pandas_load(root, tensor_columns, trace_columns, field_limit, time_column)
    return loaded


__all__ = ["fast_load", "plain_load", "plain_tensors", "read_plain_ops"]
