"""Loading a trace directory: the two CSVs, read fast or checked row by row, and meta.json.

:func:`load_trace` reads ``trace.csv`` and ``tensor.csv`` (with pyarrow when they are large, see
:mod:`triosim.trace.arrow_reader`; cell by cell by :mod:`triosim.trace.checker` when they are
small or anything about them is unusual) and derives the data-flow facts
(:func:`triosim.trace.dataflow.derive`); the batch the trace was recorded at comes from the
argument or from the optional ``meta.json`` beside the CSVs.
"""

from __future__ import annotations

import csv
import gc
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..checks import json_int
from ..errors import ConfigError, TraceError
from .buffer_columns import first_op
from .checker import load_ops, load_tensors
from .dataflow import Trace, derive
from .order_check import check_read_order

DEFAULT_TRACE_BATCH = 128  # the batch assumed for a trace with neither meta.json nor a given batch
# meta.json's attention_mask: the mask of the trace's fused attention ops (the tracer writes
# mixed when only some are causal; the op cost reads anything but causal as the full mask)
ATTENTION_MASKS = ("causal", "full", "mixed")


def trace_batch_size(path: str | os.PathLike) -> tuple[int, str]:
    """The batch a trace directory was recorded at, and where that number comes from:
    ``(n, "meta.json")`` from its meta.json, else ``(128, "assumed")``."""
    info = read_trace_info(path)
    raw = info.get("batch_size")
    if raw is None:
        return DEFAULT_TRACE_BATCH, "assumed"
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TraceError(str(Path(path) / "meta.json"), f"batch_size must be an integer, got {raw!r}")
    return raw, "meta.json"


# Below this many bytes of trace.csv + tensor.csv the row-by-row checker is as quick as importing
# pyarrow and starting its threads (a 3,000-op trace of 0.7 MB: 0.30 s either way, whole load);
# from it on, pyarrow reads the files (an 8,000-op trace of 1.9 MB: 0.41 s against 0.46 s).
ARROW_MIN_BYTES = 1_000_000


def load_trace(path: str | os.PathLike, batch_size: int | None = None, time_column: str = "nooverlap",
               fast: bool | None = None) -> Trace:
    """Read and validate a trace directory; ``batch_size`` is the batch it was recorded at.

    ``batch_size`` None reads it from the directory's meta.json (written by ``triosim trace``);
    without one, 128 is assumed, with a ``UserWarning`` saying so (``trace.batch_source`` is then
    ``"assumed"``): pass the batch your trace was recorded at. ``time_column`` picks the op
    duration: ``nooverlap`` (sum of kernel times, the original's choice) or ``span`` (first
    kernel start to last kernel end). ``fast`` reads the files with pyarrow and checks them
    column by column (:mod:`triosim.trace.arrow_reader`), falling back to the row-by-row checker
    (:mod:`triosim.trace.checker`) on anything unusual (same result; ``fast=False`` always uses
    the checker; ``None``, the default: pyarrow for files of ``ARROW_MIN_BYTES`` or more only,
    since importing it takes longer than the checker's whole read of a smaller file). The
    tensors read by pyarrow are a :class:`~triosim.trace.tensor_table.TensorTable` (a read-only
    mapping kept as columns) rather than a dict.
    """
    source = "argument"
    if batch_size is None:
        batch_size, source = trace_batch_size(path)
        if source == "assumed":
            import warnings

            warnings.warn(
                f"{path}: no meta.json gives the batch the trace was recorded at; assuming "
                f"{DEFAULT_TRACE_BATCH} (pass batch_size=...)", UserWarning, stacklevel=2,
            )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ConfigError(f"-batch-size must be a positive integer, got {batch_size}")
    if time_column not in ("nooverlap", "span"):
        raise ConfigError(f"unknown time column {time_column!r} (nooverlap or span)")
    root = Path(path)
    if not root.is_dir():
        raise TraceError(str(root), "trace directory does not exist")
    for name in ("trace.csv", "tensor.csv"):
        if not (root / name).is_file():
            raise TraceError(str(root / name), "file not found")
    with collector_paused():
        loaded = None
        if fast or (fast is None and
                    sum((root / n).stat().st_size for n in ("trace.csv", "tensor.csv")) >= ARROW_MIN_BYTES):
            from .arrow_reader import (
                arrow_load,  # here, not at import: small traces never need pyarrow
            )

            # The checker's limit on a cell is the csv module's, whatever it is set to now.
            loaded = arrow_load(root, csv.field_size_limit(), time_column)
        codes = None
        if loaded is not None:
            tensors, ops, op_codes = loaded
            codes = (ops, tensors, op_codes)
        else:  # the row-by-row checker: slower, and names the line of any problem
            tensors = load_tensors(root / "tensor.csv")
            ops = load_ops(root / "trace.csv", tensors, time_column)
        trace = Trace(path=str(root), batch_size=batch_size, ops=ops, tensors=tensors, batch_source=source,
                      info=read_trace_info(root), _op_codes=codes)
        derived = derive(trace)
        check_order(derived)
        return derived


def check_order(trace: Trace) -> None:
    """The rules on the order of the ops (:mod:`triosim.trace.order_check`), on the buffers
    :func:`derive` coded: whichever reader read the files, the same check and the same error."""
    cols = trace.buffer_columns
    n, count = len(trace.ops), len(cols.ids)
    check_read_order(trace.ops, trace.tensors, cols.ids, trace.reads, trace.writes,
                     first_op(cols.read_code, cols.read_op, count, n), first_op(cols.write_code, cols.write_op, count, n))


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was before, after it).

    Loading a large trace makes millions of objects (cells, tuples, Tensor and Op objects) that
    all stay alive; the collector, triggered every few hundred allocations, walked them again
    and again, which took about a third of the load time. Nothing made here is cyclic garbage.
    When the collector comes back on, the objects made meanwhile join the oldest generation
    directly (freeze, then unfreeze) instead of all being walked by the first collection after
    the block (a third of a second after loading a 200k-op trace).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.enable()
            gc.unfreeze()


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def read_trace_info(path: str | os.PathLike) -> dict:
    """Optional ``meta.json`` beside the CSVs (written by our tracer): batch size, device, the
    attention mask (``causal``, ``full`` or ``mixed``; any other value is refused)…"""
    info = Path(path) / "meta.json"
    if not info.is_file():
        return {}
    try:
        # NaN/Infinity are not JSON; refuse them here rather than as a batch of NaN later.
        data = json.loads(info.read_text(encoding="utf-8"), parse_constant=_reject_constant)
    except (OSError, ValueError) as exc:
        raise TraceError(str(info), f"unreadable JSON ({exc})") from None
    except RecursionError:  # a document nested ~100,000 deep
        raise TraceError(str(info), "unreadable JSON (nested too deep)") from None
    if not isinstance(data, dict):
        raise TraceError(str(info), "expected a JSON object")
    if data.get("batch_size") is not None:  # null: the converter did not know the batch
        data["batch_size"] = json_int(data["batch_size"], str(info), "batch_size")
    if "attention_mask" in data and data["attention_mask"] not in ATTENTION_MASKS:
        # a misspelt mask would otherwise be costed as the full one without a word
        raise TraceError(str(info), f"must be {', '.join(ATTENTION_MASKS[:-1])} or {ATTENTION_MASKS[-1]}, "
                         f"got {json.dumps(data['attention_mask'])}", field="attention_mask")
    return data


__all__ = ["ARROW_MIN_BYTES", "DEFAULT_TRACE_BATCH", "check_order", "collector_paused", "load_trace", "read_trace_info",
           "trace_batch_size"]
