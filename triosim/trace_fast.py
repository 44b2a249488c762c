"""The fast path of trace loading: both CSVs through pandas' C parser, checked column by column.

A recorded trace has hundreds of thousands of rows; reading them cell by cell in Python was
most of a large run's time. This reader parses each file in one call and validates whole
columns at once. It never reports an error itself: on anything unusual (a bad cell, a blank or
multi-line record, a byte that is not UTF-8, a duplicate tensor row, …) it returns None and
:func:`triosim.trace.load_trace` runs the row-by-row checker, which names the file, line and
column. It returns exactly what the checker would have returned (tested on mutated traces).
"""

from __future__ import annotations

import io
import re
import warnings
from itertools import chain
from pathlib import Path

import numpy as np

from .checks import MAX_BYTES, MAX_COUNT, MAX_TIME_US

# A size list the checker is sure to accept: "[]" or "[12; 3]", at most 15 digits a size
# (below 2^53). Anything else (quotes, decimals, spaces inside a number) goes to the checker.
_SIZE_LIST = r"\[(?: *\d{1,15} *(?:; *\d{1,15} *)*)?\]"


# Byte pairs that can put white space at the edge of a cell once pandas has skipped the spaces
# after each comma (a space before a separator, a quote or a line end, after a quote, at a line
# start; any tab). Substring tests are far cheaper than a regular expression over the file.
_EDGE_SPACE = (b" ,", b" \n", b" \r", b' "', b'" ', b"\n ", b"\t", b"\f", b"\v")


def _may_need_strip(data: bytes) -> bool:
    return any(p in data for p in _EDGE_SPACE) or data[:1].isspace() or data[-1:] == b" "


class _Unusual(Exception):
    """Something the fast path leaves to the row-by-row checker."""


def _line_shapes_ok(data: bytes, rows: int, field_limit: int) -> bool:
    """True when the file is plainly one record a line: ``rows`` data lines after the header,
    none longer than ``field_limit``, each with as many separators as the header (pandas fills
    a short row with empty cells where the checker reports "too few fields")."""
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    if len(ends) - (0 if data.endswith(b"\n") else -1) != rows + 1 or b"\r" in data.replace(b"\r\n", b""):
        return False
    starts = np.concatenate(([0], ends + 1))
    stops = np.concatenate((ends, [len(data)]))
    if int((stops - starts).max()) > field_limit:
        return False
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


def _frame(path: Path, columns: tuple[str, ...], field_limit: int) -> dict[str, list[str]]:
    """The used columns as lists of stripped strings; data row i is on line i + 2."""
    data = path.read_bytes()
    if b"\x00" in data:
        raise _Unusual
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Unusual from None
    import pandas as pd  # here, not at import: small traces never need it (see load_trace)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)  # e.g. a row longer than the header
            df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_filter=False,
                             skipinitialspace=True, engine="c", skip_blank_lines=False, index_col=False)
    except Exception:  # any parser complaint or warning: the checker words it
        raise _Unusual from None
    if len(df) == 0 or not _line_shapes_ok(data, len(df), field_limit):
        raise _Unusual
    header = [str(c).strip().lstrip("\ufeff") for c in df.columns]
    if len(set(header)) != len(header) or any(c not in header for c in columns):
        raise _Unusual
    df.columns = header
    if _may_need_strip(data):
        return {c: [v.strip() for v in df[c].tolist()] for c in columns}
    return {c: df[c].tolist() for c in columns}  # no cell starts or ends with white space


def _ints(values: list[str], minimum: int = 0) -> list[int]:
    try:
        out = list(map(int, values))
    except ValueError:  # 12.0, 1e3, inf, abc: the checker decides
        raise _Unusual from None
    if out and (min(out) < minimum or max(out) >= MAX_COUNT):
        raise _Unusual
    return out


def _times(values: list[str]) -> list[float]:
    try:
        out = list(map(float, values))  # float() per cell, as the checker does: same text, same double
    except ValueError:
        raise _Unusual from None
    arr = np.array(out)
    if len(arr) and not (np.isfinite(arr).all() and arr.min() >= 0.0 and arr.max() < MAX_TIME_US):
        raise _Unusual
    return out


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


def fast_tensors(path: Path, columns: tuple[str, ...], field_limit: int):
    """tensor.csv as {ID: Tensor}, computed column by column (see the checker,
    ``triosim.trace._load_tensors``, for the rules)."""
    from .trace import _CATEGORY_RANK, Tensor, _parse_shape, normalize_category

    df = _frame(path, columns, field_limit)
    ids = df["TensorID"]
    if "'" in "".join(ids) or '"' in "".join(ids):
        ids = [t.strip("'\"") for t in ids]
    if "" in set(ids):
        raise _Unusual
    numel = np.array(_ints(df["TensorNumElement"]), dtype=np.int64)
    each = np.array(_ints(df["TensorEachByte"]), dtype=np.int64)
    # Sizes near the limits (where int64 products could overflow) are left to the checker.
    if len(numel) and float(numel.astype(float).dot(each.astype(float))) >= MAX_BYTES / 2:
        raise _Unusual
    nbytes = numel * each
    raw_cats = df["TensorType"]
    norm = {raw: normalize_category(raw) for raw in set(raw_cats)}
    unique, first, code = _first_rows(ids)
    if len(unique) < len(ids):
        # Rows of one ID must agree on size; the category is the first of the highest rank.
        if (numel != numel[first][code]).any() or (each != each[first][code]).any():
            raise _Unusual
        rank_of = {raw: _CATEGORY_RANK.get(c, 2) for raw, c in norm.items()}
        rank = np.fromiter(map(rank_of.__getitem__, raw_cats), dtype=np.int64, count=len(raw_cats))
        order = np.lexsort((np.arange(len(code)), -rank, code))
        starts = np.flatnonzero(np.diff(code[order], prepend=-1))
        cat_rows = order[starts].tolist()
    else:
        cat_rows = first.tolist()
    if int(nbytes[first].sum()) >= MAX_BYTES:
        raise _Unusual
    rows = first.tolist()
    storages = df["TensorStorgeid"]
    shape_text = df["TensorShape"]
    shapes = {text: _parse_shape(text) for text in set(map(shape_text.__getitem__, rows))}
    categories = [norm[raw_cats[r]] for r in cat_rows]
    storage = [storages[r] for r in rows]
    storage = [s if s not in ("", "0") else "" for s in storage]
    first_bytes = nbytes[first].tolist()
    objs = map(Tensor, unique, first_bytes, numel[first].tolist(), each[first].tolist(), categories, storage,
               [shapes[shape_text[r]] for r in rows])
    return dict(zip(unique, objs))


_PLAIN_ID_LIST = re.compile(r"\[[^\[\]'\"]*\]")


def _id_lists(values: list[str], tensors: dict) -> list[tuple[str, ...]]:
    """Each cell's tensor IDs; every ID must be one of ``tensors``."""
    from .trace import parse_id_list

    joined = "\n".join(values)
    if "'" in joined or '"' in joined:
        try:
            out = [parse_id_list(text) for text in values]  # quoted IDs: the general parser
        except ValueError:
            raise _Unusual from None
    else:
        # The common form, [4; 6; 8]: one pass over the whole column instead of one per cell.
        if not all(map(_PLAIN_ID_LIST.fullmatch, values)):
            raise _Unusual
        bare = joined.replace(" ", "")
        if ";;" in bare or "[;" in bare or ";]" in bare:
            raise _Unusual  # an empty element
        bodies = bare.replace("[", "").replace("]", "").split("\n")
        out = [tuple(body.split(";")) if body else () for body in bodies]
    used = set(chain.from_iterable(out))
    if not used.issubset(tensors.keys()):
        raise _Unusual
    return out


def fast_ops(path: Path, columns: tuple[str, ...], field_limit: int, tensors: dict, time_column: str):
    from .trace import STAGES, Op

    df = _frame(path, columns, field_limit)
    size_list = re.compile(_SIZE_LIST)
    for col in ("InputSize", "OutputSize"):
        if not all(map(size_list.fullmatch, df[col])):
            raise _Unusual
    stages = list(map(str.lower, df["stage"]))
    if not set(stages) <= set(STAGES) or not set(df["tpflag"]) <= {"0", "1", ""}:
        raise _Unusual
    inputs = _id_lists(df["Operator_input"], tensors)
    outputs = _id_lists(df["Operator_output"], tensors)
    span = _times(df["Operator_cudatime"])
    busy = _times(df["Operator_cudatimenooverlap"])
    op_ids = _ints(df["OperatorID"])
    use = busy if time_column == "nooverlap" else span
    n = len(op_ids)
    # numpy's float64 division is IEEE division, as Python's: the same seconds as x / 1e6.
    duration = (np.array(use) / 1e6).tolist()
    span_s = (np.array(span) / 1e6).tolist()
    tp = [flag == "1" for flag in df["tpflag"]]
    return list(map(Op, range(n), op_ids, df["OperatorName"], inputs, outputs, duration, span_s, stages, tp,
                    range(2, n + 2)))


def fast_load(root: Path, tensor_columns: tuple[str, ...], trace_columns: tuple[str, ...], field_limit: int,
              time_column: str):
    """(tensors, ops) read the fast way, or None when the row-by-row checker must decide."""
    try:
        tensors = fast_tensors(root / "tensor.csv", tensor_columns, field_limit)
        ops = fast_ops(root / "trace.csv", trace_columns, field_limit, tensors, time_column)
    except (_Unusual, OSError):
        return None
    return tensors, ops


__all__ = ["fast_load"]
