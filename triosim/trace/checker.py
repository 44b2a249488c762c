"""The row-by-row checker of trace files: reads both CSVs cell by cell and names the file, line
and column of the first problem it finds.

Every rule a trace's cells must follow is written here once; the fast reader
(:mod:`triosim.trace.arrow_reader`) checks the same rules on whole columns and, on any doubt,
leaves the files to this checker, so that an error message is always this one.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from ..checks import MAX_BYTES, cell_int, cell_time_us
from ..errors import TraceError
from .model import (
    BUSY_SLACK_US,
    CATEGORY_RANK,
    STAGES,
    TENSOR_COLUMNS,
    TRACE_COLUMNS,
    Op,
    Tensor,
    normalize_category,
    parse_id_list,
    parse_int_list,
    parse_shape,
    tensor_type_problem,
)


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


def load_tensors(path: Path) -> dict[str, Tensor]:
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
        problem = tensor_type_problem(row["TensorType"])
        if problem is not None:
            raise TraceError("tensor.csv", problem, row=line, field="TensorType")
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
            if CATEGORY_RANK.get(category, 2) <= CATEGORY_RANK.get(prev.category, 2):
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
            shape=parse_shape(row["TensorShape"]),
        )
    return tensors


def load_ops(path: Path, tensors: dict[str, Tensor], time_column: str) -> list[Op]:
    ops: list[Op] = []
    id_lines: dict[int, int] = {}
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
        for col, id_col in (("InputSize", "Operator_input"), ("OutputSize", "Operator_output")):
            try:
                sizes = parse_int_list(row[col])
            except ValueError as exc:
                raise TraceError("trace.csv", str(exc), row=line, field=col) from None
            _check_sizes(sizes, ids[id_col], tensors, line, col, id_col)
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
        if busy > span + BUSY_SLACK_US:
            raise TraceError("trace.csv", f"busy time {row['Operator_cudatimenooverlap']} µs is more than the span "
                             f"Operator_cudatime {row['Operator_cudatime']} µs", row=line,
                             field="Operator_cudatimenooverlap")
        op_id = _int_field("trace.csv", line, "OperatorID", row["OperatorID"])
        if op_id in id_lines:
            raise TraceError("trace.csv", f"{op_id} is also the ID of line {id_lines[op_id]}", row=line,
                             field="OperatorID")
        id_lines[op_id] = line
        ops.append(
            Op(
                index=len(ops),
                op_id=op_id,
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


def _check_sizes(sizes: tuple[int, ...], ids: tuple[str, ...], tensors: dict[str, Tensor], line: int, col: str,
                 id_col: str) -> None:
    """InputSize/OutputSize give each listed tensor's element count: it must be tensor.csv's."""
    if len(sizes) != len(ids):
        raise TraceError("trace.csv", f"{len(sizes)} sizes for the {len(ids)} tensors of {id_col}", row=line,
                         field=col)
    for size, tid in zip(sizes, ids):
        if size != tensors[tid].numel:
            raise TraceError("trace.csv", f"{size} elements for tensor {tid}, but tensor.csv gives "
                             f"{tensors[tid].numel}", row=line, field=col)


__all__ = ["load_ops", "load_tensors"]
