"""Resuming an interrupted sweep (``triosim sweep --resume``), and never destroying the rows an
interrupted sweep left behind.

A sweep stopped by Ctrl-C, SIGTERM or SIGKILL keeps its finished rows in ``NAME.partial`` beside
each ``--out`` target (CSV: the header, then one line per finished configuration; JSON: the
document with ``"complete": false``). With ``--resume`` the next sweep with the same ``--out``
reads those rows back: a row is kept when its status is ``ok``, every figure reads back, and its
axis values are those of a configuration of this sweep (the file's columns must be this
sweep's columns, else it is another sweep's and resuming is refused). Only the configurations
without a kept row are simulated; the final file is the one an uninterrupted sweep writes, byte
for byte (figures are written with ``repr``, which reads back exactly; the speed-ups are
computed again from every row).

Without ``--resume``, an existing partial file is moved aside to ``NAME.partial.1`` (``.2``, …,
the first free name) and a note says so: its rows are never silently truncated. A partial file
that is a symbolic link is never read or written through (``O_NOFOLLOW``); it is moved aside
like any other.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .execute import OK, Outcome
from .grid import Point, format_value

PARTIAL_SUFFIX = ".partial"
MAX_PARTIAL_BYTES = 1 << 30  # a partial file of 100,000 rows is about 30 MB


def partial_path(path: str | os.PathLike) -> Path:
    """Where the rows of a running (or interrupted) sweep go: ``x.csv`` -> ``x.csv.partial``."""
    p = Path(path)
    return p.with_name(p.name + PARTIAL_SUFFIX)


def move_aside(path: Path) -> Path:
    """Rename ``path`` (a file or a symlink, never followed) to the first free ``path.N``."""
    for n in range(1, 10_000):
        target = path.with_name(f"{path.name}.{n}")
        if not os.path.lexists(target):
            try:
                os.rename(path, target)
            except OSError as exc:
                raise ConfigError(f"cannot move {path} aside to {target} ({exc.strerror or exc})") from None
            return target
    raise ConfigError(f"{path}: {path.name}.1 … {path.name}.9999 all exist; remove some")


def _read_no_follow(path: Path, flag: str) -> str:
    """The text of a partial file, refusing a symlink planted under its name."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{flag}: {path} is a symbolic link, not the partial file of a sweep; "
                              "remove it or leave out --resume") from None
        raise ConfigError(f"{flag}: cannot read {path} ({exc.strerror or exc})") from None
    with open(fd, "rb") as fh:
        data = fh.read(MAX_PARTIAL_BYTES + 1)
    if len(data) > MAX_PARTIAL_BYTES:
        raise ConfigError(f"{flag}: {path} is larger than the limit of {MAX_PARTIAL_BYTES:,} bytes for a partial "
                          "file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{flag}: {path} is not UTF-8 text, not the partial file of a sweep") from None


def _csv_records(text: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Header and complete rows: a last line cut short by a kill (no newline) is dropped."""
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows:
        return [], []
    head = rows[0]
    return head, [dict(zip(head, r)) for r in rows[1:] if len(r) == len(head)]


def _json_records(text: str) -> tuple[list[str], list[dict[str, Any]]]:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return [], []
    if not isinstance(doc, dict) or not isinstance(doc.get("columns"), list) or not isinstance(doc.get("rows"), list):
        return [], []
    return [str(c) for c in doc["columns"]], [r for r in doc["rows"] if isinstance(r, dict)]


def _number(value: Any, kind: type) -> Any:
    """A figure from a CSV cell (text) or a JSON value; None for an empty cell, ValueError for
    anything that is not a finite number of ``kind``."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(value)
    if kind is int:
        if isinstance(value, float):
            raise ValueError(value)
        return int(value)
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(value)
    return number


def _outcome(index: int, cells: Mapping[str, Any]) -> Outcome | None:
    """The Outcome a finished ``ok`` row records, or None when it does not read back whole."""
    if cells.get("status") != OK:
        return None  # failed and invalid configurations are settled again (a worker may have died)
    memory = cells.get("memory")
    try:
        makespan = _number(cells.get("makespan_ms"), float)
        if makespan is None:
            return None
        return Outcome(
            index=index,
            status=OK,
            reason=str(cells.get("reason") or ""),
            makespan_ms=makespan,
            mean_compute_ms=_number(cells.get("mean_compute_ms"), float),
            mean_exposed_comm_ms=_number(cells.get("mean_exposed_comm_ms"), float),
            max_peak_memory_bytes=_number(cells.get("max_peak_memory_bytes"), int),
            tasks=_number(cells.get("tasks"), int),
            samples_per_s=_number(cells.get("samples_per_s"), float),
            global_batch=_number(cells.get("global_batch"), int),
            micro_batch=_number(cells.get("micro_batch"), int),
            micro_batches=_number(cells.get("micro_batches"), int),
            tokens_per_s=_number(cells.get("tokens_per_s"), float),
            tflops_per_gpu=_number(cells.get("tflops_per_gpu"), float),
            mfu=_number(cells.get("mfu"), float),
            gpu=str(cells["gpu"]) if cells.get("gpu") not in (None, "") else None,
            op_time_source=(str(cells["op_time_source"]) if cells.get("op_time_source") not in (None, "")
                            else None),
            fits={"fits": True, "infeasible": False}.get(str(memory)) if memory not in (None, "") else None,
        )
    except (TypeError, ValueError, OverflowError):
        return None


@dataclass
class Resumed:
    """What ``--resume`` found: the finished outcomes by point index, the partial files read,
    and how many of their rows belong to no configuration of this sweep."""

    outcomes: dict[int, Outcome] = field(default_factory=dict)
    read: list[Path] = field(default_factory=list)
    foreign: int = 0
    sought: list[Path] = field(default_factory=list)  # the partial files looked for

    def describe(self) -> str:
        if not self.read:  # nothing was interrupted: the sweep runs whole (no file to name as read)
            names = ", ".join(str(p) for p in self.sought)
            return f"resuming: no partial file ({names}); every configuration runs"
        files = ", ".join(str(p) for p in self.read)
        extra = f"; {self.foreign} rows of other configurations set aside" if self.foreign else ""
        return f"resuming: {len(self.outcomes)} finished configurations kept from {files}{extra}"


def _point_key(values: Iterable[Any]) -> tuple[str, ...]:
    return tuple(format_value(v) for v in values)


def read_resumable(outs: Sequence[str], columns: Sequence[str], axes: Sequence[str],
                   points: Sequence[Point]) -> Resumed:
    """The finished rows of the partial files of ``outs`` that match this sweep's ``points``.

    ``columns`` are the result files' columns (the partial files must have exactly these),
    ``axes`` the grid's columns, which identify a configuration.
    """
    by_key: dict[tuple[str, ...], int | None] = {}
    for point in points:
        key = _point_key(v for _, v in point.values)
        by_key[key] = None if key in by_key else point.index  # two points shown alike: run both
    found = Resumed()
    for out in outs:
        part = partial_path(out)
        found.sought.append(Path(part))
        if not os.path.lexists(part):
            continue
        text = _read_no_follow(part, f"--out {out}")
        head, records = (_json_records if Path(out).suffix.lower() == ".json" else _csv_records)(text)
        if not head and not records:
            raise ConfigError(f"--out {out}: {part} is not the partial file of a sweep (no header); remove it or "
                              "leave out --resume")
        if list(head) != list(columns):
            raise ConfigError(f"--out {out}: {part} has other columns than this sweep ({len(head)} columns, this "
                              f"sweep has {len(columns)}): it is another sweep's; leave out --resume to set it aside")
        found.read.append(part)
        for cells in records:
            index = by_key.get(_point_key(cells.get(c) for c in axes))
            if index is None:
                found.foreign += 1
                continue
            outcome = _outcome(index, cells)
            if outcome is not None and index not in found.outcomes:
                found.outcomes[index] = outcome
    return found


__all__ = ["PARTIAL_SUFFIX", "Resumed", "move_aside", "partial_path", "read_resumable"]
