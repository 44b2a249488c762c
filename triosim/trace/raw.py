"""A trace directory's rows as text (``trace.csv``, ``tensor.csv`` and ``meta.json``), read and
written as they are: what ``triosim trace repeat`` copies and renumbers."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, TraceError
from ..output import atomic_write_dir, atomic_write_text

TRACE_FILES = ("trace.csv", "tensor.csv", "meta.json")


@dataclass
class RawTrace:
    """A trace directory's rows, as text, in file order."""

    op_header: list[str]
    op_rows: list[list[str]]
    tensor_header: list[str]
    tensor_rows: list[list[str]]
    meta: dict = field(default_factory=dict)

    def col(self, name: str) -> int:
        return self.op_header.index(name)


def read_raw(path: str | os.PathLike) -> RawTrace:
    """The rows of a trace directory as text; a problem (an undecodable byte, a broken CSV, a
    meta.json nested too deep) is one TraceError naming the file and line."""
    from .checker import _decode

    root = Path(path)

    def rows(name: str) -> tuple[list[str], list[list[str]]]:
        text = _decode(root / name)
        reader = csv.reader(io.StringIO(text, newline=""))
        try:
            data = [r for r in reader if r and any(x.strip() for x in r)]
        except csv.Error as exc:
            raise TraceError(name, f"malformed CSV ({exc})", row=max(1, reader.line_num)) from None
        if not data:
            raise TraceError(name, "file is empty (no header row)")
        return [h.strip().lstrip("\ufeff") for h in data[0]], data[1:]

    oh, orows = rows("trace.csv")
    th, trows = rows("tensor.csv")
    meta = {}
    if (root / "meta.json").is_file():
        try:
            meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TraceError(str(root / "meta.json"), f"unreadable JSON ({exc})") from None
        except RecursionError:
            raise TraceError(str(root / "meta.json"), "unreadable JSON (nested too deep)") from None
    return RawTrace(oh, orows, th, trows, meta if isinstance(meta, dict) else {})


def _csv_text(header: list[str], rows: list[list[str]]) -> str:
    buf = io.StringIO()
    wr = csv.writer(buf, lineterminator="\n")
    wr.writerow(header)
    wr.writerows(rows)
    return buf.getvalue()


def write_raw_dir(path: str | os.PathLike, raw: RawTrace, flag: str = "") -> None:
    """Write the three files as a new directory ``path``, put in place whole (an existing trace
    directory there is replaced in one step; see :func:`triosim.output.atomic_write_dir`)."""
    def write(d: Path) -> None:
        for name, text in _texts(raw):
            (d / name).write_text(text, encoding="utf-8", newline="")

    atomic_write_dir(path, write, flag=flag, replaceable=TRACE_FILES)


def _texts(raw: RawTrace) -> list[tuple[str, str]]:
    return [("tensor.csv", _csv_text(raw.tensor_header, raw.tensor_rows)),
            ("trace.csv", _csv_text(raw.op_header, raw.op_rows)),
            ("meta.json", json.dumps(raw.meta, indent=2, sort_keys=True) + "\n")]


def write_raw(path: str | os.PathLike, raw: RawTrace, protect: Sequence[str | os.PathLike] = (),
              flag: str = "") -> None:
    """Write the three files into ``path`` (created if needed); ``flag`` (``--out``) names the
    option that gave the path in error messages."""
    root = Path(path)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag + ' ' if flag else ''}{root}: cannot create the output directory "
                          f"({exc.strerror or exc})") from None
    atomic_write_text(root / "tensor.csv", _csv_text(raw.tensor_header, raw.tensor_rows), protect=protect, flag=flag)
    atomic_write_text(root / "trace.csv", _csv_text(raw.op_header, raw.op_rows), protect=protect, flag=flag)
    atomic_write_text(root / "meta.json", json.dumps(raw.meta, indent=2, sort_keys=True) + "\n", protect=protect,
                      flag=flag)


__all__ = ["TRACE_FILES", "RawTrace", "read_raw", "write_raw", "write_raw_dir"]
