"""The fast paths of trace loading: whole columns checked and converted at once.

A recorded trace has hundreds of thousands of rows; reading them cell by cell in Python was
most of a large run's time. Two readers do it column by column instead: for *plain* files (the
form every TrioSim tracer writes) the bytes are split with numpy and string methods
(:mod:`triosim.trace_bytes`, no pandas import); any other file goes through pandas' C parser.
Neither reports an error itself: on anything unusual (a bad cell, a blank or multi-line record,
a byte that is not UTF-8, a duplicate tensor row, …) they return None and
:func:`triosim.trace.load_trace` runs the row-by-row checker, which names the file, line and
column. Each returns exactly what the checker would have returned (tested on mutated traces).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from pathlib import Path

import numpy as np

from .buffer_columns import OpTensorCodes, coded_pairs
from .checks import MAX_BYTES, MAX_COUNT, MAX_TIME_US
from .forked_call import ForkedCall
from .tensor_table import TensorTable
from .trace_bytes import (
    MAX_DIGITS,
    MAX_SIZE_DIGITS,
    Declined,
    NumberLists,
    number_lists,
    split_fields,
)


class _Unusual(Exception):
    """Something the fast path leaves to the row-by-row checker."""


def _line_shapes_ok(data: bytes, rows: int, field_limit: int, last_cells_filled: bool = False) -> bool:
    """True when the file is plainly one record a line: ``rows`` data lines after the header,
    none longer than ``field_limit``, none with fewer fields than the header (pandas fills a
    short row with empty cells where the checker reports "too few fields"; a longer one is read
    alike by both). ``last_cells_filled``: no row has an empty cell in the header's last
    column, so none is short, and the separators need no counting."""
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    if len(ends) - (0 if data.endswith(b"\n") else -1) != rows + 1 or data.count(b"\r") != data.count(b"\r\n"):
        return False
    if len(ends) and max(int(ends[0]), int(np.diff(ends).max(initial=0)) - 1, len(data) - int(ends[-1]) - 1) > field_limit:
        return False
    if not len(ends) and len(data) > field_limit:
        return False
    if last_cells_filled:
        return True
    # Separators per line from the count of commas before each line end (searching the few
    # line ends among the many commas, not the other way round).
    commas = np.flatnonzero(buf == 44)
    bounds = np.concatenate(([0], np.searchsorted(commas, ends), [len(commas)]))
    per_line = np.diff(bounds)
    quotes = np.flatnonzero(buf == 34)
    if len(quotes):
        # Commas inside quotes separate nothing. Quotes pair up within each line (else: the
        # checker decides); the commas between the two quotes of a pair are quoted.
        if len(quotes) % 2 or (np.searchsorted(ends, quotes[0::2]) != np.searchsorted(ends, quotes[1::2])).any():
            return False
        inside = np.searchsorted(commas, quotes[1::2]) - np.searchsorted(commas, quotes[0::2])
        per_line = per_line - np.bincount(np.searchsorted(ends, quotes[0::2]), weights=inside,
                                          minlength=len(per_line)).astype(np.int64)
    return bool((per_line[1:rows + 1] == per_line[0]).all())


def _frame(path: Path, columns: tuple[str, ...], field_limit: int, numeric: tuple[str, ...] = (),
           unused: tuple[str, ...] = ()) -> dict[str, list[str] | np.ndarray]:
    """The used columns: text columns as lists of stripped strings, ``numeric`` ones as int64
    arrays; data row i is on line i + 2.
    ``unused`` columns must be there but are not parsed (the checker only requires them).

    Only the used columns are parsed: turning every cell of every column into a Python string
    was much of the reader's time. Times are converted by Python's ``float()`` later, as the
    checker does: pandas' float parser is not Python's, and may differ in the last bit.
    """
    data = path.read_bytes()
    if b"\x00" in data:
        raise _Unusual
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Unusual from None
    head = text.split("\n", 1)[0].rstrip("\r")
    if '"' in head or "'" in head:
        raise _Unusual
    header = [c.strip().lstrip("\ufeff") for c in head.split(",")]
    if len(set(header)) != len(header) or any(c not in header for c in columns):
        raise _Unusual
    import pandas as pd  # here, not at import: small traces never need it (see load_trace)

    columns = tuple(c for c in columns if c not in unused)
    # The header's last column is read too: a row with a cell there has all its fields.
    parsed = columns if header[-1] in columns else (*columns, header[-1])
    dtypes = dict.fromkeys(parsed, str)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)  # e.g. a row longer than the header
            df = pd.read_csv(io.StringIO(text), header=0, names=header, usecols=list(parsed), dtype=dtypes,
                             keep_default_na=False, na_filter=False, skipinitialspace=True, engine="c",
                             skip_blank_lines=False, index_col=False)
    except Exception:  # any parser complaint or warning: the checker words it
        raise _Unusual from None
    if len(df) == 0:
        raise _Unusual
    last = df[header[-1]]
    filled = "" not in last.tolist()
    if not _line_shapes_ok(data, len(df), field_limit, last_cells_filled=filled):
        raise _Unusual
    return {c: _whole_numbers(df[c].tolist()) if c in numeric else _stripped(df[c].tolist()) for c in columns}


def _whole_numbers(cells: list[str]) -> np.ndarray:
    """int64 of each cell by Python's ``int()`` (numpy calls it per cell, in C), as the checker
    reads a whole number first; ``12.0`` or ``1e3`` (which the checker reads through ``float``)
    and numbers beyond int64 go to the checker. pandas' own integer parser is not used: it
    takes ``1e3`` and ``12.0`` through its float parser, which is not Python's."""
    try:
        return np.array(cells, dtype=np.int64)
    except (ValueError, OverflowError, TypeError):
        raise _Unusual from None


# The white space str.strip() removes that an ASCII cell can hold ("\n" cannot: one record a line).
_ASCII_WHITESPACE = " \t\r\x0b\x0c\x1c\x1d\x1e\x1f"


def _stripped(cells: list[str]) -> list[str]:
    """The cells without white space at their edges, as the checker reads them. pandas has
    skipped the spaces after each comma; finding any other edge space in the joined column is
    far cheaper than stripping every cell, and almost no trace has one."""
    text = "\n" + "\n".join(cells) + "\n"
    # A one-character search is a memchr; the two-character ones run only for characters present.
    if text.isascii() and not any(w in text and (("\n" + w) in text or (w + "\n") in text)
                                  for w in _ASCII_WHITESPACE):
        return cells
    return [c.strip() for c in cells]


def _ints(values: np.ndarray, minimum: int = 0) -> np.ndarray:
    if len(values) and (int(values.min()) < minimum or int(values.max()) >= MAX_COUNT):
        raise _Unusual
    return values


def _times(cells: list[str]) -> np.ndarray:
    try:
        values = np.array(list(map(float, cells)))  # float() per cell, as the checker does: same text, same double
    except ValueError:
        raise _Unusual from None
    if len(values) and not (np.isfinite(values).all() and values.min() >= 0.0 and values.max() < MAX_TIME_US):
        raise _Unusual
    return values


def _first_rows(ids: list[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(the distinct IDs in order of first appearance, the row of each one's first appearance,
    each row's position in that list)."""
    n = len(ids)
    # dict() keeps a key's first insertion order and its last value: over the reversed rows,
    # the last value is the first row.
    first = dict(zip(reversed(ids), range(n - 1, -1, -1)))
    unique = list(dict.fromkeys(ids))
    first_row = np.fromiter(map(first.__getitem__, unique), dtype=np.int64, count=len(unique))
    if len(unique) == n:
        return unique, first_row, np.arange(n)
    pos = dict(zip(unique, range(len(unique))))
    return unique, first_row, np.fromiter(map(pos.__getitem__, ids), dtype=np.int64, count=n)


def tensor_objects(ids: list[str], nbytes: np.ndarray, numel: np.ndarray, each: np.ndarray, raw_cats: list[str],
                   storages: list[str], shape_text: list[str]) -> dict:
    """{ID: Tensor} of one row per tensor, from its columns (the checker's rules for each cell)."""
    from .trace import Tensor, _parse_shape, normalize_category

    norm = {raw: normalize_category(raw) for raw in set(raw_cats)}
    shapes = {text: _parse_shape(text) for text in set(shape_text)}
    storage = [s if s != "0" else "" for s in storages]
    objs = map(partial(tuple.__new__, Tensor), zip(ids, nbytes.tolist(), numel.tolist(), each.tolist(),
               map(norm.__getitem__, raw_cats), storage, map(shapes.__getitem__, shape_text)))
    return dict(zip(ids, objs))


def _sizes_fit(numel: np.ndarray, each: np.ndarray) -> np.ndarray:
    """Each tensor's bytes; sizes near the limits (where int64 products could overflow) are left
    to the checker."""
    if len(numel) and float(numel.astype(float).dot(each.astype(float))) >= MAX_BYTES / 2:
        raise _Unusual
    return numel * each


def fast_tensors(path: Path, columns: tuple[str, ...], field_limit: int):
    """tensor.csv as {ID: Tensor}, computed column by column (see the checker,
    ``triosim.trace._load_tensors``, for the rules)."""
    from .trace import _CATEGORY_RANK, Tensor, _parse_shape, normalize_category

    df = _frame(path, columns, field_limit, numeric=("TensorNumElement", "TensorEachByte"),
                unused=("Index", "gpuid"))
    ids = df["TensorID"]
    if "'" in "".join(ids) or '"' in "".join(ids):
        ids = [t.strip("'\"") for t in ids]
    numel = _ints(df["TensorNumElement"])
    each = _ints(df["TensorEachByte"])
    nbytes = _sizes_fit(numel, each)
    raw_cats = df["TensorType"]
    norm = {raw: normalize_category(raw) for raw in set(raw_cats)}
    storages = df["TensorStorgeid"]
    shape_text = df["TensorShape"]
    if int(nbytes.sum()) < MAX_BYTES:  # else (rows of one tensor counted twice?) see below
        # One row per tensor, the usual case: no merging.
        tensors = tensor_objects(ids, nbytes, numel, each, raw_cats, storages, shape_text)
        if len(tensors) == len(ids):
            if "" in tensors:
                raise _Unusual
            return tensors
    if "" in ids:
        raise _Unusual
    unique, first, code = _first_rows(ids)
    # Rows of one ID must agree on size; the category is the first of the highest rank.
    if (numel != numel[first][code]).any() or (each != each[first][code]).any():
        raise _Unusual
    rank_of = {raw: _CATEGORY_RANK.get(c, 2) for raw, c in norm.items()}
    rank = np.fromiter(map(rank_of.__getitem__, raw_cats), dtype=np.int64, count=len(raw_cats))
    order = np.lexsort((np.arange(len(code)), -rank, code))
    starts = np.flatnonzero(np.diff(code[order], prepend=-1))
    cat_rows = order[starts].tolist()
    if int(nbytes[first].sum()) >= MAX_BYTES:
        raise _Unusual
    rows = first.tolist()
    shapes = {text: _parse_shape(text) for text in set(map(shape_text.__getitem__, rows))}
    categories = [norm[raw_cats[r]] for r in cat_rows]
    storage = [storages[r] for r in rows]
    storage = [s if s != "0" else "" for s in storage]
    objs = map(Tensor, unique, nbytes[first].tolist(), numel[first].tolist(), each[first].tolist(), categories,
               storage, [shapes[shape_text[r]] for r in rows])
    return dict(zip(unique, objs))


def _one_list_a_cell(joined: str, cells: int) -> bool:
    """True when each of the ``cells`` lines of ``joined`` is one bracketed list: it starts with
    ``[``, ends with ``]`` and holds no other bracket (counting in C, not one regex per cell)."""
    return (joined.count("[") == cells and joined.count("]") == cells and joined[:1] == "[" and joined[-1:] == "]"
            and joined.count("\n[") == cells - 1 and joined.count("]\n") == cells - 1)


# What may be in a size list besides digits: the checker's form is "[]" or "[12; 3]".
_SIZE_LIST_BYTES = b"0123456789 ;[]\n"
_DIGITS_AS_D = bytes.maketrans(b"0123456789", b"dddddddddd")


def _size_lists_ok(values: list[str]) -> bool:
    """True when every cell is a size list the checker is sure to accept: ``[]`` or ``[12; 3]``,
    at most 15 digits a size (below 2^53). Anything else (quotes, decimals, a space inside a
    number) goes to the checker."""
    joined = "\n".join(values)
    if not _one_list_a_cell(joined, len(values)):
        return False
    if joined.encode("ascii", "replace").translate(None, _SIZE_LIST_BYTES):
        return False  # a character other than digits, spaces, ';' and brackets
    while "  " in joined:
        joined = joined.replace("  ", " ")
    # Spaces may stand beside brackets and separators, not inside a number ("1 2").
    bare = joined.replace(" ;", ";").replace("; ", ";").replace("[ ", "[").replace(" ]", "]")
    if " " in bare or ";;" in bare or "[;" in bare or ";]" in bare:
        return False  # ... or an empty element
    return b"d" * 16 not in bare.encode("ascii").translate(_DIGITS_AS_D)  # at most 15 digits a number


def _id_lists(values: list[str]) -> list[tuple[str, ...]]:
    """Each cell's tensor IDs."""
    from .trace import parse_id_list

    joined = "\n".join(values)
    if "'" in joined or '"' in joined:
        try:
            out = [parse_id_list(text) for text in values]  # quoted IDs: the general parser
        except ValueError:
            raise _Unusual from None
    else:
        # The common form, [4; 6; 8]: one pass over the whole column instead of one per cell.
        if not _one_list_a_cell(joined, len(values)):
            raise _Unusual
        bare = joined.replace(" ", "")
        if ";;" in bare or "[;" in bare or ";]" in bare:
            raise _Unusual  # an empty element
        bodies = bare.replace("[", "").replace("]", "").split("\n")
        out = list(map(tuple, map(str.split, bodies, repeat(";"))))  # C loops, not one Python step per cell
        if "" in bodies:  # an empty list splits to ("",)
            out = [ids if ids != ("",) else () for ids in out]
    return out


def fast_ops(path: Path, columns: tuple[str, ...], field_limit: int, tensors: dict, time_column: str):
    df = _frame(path, columns, field_limit, unused=("gpuid",),
                numeric=("OperatorID",))
    if not (_size_lists_ok(df["InputSize"]) and _size_lists_ok(df["OutputSize"])):
        raise _Unusual
    inputs = _id_lists(df["Operator_input"])
    outputs = _id_lists(df["Operator_output"])
    # Every ID must be a tensor: looking each up gives the codes derive needs anyway.
    index = dict(zip(tensors, range(len(tensors))))
    input_pairs, output_pairs = coded_pairs(inputs, index), coded_pairs(outputs, index)
    if input_pairs is None or output_pairs is None:
        raise _Unusual
    ops = op_objects(df["OperatorName"], df["stage"], df["tpflag"], df["OperatorID"], _times(df["Operator_cudatime"]),
                     _times(df["Operator_cudatimenooverlap"]), inputs, outputs, time_column)
    return ops, OpTensorCodes(list(tensors), *input_pairs, *output_pairs)


def op_objects(names: list[str], stage_cells: list[str], tpflags: list[str], op_ids: np.ndarray, span_us: np.ndarray,
               busy_us: np.ndarray, inputs: list[tuple[str, ...]], outputs: list[tuple[str, ...]],
               time_column: str) -> list:
    """The Op of each row, from its columns (the checker's rules for each cell)."""
    from .trace import STAGES, Op

    stage_of = {s: s.lower() for s in set(stage_cells)}
    if not set(stage_of.values()) <= set(STAGES) or not set(tpflags) <= {"0", "1", ""}:
        raise _Unusual
    stages = list(map(stage_of.__getitem__, stage_cells))
    op_ids = _ints(op_ids).tolist()
    use = busy_us if time_column == "nooverlap" else span_us
    n = len(op_ids)
    # numpy's float64 division is IEEE division, as Python's: the same seconds as x / 1e6.
    duration = (use / 1e6).tolist()
    span_s = (span_us / 1e6).tolist()
    tp = list(map("1".__eq__, tpflags))
    return list(map(partial(tuple.__new__, Op), zip(range(n), op_ids, names, inputs, outputs, duration, span_s,
                                                     stages, tp, range(2, n + 2))))


def plain_tensors(path: Path, columns: tuple[str, ...], field_limit: int) -> tuple[TensorTable, np.ndarray, np.ndarray]:
    """tensor.csv of a plain file (see :mod:`triosim.trace_bytes`): ({ID: Tensor}, the distinct
    IDs as integers, sorted, and each one's place in the dictionary)."""
    fields = split_fields(path.read_bytes(), columns, field_limit)
    ids, numbers = fields.plain_ids("TensorID")
    numel, each = _ints(fields.whole_numbers("TensorNumElement")), _ints(fields.whole_numbers("TensorEachByte"))
    nbytes = _sizes_fit(numel, each)
    by_number, first, inverse = np.unique(numbers, return_index=True, return_inverse=True)
    raw_cats, storages, shapes = (fields.texts(c) for c in ("TensorType", "TensorStorgeid", "TensorShape"))
    if len(by_number) == len(numbers):  # one row per tensor
        if int(nbytes.sum()) >= MAX_BYTES:
            raise _Unusual
        return _table(ids, nbytes, numel, each, raw_cats, storages, shapes), by_number, first
    # A tensor on several rows (one per op that takes it): the rows must agree on its size; its
    # category is the first of the highest rank; the rest comes from its first row.
    if (numel != numel[first][inverse]).any() or (each != each[first][inverse]).any():
        raise _Unusual
    appearance = np.argsort(first, kind="stable")  # the distinct IDs in order of first row
    place = np.empty_like(appearance)
    place[appearance] = np.arange(len(appearance))
    rows = first[appearance]
    if int(nbytes[rows].sum()) >= MAX_BYTES:
        raise _Unusual
    from .trace import _CATEGORY_RANK, normalize_category

    rank_of = {raw: _CATEGORY_RANK.get(normalize_category(raw), 2) for raw in set(raw_cats)}
    rank = np.fromiter(map(rank_of.__getitem__, raw_cats), dtype=np.int64, count=len(raw_cats))
    code = place[inverse]
    by_rank = np.lexsort((np.arange(len(code)), -rank, code))
    cat_rows = by_rank[np.flatnonzero(np.diff(code[by_rank], prepend=-1))].tolist()
    pick = rows.tolist()
    tensors = _table(list(map(ids.__getitem__, pick)), nbytes[rows], numel[rows], each[rows],
                     list(map(raw_cats.__getitem__, cat_rows)), list(map(storages.__getitem__, pick)),
                     list(map(shapes.__getitem__, pick)))
    return tensors, by_number, place


def _table(ids: list[str], nbytes: np.ndarray, numel: np.ndarray, each: np.ndarray, raw_cats: list[str],
           storages: list[str], shape_texts: list[str]) -> TensorTable:
    """The tensors of one row each as a :class:`TensorTable` (the checker's rules for each cell)."""
    from .trace import normalize_category

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
                          _times(fields.texts("Operator_cudatime")), _times(fields.texts("Operator_cudatimenooverlap")),
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
# here (see triosim.forked_call); below it, forking costs more than it saves.
FORK_MIN_BYTES = 8_000_000


def plain_load(root: Path, tensor_columns: tuple[str, ...], trace_columns: tuple[str, ...], field_limit: int,
               time_column: str, fork_min_bytes: int = FORK_MIN_BYTES):
    """(tensors, ops, the ops' tensor lists coded) of a plain trace (see :mod:`triosim.trace_bytes`),
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
    except (Declined, _Unusual, OSError):
        return None
    return tensors, ops, codes


class _RunHere:
    """:class:`ForkedCall`'s interface, run here."""

    def __init__(self, fn, *args) -> None:
        self._value = fn(*args)

    def result(self):
        return self._value


def pandas_load(root: Path, tensor_columns: tuple[str, ...], trace_columns: tuple[str, ...], field_limit: int,
                time_column: str):
    """The same through pandas' C parser, for files that are not plain; None when the checker
    must decide."""
    try:
        tensors = fast_tensors(root / "tensor.csv", tensor_columns, field_limit)
        ops, codes = fast_ops(root / "trace.csv", trace_columns, field_limit, tensors, time_column)
    except (_Unusual, OSError):
        return None
    return tensors, ops, codes


def fast_load(root: Path, tensor_columns: tuple[str, ...], trace_columns: tuple[str, ...], field_limit: int,
              time_column: str, with_pandas: bool = True):
    """(tensors, ops, the ops' tensor lists coded) read the fast way: split on the bytes when the
    files are plain, else (``with_pandas``) through pandas; None when the row-by-row checker must
    decide."""
    loaded = plain_load(root, tensor_columns, trace_columns, field_limit, time_column)
    if loaded is None and with_pandas:
        loaded = pandas_load(root, tensor_columns, trace_columns, field_limit, time_column)
    return loaded


__all__ = ["fast_load"]
