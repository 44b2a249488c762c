"""The pandas path of trace loading: both CSVs through pandas' C parser, checked column by column.

A recorded trace has hundreds of thousands of rows; reading them cell by cell in Python was
most of a large run's time. Plain files (the form every TrioSim tracer writes) are read without
pandas (:mod:`triosim.trace.plain_reader`); this reader takes any other large file: it parses each file
in one call and validates whole columns at once. Neither reports an error itself: on anything
unusual (a bad cell, a blank or multi-line record, a byte that is not UTF-8, …) they return None
and :func:`triosim.trace.load.load_trace` runs the row-by-row checker, which names the file, line and
column. Each returns exactly what the checker would have returned (tested on mutated traces).
The column helpers here (whole numbers, times, Op objects) serve both fast readers.
"""

from __future__ import annotations

import io
import warnings
from functools import partial
from itertools import repeat
from pathlib import Path

import numpy as np

from ..checks import MAX_BYTES, MAX_COUNT, MAX_TIME_US
from .buffer_columns import OpTensorCodes, coded_pairs


class Unusual(Exception):
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
        raise Unusual
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Unusual from None
    head = text.split("\n", 1)[0].rstrip("\r")
    if '"' in head or "'" in head:
        raise Unusual
    header = [c.strip().lstrip("\ufeff") for c in head.split(",")]
    if len(set(header)) != len(header) or any(c not in header for c in columns):
        raise Unusual
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
        raise Unusual from None
    if len(df) == 0:
        raise Unusual
    last = df[header[-1]]
    filled = "" not in last.tolist()
    if not _line_shapes_ok(data, len(df), field_limit, last_cells_filled=filled):
        raise Unusual
    return {c: _whole_numbers(df[c].tolist()) if c in numeric else _stripped(df[c].tolist()) for c in columns}


def _whole_numbers(cells: list[str]) -> np.ndarray:
    """int64 of each cell by Python's ``int()`` (numpy calls it per cell, in C), as the checker
    reads a whole number first; ``12.0`` or ``1e3`` (which the checker reads through ``float``)
    and numbers beyond int64 go to the checker. pandas' own integer parser is not used: it
    takes ``1e3`` and ``12.0`` through its float parser, which is not Python's."""
    try:
        return np.array(cells, dtype=np.int64)
    except (ValueError, OverflowError, TypeError):
        raise Unusual from None


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


def whole_counts(values: np.ndarray, minimum: int = 0) -> np.ndarray:
    if len(values) and (int(values.min()) < minimum or int(values.max()) >= MAX_COUNT):
        raise Unusual
    return values


def times_us(cells: list[str]) -> np.ndarray:
    try:
        values = np.array(list(map(float, cells)))  # float() per cell, as the checker does: same text, same double
    except ValueError:
        raise Unusual from None
    if len(values) and not (np.isfinite(values).all() and values.min() >= 0.0 and values.max() < MAX_TIME_US):
        raise Unusual
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
    from .load import Tensor, _parse_shape, normalize_category

    norm = {raw: normalize_category(raw) for raw in set(raw_cats)}
    shapes = {text: _parse_shape(text) for text in set(shape_text)}
    storage = [s if s != "0" else "" for s in storages]
    objs = map(partial(tuple.__new__, Tensor), zip(ids, nbytes.tolist(), numel.tolist(), each.tolist(),
               map(norm.__getitem__, raw_cats), storage, map(shapes.__getitem__, shape_text)))
    return dict(zip(ids, objs))


def category_rows(raw_cats: list[str], code: np.ndarray) -> list[int]:
    """Per tensor (``code``: each row's tensor, in order of first row), the row whose category it
    keeps: the first of the highest rank, as the checker merges a tensor's rows."""
    from .load import _CATEGORY_RANK, normalize_category

    rank_of = {raw: _CATEGORY_RANK.get(normalize_category(raw), 2) for raw in set(raw_cats)}
    rank = np.fromiter(map(rank_of.__getitem__, raw_cats), dtype=np.int64, count=len(raw_cats))
    order = np.lexsort((np.arange(len(code)), -rank, code))
    return order[np.flatnonzero(np.diff(code[order], prepend=-1))].tolist()


def bytes_in_range(numel: np.ndarray, each: np.ndarray) -> np.ndarray:
    """Each tensor's bytes; sizes near the limits (where int64 products could overflow) are left
    to the checker."""
    if len(numel) and float(numel.astype(float).dot(each.astype(float))) >= MAX_BYTES / 2:
        raise Unusual
    return numel * each


def fast_tensors(path: Path, columns: tuple[str, ...], field_limit: int):
    """tensor.csv as {ID: Tensor}, computed column by column (see the checker,
    ``triosim.trace.load._load_tensors``, for the rules)."""
    from .load import Tensor, _parse_shape, normalize_category

    df = _frame(path, columns, field_limit, numeric=("TensorNumElement", "TensorEachByte"),
                unused=("Index", "gpuid"))
    ids = df["TensorID"]
    if "'" in "".join(ids) or '"' in "".join(ids):
        ids = [t.strip("'\"") for t in ids]
    numel = whole_counts(df["TensorNumElement"])
    each = whole_counts(df["TensorEachByte"])
    nbytes = bytes_in_range(numel, each)
    raw_cats = df["TensorType"]
    storages = df["TensorStorgeid"]
    shape_text = df["TensorShape"]
    if int(nbytes.sum()) < MAX_BYTES:  # else (rows of one tensor counted twice?) see below
        # One row per tensor, the usual case: no merging.
        tensors = tensor_objects(ids, nbytes, numel, each, raw_cats, storages, shape_text)
        if len(tensors) == len(ids):
            if "" in tensors:
                raise Unusual
            return tensors
    if "" in ids:
        raise Unusual
    unique, first, code = _first_rows(ids)
    # Rows of one ID must agree on size; the category is the first of the highest rank.
    if (numel != numel[first][code]).any() or (each != each[first][code]).any():
        raise Unusual
    cat_rows = category_rows(raw_cats, code)
    if int(nbytes[first].sum()) >= MAX_BYTES:
        raise Unusual
    rows = first.tolist()
    shapes = {text: _parse_shape(text) for text in set(map(shape_text.__getitem__, rows))}
    norm = {raw: normalize_category(raw) for raw in set(raw_cats)}
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
    from .load import parse_id_list

    joined = "\n".join(values)
    if "'" in joined or '"' in joined:
        try:
            out = [parse_id_list(text) for text in values]  # quoted IDs: the general parser
        except ValueError:
            raise Unusual from None
    else:
        # The common form, [4; 6; 8]: one pass over the whole column instead of one per cell.
        if not _one_list_a_cell(joined, len(values)):
            raise Unusual
        bare = joined.replace(" ", "")
        if ";;" in bare or "[;" in bare or ";]" in bare:
            raise Unusual  # an empty element
        bodies = bare.replace("[", "").replace("]", "").split("\n")
        out = list(map(tuple, map(str.split, bodies, repeat(";"))))  # C loops, not one Python step per cell
        if "" in bodies:  # an empty list splits to ("",)
            out = [ids if ids != ("",) else () for ids in out]
    return out


def fast_ops(path: Path, columns: tuple[str, ...], field_limit: int, tensors: dict, time_column: str):
    df = _frame(path, columns, field_limit, unused=("gpuid",),
                numeric=("OperatorID",))
    if not (_size_lists_ok(df["InputSize"]) and _size_lists_ok(df["OutputSize"])):
        raise Unusual
    inputs = _id_lists(df["Operator_input"])
    outputs = _id_lists(df["Operator_output"])
    # Every ID must be a tensor: looking each up gives the codes derive needs anyway.
    index = dict(zip(tensors, range(len(tensors))))
    input_pairs, output_pairs = coded_pairs(inputs, index), coded_pairs(outputs, index)
    if input_pairs is None or output_pairs is None:
        raise Unusual
    ops = op_objects(df["OperatorName"], df["stage"], df["tpflag"], df["OperatorID"], times_us(df["Operator_cudatime"]),
                     times_us(df["Operator_cudatimenooverlap"]), inputs, outputs, time_column)
    return ops, OpTensorCodes(list(tensors), *input_pairs, *output_pairs)


def op_objects(names: list[str], stage_cells: list[str], tpflags: list[str], op_ids: np.ndarray, span_us: np.ndarray,
               busy_us: np.ndarray, inputs: list[tuple[str, ...]], outputs: list[tuple[str, ...]],
               time_column: str) -> list:
    """The Op of each row, from its columns (the checker's rules for each cell)."""
    from .load import STAGES, Op

    stage_of = {s: s.lower() for s in set(stage_cells)}
    if not set(stage_of.values()) <= set(STAGES) or not set(tpflags) <= {"0", "1", ""}:
        raise Unusual
    stages = list(map(stage_of.__getitem__, stage_cells))
    op_ids = whole_counts(op_ids).tolist()
    use = busy_us if time_column == "nooverlap" else span_us
    n = len(op_ids)
    # numpy's float64 division is IEEE division, as Python's: the same seconds as x / 1e6.
    duration = (use / 1e6).tolist()
    span_s = (span_us / 1e6).tolist()
    tp = list(map("1".__eq__, tpflags))
    return list(map(partial(tuple.__new__, Op), zip(range(n), op_ids, names, inputs, outputs, duration, span_s,
                                                     stages, tp, range(2, n + 2))))


def pandas_load(root: Path, tensor_columns: tuple[str, ...], trace_columns: tuple[str, ...], field_limit: int,
                time_column: str):
    """The same through pandas' C parser, for files that are not plain; None when the checker
    must decide."""
    try:
        tensors = fast_tensors(root / "tensor.csv", tensor_columns, field_limit)
        ops, codes = fast_ops(root / "trace.csv", trace_columns, field_limit, tensors, time_column)
    except (Unusual, OSError):
        return None
    return tensors, ops, codes


__all__ = ["op_objects", "pandas_load"]
