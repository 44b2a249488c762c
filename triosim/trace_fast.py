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
from pathlib import Path

import numpy as np
import pandas as pd

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
    # Commas inside quotes separate nothing; count the others line by line.
    bare = np.frombuffer(re.sub(rb'"[^"\n]*"', b"", data), dtype=np.uint8)
    bare_ends = np.flatnonzero(bare == 10)
    commas = np.bincount(np.searchsorted(bare_ends, np.flatnonzero(bare == 44)), minlength=len(bare_ends) + 1)
    return bool((commas[1:rows + 1] == commas[0]).all())


def _frame(path: Path, columns: tuple[str, ...], field_limit: int) -> dict[str, list[str]]:
    """The used columns as lists of stripped strings; data row i is on line i + 2."""
    data = path.read_bytes()
    if b"\x00" in data:
        raise _Unusual
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Unusual from None
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
        # float() per cell, as the checker does: same text, same double.
        out = np.array(values, dtype=object).astype(float)
    except (ValueError, TypeError):
        raise _Unusual from None
    if len(out) and not (np.isfinite(out).all() and out.min() >= 0.0 and out.max() < MAX_TIME_US):
        raise _Unusual
    return out.tolist()


def fast_tensors(path: Path, columns: tuple[str, ...], field_limit: int):
    from .trace import _CATEGORY_RANK, Tensor, _parse_shape, normalize_category

    df = _frame(path, columns, field_limit)
    ids = [t.strip("'\"") for t in df["TensorID"]]
    numels = _ints(df["TensorNumElement"])
    eaches = _ints(df["TensorEachByte"])
    categories: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...] | None] = {}
    tensors: dict = {}
    total = 0
    for tid, n, e, raw_cat, storage, shape in zip(ids, numels, eaches, df["TensorType"], df["TensorStorgeid"],
                                                  df["TensorShape"]):
        if not tid:
            raise _Unusual
        nbytes = n * e
        if nbytes >= MAX_BYTES:
            raise _Unusual
        category = categories.get(raw_cat)
        if category is None:
            category = categories[raw_cat] = normalize_category(raw_cat)
        prev = tensors.get(tid)
        if prev is not None:
            if prev.numel != n or prev.each_byte != e:
                raise _Unusual
            if _CATEGORY_RANK.get(category, 2) > _CATEGORY_RANK.get(prev.category, 2):
                tensors[tid] = Tensor(prev.id, prev.bytes, prev.numel, prev.each_byte, category, prev.storage,
                                      prev.shape)
            continue
        total += nbytes
        if total >= MAX_BYTES:
            raise _Unusual
        if shape not in shapes:
            shapes[shape] = _parse_shape(shape)
        tensors[tid] = Tensor(id=tid, bytes=nbytes, numel=n, each_byte=e, category=category,
                              storage=storage if storage not in ("", "0") else "", shape=shapes[shape])
    return tensors


def _id_lists(values: list[str], tensors: dict) -> list[tuple[str, ...]]:
    from .trace import parse_id_list

    out = []
    for text in values:
        if text[:1] != "[" or text[-1:] != "]" or "'" in text or '"' in text:
            try:
                items = parse_id_list(text)  # quoted IDs and odd spacing: the general parser
            except ValueError:
                raise _Unusual from None
        else:
            body = text[1:-1].replace(" ", "")
            items = tuple(body.split(";")) if body else ()
            if "" in items:
                raise _Unusual
        for t in items:
            if t not in tensors:
                raise _Unusual
        out.append(items)
    return out


def fast_ops(path: Path, columns: tuple[str, ...], field_limit: int, tensors: dict, time_column: str):
    from .trace import STAGES, Op

    df = _frame(path, columns, field_limit)
    size_list = re.compile(_SIZE_LIST)
    for col in ("InputSize", "OutputSize"):
        if not all(size_list.fullmatch(v) for v in df[col]):
            raise _Unusual
    stages = [v.lower() for v in df["stage"]]
    if not set(stages) <= set(STAGES) or not set(df["tpflag"]) <= {"0", "1", ""}:
        raise _Unusual
    inputs = _id_lists(df["Operator_input"], tensors)
    outputs = _id_lists(df["Operator_output"], tensors)
    span = _times(df["Operator_cudatime"])
    busy = _times(df["Operator_cudatimenooverlap"])
    op_ids = _ints(df["OperatorID"])
    use = busy if time_column == "nooverlap" else span
    return [
        Op(index=i, op_id=op_ids[i], name=name, inputs=inputs[i], outputs=outputs[i], duration_s=use[i] / 1e6,
           span_s=span[i] / 1e6, stage=stage, tpflag=tp == "1", line=i + 2)
        for i, (name, stage, tp) in enumerate(zip(df["OperatorName"], stages, df["tpflag"]))
    ]


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
