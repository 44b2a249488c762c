"""The fast path of trace loading: both CSVs parsed by pyarrow, their cells checked column by column.

A 200k-op trace is 50 MB of CSV; read cell by cell in Python it takes seconds. pyarrow's CSV
reader parses it in C++ (on several threads), and the checks run on whole columns: pyarrow's
compute kernels (regular expressions, trimming, hashing) and numpy. This reader never reports
an error itself: whenever a file is anything but plainly valid (a bad cell, a blank line, a
record over several lines, a quote after a space, a cell it is not sure to read as the checker
does, …) it declines (:class:`Declined`), and :func:`triosim.trace.load.load_trace` runs the
row-by-row checker (:mod:`triosim.trace.checker`), which names the file, line and column. What
it returns is exactly what the checker returns (the fuzz tests compare the two on mutated
traces): the same Op objects, and the tensors as a :class:`~triosim.trace.tensor_table.TensorTable`
equal to the checker's ``{ID: Tensor}`` dictionary, entry for entry and in the same order.

Where pyarrow and Python's ``csv`` module read a file alike (checked on both): cells split at
commas, double quotes around a cell (``""`` inside one is a quote), a quote inside an unquoted
cell or after a closing quote kept as text, ``\\n`` or ``\\r\\n`` line ends. Where they do not,
this reader declines: a space before a quote (the checker skips spaces after a comma, so the
quote opens a quoted cell), blank lines and records over several lines (the line numbers would
differ), a row with another number of cells than the header. Numbers are parsed by pyarrow
only in the form both parsers read to the same value (plain decimal digits; times as digits
with a point and an exponent, which pyarrow rounds correctly, as Python's ``float`` does).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..checks import MAX_BYTES, MAX_TIME_US
from .buffer_columns import OpTensorCodes
from .model import (
    BUSY_SLACK_US,
    CATEGORY_RANK,
    STAGES,
    TENSOR_COLUMNS,
    TRACE_COLUMNS,
    Op,
    normalize_category,
    tensor_type_problem,
)
from .tensor_table import TensorTable

if TYPE_CHECKING:
    import pyarrow as pa


class Declined(Exception):
    """Something this reader leaves to the row-by-row checker."""


# The characters Python's str.strip() removes (str.isspace()): the checker strips every cell.
WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
              "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_ASCII_WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "
# Whole numbers of at most 18 digits: an int64, below every limit on counts (2^62).
_WHOLE_DIGITS = 18
# A size list as the checker accepts it for sure once its spaces are gone: sizes of at most 15
# digits (below the byte limit of 2^53). Anything else (quotes, decimals) is left to the checker.
_SIZE_LIST = r"^\[([0-9]{1,15}(;[0-9]{1,15})*)?\]$"
# A time both pyarrow and Python's float() read, to the same double (no sign, inf, nan, '_').
_TIME = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,4})?$"


def _columns(path: Path, columns: tuple[str, ...], field_limit: int) -> dict[str, pa.Array]:
    """The ``columns`` of a CSV file as pyarrow string arrays, each cell stripped as the checker
    strips it (data row ``i`` is on line ``i + 2``); declines a file the checker may read otherwise."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    data = path.read_bytes()
    if b"\x00" in data or b' "' in data or (b"\r" in data and data.count(b"\r") != data.count(b"\r\n")):
        raise Declined  # a NUL byte, a quote the checker opens after skipped spaces, a lone "\r"
    ascii_only = data.isascii()
    if not ascii_only:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise Declined from None
    end = data.find(b"\n")
    head = data[:end if end >= 0 else len(data)].decode("utf-8")
    if '"' in head:
        raise Declined
    header = [h.strip().lstrip("\ufeff") for h in head.split(",")]
    if any(c not in header for c in columns):
        raise Declined
    names = [f"c{i}" for i in range(len(header))]
    try:
        table = pacsv.read_csv(
            pa.py_buffer(data),
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()), null_values=[],
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False),
        )
    except pa.ArrowException:
        raise Declined from None  # a row with another number of cells, an unclosed quote, …
    if table.num_rows == 0 or not _one_record_a_line(table.num_rows, data):
        raise Declined
    # The csv module's limit on a cell (pyarrow's cell is never shorter than the checker's).
    if any(pc.max(pc.binary_length(table.column(n))).as_py() > field_limit for n in names):
        raise Declined
    return {c: _stripped(table.column(names[header.index(c)]).combine_chunks(), ascii_only) for c in columns}


def _one_record_a_line(records: int, data: bytes) -> bool:
    """True when the file's ``records`` data records after the header are one a line, none
    blank (pyarrow skips blank lines, and a quoted cell may hold a line break): the line numbers
    are then the checker's."""
    return records + 1 == data.count(b"\n") + (not data.endswith(b"\n"))


def _stripped(column: pa.Array, ascii_only: bool) -> pa.Array:
    """The cells without white space at their edges, as the checker strips them."""
    import pyarrow.compute as pc

    if ascii_only:
        return pc.ascii_trim(column, characters=_ASCII_WHITESPACE)
    return pc.utf8_trim(column, characters=WHITESPACE)


def _numpy(array: pa.Array, dtype: type = np.int64) -> np.ndarray:
    """A numeric pyarrow array without nulls as numpy (cast to ``dtype``), read from its buffer:
    pyarrow's own ``to_numpy`` imports pandas (a sixth of a second) the first time."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if array.null_count:
        raise Declined
    if array.type != pa.from_numpy_dtype(dtype):
        array = pc.cast(array, pa.from_numpy_dtype(dtype))
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * array.type.byte_width)


def _all(mask: pa.Array) -> bool:
    """True when every value of ``mask`` is true (or there is none)."""
    import pyarrow.compute as pc

    return bool(pc.all(mask, min_count=0).as_py())


def _whole_numbers(column: pa.Array) -> np.ndarray:
    """int64 of cells of plain decimal digits (what the checker reads to the same value)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    # ascii_is_decimal: one or more of 0-9, nothing else.
    if not (_all(pc.ascii_is_decimal(column)) and pc.max(pc.binary_length(column)).as_py() <= _WHOLE_DIGITS):
        raise Declined  # "12.0", "1e3", "+5", "٣": the checker reads them
    return _numpy(pc.cast(column, pa.int64()))


def _times_us(column: pa.Array) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if not _all(pc.match_substring_regex(column, _TIME)):
        raise Declined
    values = _numpy(pc.cast(column, pa.float64()), np.float64)
    if not (np.isfinite(values).all() and values.min() >= 0.0 and values.max() < MAX_TIME_US):
        raise Declined
    return values


def _coded(column: pa.Array) -> tuple[list, np.ndarray]:
    """(the distinct cells, each cell's position in that list)."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(column)
    return encoded.dictionary.to_pylist(), _numpy(encoded.indices)


def _per_row(values: list, codes: np.ndarray) -> list:
    """``values[c]`` for each code ``c`` (the distinct value objects shared, as a column)."""
    table = np.empty(len(values), dtype=object)
    table[:] = values
    return table[codes].tolist()


def _category_rows(rank: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Per tensor (``code``: each row's tensor, in order of first row), the row whose category it
    keeps: the first of the highest rank, as the checker merges a tensor's rows."""
    order = np.lexsort((np.arange(len(code)), -rank, code))
    return order[np.flatnonzero(np.diff(code[order], prepend=-1))]


def read_tensors(path: Path, field_limit: int) -> tuple[TensorTable, pa.Array]:
    """tensor.csv as a TensorTable (see the checker, :func:`triosim.trace.checker.load_tensors`, for the
    rules), and the distinct tensor IDs as a pyarrow array (in the table's order)."""
    import pyarrow.compute as pc

    cols = _columns(path, TENSOR_COLUMNS, field_limit)
    ids = cols["TensorID"]
    if not _all(pc.invert(pc.match_substring_regex(ids, "^['\"]|['\"]$"))):
        ids = pc.utf8_trim(ids, "'\"")
    if pc.min(pc.binary_length(ids)).as_py() == 0:
        raise Declined  # an empty tensor ID
    numel, each = _whole_numbers(cols["TensorNumElement"]), _whole_numbers(cols["TensorEachByte"])
    # Sizes near the limits (where int64 products could overflow) are left to the checker.
    if float(numel.astype(float).dot(each.astype(float))) >= MAX_BYTES / 2:
        raise Declined
    nbytes = numel * each
    unique = pc.unique(ids)
    raw_cats, cat_code = _coded(cols["TensorType"])
    if any(tensor_type_problem(raw) is not None for raw in raw_cats):
        raise Declined
    categories = [normalize_category(raw) for raw in raw_cats]
    if len(unique) == len(ids):  # one row per tensor, the usual case: the IDs in row order
        unique, rows = ids, None
    else:
        # A tensor on several rows (one per op that takes it): the rows must agree on its size;
        # its category is the first of the highest rank; the rest comes from its first row.
        code = _numpy(pc.index_in(ids, value_set=unique))
        _, first = np.unique(code, return_index=True)
        if not (np.diff(first) > 0).all():
            raise Declined  # not in order of first row (pyarrow's unique keeps that order)
        if (numel != numel[first][code]).any() or (each != each[first][code]).any():
            raise Declined
        rank = np.array([CATEGORY_RANK.get(c, 2) for c in categories], dtype=np.int64)[cat_code]
        cat_code = cat_code[_category_rows(rank, code)]
        rows = first
        nbytes, numel, each = nbytes[first], numel[first], each[first]
    # (No Python value is handed to pyarrow here: converting one imports pandas, a sixth of a second.)
    storages = pc.replace_substring_regex(cols["TensorStorgeid"], "^0$", "").to_pylist()
    shapes, shape_code = _coded(cols["TensorShape"])
    if rows is not None:
        storages, shape_code = _per_row(storages, rows), shape_code[rows]
    table = TensorTable(unique.to_pylist(), nbytes, numel, each, _per_row(categories, cat_code), storages,
                        _per_row(shapes, shape_code))
    return table, unique


def _id_lists(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Each row's tensor IDs read as the checker reads a list (``[4; 6]``: spaces dropped, split
    at ``;``, quotes stripped from each ID): (all the IDs in order, how many each row holds)."""
    import pyarrow.compute as pc

    text = pc.replace_substring(column, " ", "")
    if not _all(pc.and_(pc.starts_with(text, "["), pc.ends_with(text, "]"))):
        raise Declined
    body = pc.utf8_slice_codeunits(text, 1, -1)
    filled = pc.match_substring_regex(body, "(?s).")  # "[]" is an empty list, not one empty ID
    parts = pc.split_pattern(body.filter(filled), ";")
    counts = np.zeros(len(body), dtype=np.int64)
    counts[_numpy(filled, np.int8).astype(bool)] = _numpy(pc.list_value_length(parts))
    flat = pc.list_flatten(parts)
    if not _all(pc.invert(pc.match_substring_regex(flat, "^['\"]|['\"]$"))):
        flat = pc.utf8_trim(flat, "'\"")
    return flat, counts


def _codes(flat: pa.Array, tensor_ids: pa.Array) -> np.ndarray | None:
    """Each ID's position in ``tensor_ids`` (None when one is not there). IDs written as plain
    decimal integers (what the tracers write) are looked up in a table indexed by the number;
    any others by hashing the strings."""
    import pyarrow as pa
    import pyarrow.compute as pc

    both = (tensor_ids, flat)
    if all(_all(pc.ascii_is_decimal(a)) and pc.max(pc.binary_length(a)).as_py() <= _WHOLE_DIGITS and
           not _any(pc.match_substring_regex(a, "^0.")) for a in both):
        # No leading zero: equal numbers are equal strings.
        known, wanted = (_numpy(pc.cast(a, pa.int64())) for a in both)
        top = int(known.max(initial=0))
        if top < 8 * len(known) + 1024:
            table = np.full(top + 1, -1, dtype=np.int64)
            table[known] = np.arange(len(known))
            codes = np.full(len(wanted), -1, dtype=np.int64)
            inside = wanted <= top
            codes[inside] = table[wanted[inside]]
            return None if len(codes) and int(codes.min()) < 0 else codes
    found = pc.index_in(flat, value_set=tensor_ids)
    return None if found.null_count else _numpy(found)


def _any(mask: pa.Array) -> bool:
    """True when some value of ``mask`` is true."""
    import pyarrow.compute as pc

    return bool(pc.any(mask, min_count=0).as_py())


def _tuples(values: np.ndarray, counts: np.ndarray) -> list[tuple]:
    """``values`` (an object array) cut into one tuple per row of ``counts[row]`` values: the rows
    of each length at once (``zip`` of strided columns, in C), not one slice per row."""
    out = np.empty(len(counts), dtype=object)
    starts = np.cumsum(counts) - counts
    for k in np.unique(counts).tolist():
        rows = np.flatnonzero(counts == k)
        at = starts[rows]
        made = zip(*(values[at + j] for j in range(k))) if k else (() for _ in range(len(rows)))
        out[rows] = np.fromiter(made, dtype=object, count=len(rows))
    return out.tolist()


def _matched(tensor_ids: pa.Array, ids: list[str], *columns: tuple[pa.Array, np.ndarray]):
    """Per column of ID lists ((all IDs, count per row), from :func:`_id_lists`): each row's IDs as
    the tensors' own strings, and the (code, op) pairs; declines when an ID is not a tensor (an
    empty element is none). The IDs of all columns are looked up at once."""
    import pyarrow as pa

    codes = _codes(pa.concat_arrays([flat for flat, _ in columns]), tensor_ids)
    if codes is None:
        raise Declined  # not a tensor: the checker names it
    strings = np.empty(len(ids), dtype=object)
    strings[:] = ids
    out, start = [], 0
    for flat, counts in columns:
        code = codes[start:start + len(flat)]
        start += len(flat)
        out.append((_tuples(strings[code], counts), code, np.repeat(np.arange(len(counts), dtype=np.int64), counts)))
    return out


def read_ops(path: Path, field_limit: int, tensors: TensorTable, tensor_ids: pa.Array,
             time_column: str) -> tuple[list[Op], OpTensorCodes]:
    """trace.csv's ops (see the checker, :func:`triosim.trace.checker.load_ops`, for the rules)
    and their tensor lists coded."""
    import pyarrow.compute as pc

    cols = _columns(path, TRACE_COLUMNS, field_limit)
    for column in ("InputSize", "OutputSize"):  # checked, not kept
        if not _all(pc.match_substring_regex(pc.replace_substring(cols[column], " ", ""), _SIZE_LIST)):
            raise Declined
    in_lists, out_lists = _id_lists(cols["Operator_input"]), _id_lists(cols["Operator_output"])
    (inputs, input_code, input_op), (outputs, output_code, output_op) = _matched(
        tensor_ids, tensors.ids, in_lists, out_lists)
    for column, (_, id_counts), code in (("InputSize", in_lists, input_code), ("OutputSize", out_lists, output_code)):
        _check_sizes(cols[column], id_counts, code, tensors.numel)
    raw_stages, stage_code = _coded(cols["stage"])
    stages = [s.lower() for s in raw_stages]
    flags, flag_code = _coded(cols["tpflag"])
    if not set(stages) <= set(STAGES) or not set(flags) <= {"0", "1", ""}:
        raise Declined
    op_ids = _whole_numbers(cols["OperatorID"]).tolist()
    span_us, busy_us = _times_us(cols["Operator_cudatime"]), _times_us(cols["Operator_cudatimenooverlap"])
    n = len(op_ids)
    if _busy_over_span(busy_us, span_us) or not _unique(op_ids):
        raise Declined  # the checker names the row
    # numpy's float64 division is IEEE division, as Python's: the same seconds as x / 1e6.
    duration = ((busy_us if time_column == "nooverlap" else span_us) / 1e6).tolist()
    span_s = (span_us / 1e6).tolist()
    tp = _per_row([f == "1" for f in flags], flag_code)
    ops = list(map(partial(tuple.__new__, Op),
                   zip(range(n), op_ids, cols["OperatorName"].to_pylist(), inputs, outputs, duration, span_s,
                       _per_row(stages, stage_code), tp, range(2, n + 2))))
    return ops, OpTensorCodes(tensors.ids, input_code, input_op, output_code, output_op)


def _busy_over_span(busy_us: np.ndarray, span_us: np.ndarray) -> bool:
    """True when some op's busy time exceeds its span (beyond the tracers' rounding)."""
    return bool((busy_us > span_us + BUSY_SLACK_US).any())


def _unique(op_ids: list[int]) -> bool:
    """True when no OperatorID is given twice."""
    return len(set(op_ids)) == len(op_ids)


def _check_sizes(column: pa.Array, id_counts: np.ndarray, codes: np.ndarray, numel: np.ndarray) -> None:
    """Declines unless each row's size list (checked against ``_SIZE_LIST``) has one size per
    tensor of its ID list, each the tensor's element count in tensor.csv."""
    import pyarrow as pa
    import pyarrow.compute as pc

    flat, counts = _id_lists(column)
    if not np.array_equal(counts, id_counts):
        raise Declined
    if len(flat) and not np.array_equal(_numpy(pc.cast(flat, pa.int64())), np.asarray(numel)[codes]):
        raise Declined


def arrow_load(root: Path, field_limit: int, time_column: str) -> tuple[TensorTable, list[Op], OpTensorCodes] | None:
    """(tensors, ops, the ops' tensor lists coded) of the trace in ``root``, or None when the
    row-by-row checker must decide (``field_limit``: the csv module's limit on a cell)."""
    import pyarrow as pa

    try:
        with _releasing_pool():
            tensors, tensor_ids = read_tensors(root / "tensor.csv", field_limit)
            ops, codes = read_ops(root / "trace.csv", field_limit, tensors, tensor_ids, time_column)
    except (Declined, OSError, pa.ArrowException):  # pyarrow's own complaint: the checker words it
        return None
    return tensors, ops, codes


@contextmanager
def _releasing_pool() -> Iterator[None]:
    """pyarrow's jemalloc pool while the files are read, where pyarrow has it: it hands the
    tables' memory back as they are freed, where the default pool (mimalloc) keeps it (the
    200,000-op trace peaked at 757 MB of RSS, 573 MB with jemalloc). The previous default pool
    is restored on the way out."""
    import pyarrow as pa

    try:
        pool = pa.jemalloc_memory_pool()
    except (NotImplementedError, pa.ArrowException):
        yield
        return
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


__all__ = ["Declined", "arrow_load", "read_ops", "read_tensors"]
