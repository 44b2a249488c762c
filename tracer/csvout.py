"""Writing a converted trace as the TrioSim CSV pair (trace.csv + tensor.csv).

Column layout and list syntax follow the original tracer so both the original Go loader and the
project's loader read the files: ID and size lists are written ``[4; 6; 8]`` (``[]`` when empty),
shapes as a quoted Python list, times in µs.  ``trace.csv`` carries one extra trailing column,
``fwd_op``, that older readers ignore.  Files are written to a temporary file in the target
directory and renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..output import atomic_write_text
from .convert import OpRow, TensorRow, TraceTables
from .errors import TracerError

TRACE_HEADER = ["OperatorID", "OperatorName", "Operator_input", "Operator_output",
                "Operator_cudatime", "Operator_cudatimenooverlap", "InputSize", "OutputSize",
                "gpuid", "stage", "tpflag", "fwd_op"]
TENSOR_HEADER = ["Index", "TensorID", "TensorShape", "TensorNumElement", "TensorEachByte",
                 "TensorType", "TensorStorgeid", "gpuid"]


def format_list(values: Iterable[int]) -> str:
    """``[4; 6; 8]`` — the original's ``str(list)`` with commas turned into semicolons."""
    return "[" + "; ".join(str(v) for v in values) + "]"


def format_time(us: float) -> str:
    """Microseconds, without a trailing ``.0`` and with at most three decimals (ns)."""
    r = round(float(us), 3)
    if r == int(r):
        return str(int(r))
    return f"{r:.3f}".rstrip("0").rstrip(".")


def _trace_rows(ops: Sequence[OpRow]) -> list[list[str]]:
    return [[str(o.op_id), o.name, format_list(o.inputs), format_list(o.outputs),
             format_time(o.cudatime), format_time(o.cudatime_nooverlap),
             format_list(o.input_sizes), format_list(o.output_sizes), str(o.gpuid), o.stage,
             str(o.tpflag), str(o.fwd_op)] for o in ops]


def _tensor_rows(rows: Sequence[TensorRow]) -> list[list[str]]:
    return [[str(r.index), str(r.tensor_id), str(list(r.shape)), str(r.numel), str(r.itemsize),
             r.category, str(r.storage), str(r.gpuid)] for r in rows]


def render_csv(header: list[str], rows: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename."""
    atomic_write_text(path, text)


def write_trace_dir(tables: TraceTables, out_dir: str | os.PathLike[str],
                    inputs: Iterable[str | os.PathLike[str]] = ()) -> tuple[Path, Path]:
    """Write ``trace.csv`` and ``tensor.csv`` into ``out_dir`` (created if needed).

    ``inputs`` are the files the trace was made from; writing over one of them is refused.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TracerError(f"{out}: output path exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TracerError(f"{out}: cannot create output directory ({exc.strerror})") from None
    trace_path, tensor_path = out / "trace.csv", out / "tensor.csv"
    protected = {Path(p).resolve() for p in inputs}
    for target in (trace_path, tensor_path):
        if target.resolve() in protected:
            raise TracerError(f"{target}: refusing to overwrite an input file")
    try:
        write_atomic(trace_path, render_csv(TRACE_HEADER, _trace_rows(tables.ops)))
        write_atomic(tensor_path, render_csv(TENSOR_HEADER, _tensor_rows(tables.tensors)))
    except OSError as exc:
        raise TracerError(f"{out}: cannot write trace files ({exc.strerror})") from None
    return trace_path, tensor_path
