"""Many layers from a few traced ones: find the repeated transformer layer of a trace and write
a trace with that layer repeated to any depth.

A model too large for one GPU is traced with a few layers; ``triosim trace repeat --layers L``
(or ``--num-layers L`` on a run) rebuilds the trace of the L-layer model:

- **Finding the layer.** The forward ops' names are searched for the longest run of one unit
  repeated back to back (at least twice, containing a linear layer); among the alignments of
  that run the one whose units take the fewest activations from before them is chosen (a
  transformer layer reads only the residual stream). Each backward op belongs to the layer of
  its forward partner (partner-less gradient sums to the layer around them), and with
  per-parameter optimizer ops each such op to the layer whose parameters it updates.
  ``_foreach`` optimizer ops are split by parameter: their tensor lists are chunks in the
  optimizer's parameter order, and each layer's parameters must be one contiguous range.
  Every traced layer must have the same ops, tensor sizes and data-flow pattern.
- **Writing L layers.** The ops before the layers, the L layers (forward in order, backward in
  reverse), and the ops after them. Every tensor of a layer gets a new ID in each copy, except
  tensors all layers share (an in-place gradient buffer); what one layer hands to the next
  (the residual stream forward, its gradient backward) links copy j to copy j+1; the first
  copy keeps the IDs the ops before the layers write and the last copy those the ops after
  them read. Each op of a copy takes the mean time of that op over the traced layers, so the
  compute time is the non-layer time plus L times the mean layer time. ``_foreach`` optimizer
  ops get the L layers' tensors in their lists and a time scaled by the bytes they touch.
  ``meta.json`` records the traced and the repeated depth.

The parts: :mod:`~triosim.trace.layers` finds the layers, :mod:`~triosim.trace.repeat_rows`
writes the copies' rows, :mod:`~triosim.trace.raw` reads and writes a directory's rows; this
module holds the entry points and builds a repeated trace in memory.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from ..checks import MAX_BYTES, cell_time_us, json_int
from ..errors import ConfigError, TraceError
from ..limits import check_layer_count
from .dataflow import Trace, derive
from .layers import LayerLayout, find_layers
from .load import collector_paused, load_trace, trace_batch_size
from .model import Op, Tensor, normalize_category
from .raw import RawTrace, read_raw, write_raw, write_raw_dir
from .repeat_rows import Repeated, copy_layers, repeat_raw

# ----------------------------------------------------------------------------- entry points


@dataclass(frozen=True)
class RepeatSummary:
    traced_layers: int
    layers: int
    ops_before: int
    ops_after: int
    ops_per_layer: int
    parameter_bytes_before: int
    parameter_bytes_after: int

    def line(self, out: str) -> str:
        return (f"wrote {out}: {self.traced_layers} traced layers -> {self.layers} "
                f"({self.ops_per_layer} ops per layer); {self.ops_before} -> {self.ops_after} ops, "
                f"parameters {self.parameter_bytes_before / 2**20:.2f} -> {self.parameter_bytes_after / 2**20:.2f} MiB")


def _batch(path: Path, meta: dict, batch_size: int | None) -> int:
    if batch_size is not None:
        return batch_size
    # The same checks as `triosim run`: a whole number >= 1 (not NaN, infinity, text or null).
    return trace_batch_size(path)[0]


def repeat_trace_dir(src: str | os.PathLike, dst: str | os.PathLike, layers: int,
                     batch_size: int | None = None) -> RepeatSummary:
    """Write ``src`` with its repeated layer repeated ``layers`` times into directory ``dst``."""
    src_p, dst_p = Path(src), Path(dst)
    check_layer_count(layers, "--layers")
    if dst_p.exists() and src_p.resolve() == dst_p.resolve():
        raise ConfigError(f"--out {dst}: refusing to overwrite the input trace")
    if dst_p.resolve() in src_p.resolve().parents:
        raise ConfigError(f"--out {dst}: holds the input trace {src}; refusing to replace it")
    # The trace is checked (every error named by file and line) before its rows are copied.
    trace = load_trace(src_p, batch_size=_batch(src_p, {}, batch_size))
    raw = read_raw(src_p)
    out, layout = repeat_raw(raw, trace, layers)
    write_raw_dir(dst_p, out, flag="--out")
    new = load_trace(dst_p, batch_size=trace.batch_size)
    return RepeatSummary(layout.count, layers, len(trace.ops), len(new.ops), len(layout.ops(0)),
                         trace.parameter_bytes, new.parameter_bytes)


def load_repeated(path: str | os.PathLike, layers: int, batch_size: int = 128,
                  time_column: str = "nooverlap", in_memory: bool = True) -> Trace:
    """Load the trace in ``path`` with its repeated layer repeated ``layers`` times (``--num-layers``).

    The result is the trace that ``triosim trace repeat`` writes, read back; ``in_memory`` builds
    it from the traced trace's parsed ops and tensors instead of writing and re-reading the rows
    (the same trace, several times faster; it falls back to the round trip for rows whose text
    only the CSV reader is sure to read the same, see :func:`_repeated_trace`)."""
    check_layer_count(layers, "--num-layers")
    raw = read_raw(path)
    trace = load_trace(path, batch_size=batch_size, time_column=time_column)
    rep = copy_layers(raw, trace, layers)
    if in_memory:
        with collector_paused():
            new = _repeated_trace(rep, raw, trace, batch_size, time_column)
        if new is not None:
            return replace(new, path=str(path))
    with tempfile.TemporaryDirectory(prefix="triosim-layers-") as tmp:
        write_raw(tmp, rep.raw)
        new = load_trace(tmp, batch_size=batch_size, time_column=time_column)
    return replace(new, path=str(path))


def _plain_text(raw: RawTrace) -> bool:
    """No cell holds a quote or a line break: the CSV writer then writes each cell as it is and
    the reader gives it back stripped, one row per line."""
    return not any(('"' in x or "\n" in x or "\r" in x) for rows in (raw.op_rows, raw.tensor_rows)
                   for row in rows for x in row)


def _repeated_trace(rep: Repeated, raw: RawTrace, trace: Trace, batch_size: int, time_column: str) -> Trace | None:
    """What :func:`~triosim.trace.load.load_trace` reads from ``rep.raw`` once written, made from
    ``trace`` (the traced trace ``rep`` repeats): ops outside the layers and tensors kept as
    they are keep their parsed objects, and each copy of a tensor is its template's under a new
    ID. ``None`` when reading the rows back may give something else (a cell with a quote or a
    line break; a new tensor ID equal to one the trace has, which the reader would merge)."""
    out = rep.raw
    if not _plain_text(raw) or not trace.tensors.keys().isdisjoint(rep.template):
        return None
    tcol, ccol = out.tensor_header.index("TensorID"), out.tensor_header.index("TensorType")
    scol = out.tensor_header.index("TensorStorgeid")
    tensors: dict[str, Tensor] = {}
    categories: dict[str, str] = {}  # TensorType cell -> category, as the reader normalises it
    total = 0
    for x, row in enumerate(out.tensor_rows):
        if x < rep.kept:
            tid = row[tcol].strip().strip("'\"")
            if tid in tensors:
                continue
            t = trace.tensors[tid]  # all its rows are kept, in order: the reader merges them the same way
        else:
            tid = row[tcol]
            base = trace.tensors[rep.template[tid][0]]  # its row is a copy of the template's first row
            st, cat = row[scol].strip(), row[ccol]
            category = categories.get(cat)
            if category is None:
                category = categories[cat] = normalize_category(cat.strip())
            t = Tensor(tid, base.bytes, base.numel, base.each_byte, category, st if st not in ("", "0") else "",
                       base.shape)
        total += t.bytes
        if total >= MAX_BYTES:  # as the reader: L copies of a layer can exceed what one trace may hold
            raise TraceError("tensor.csv", f"the tensors add up to more than {MAX_BYTES:,} bytes",
                             row=x + 2, field="TensorNumElement")
        tensors[tid] = t
    cid = out.col("OperatorID")
    ct, cn = out.col("Operator_cudatime"), out.col("Operator_cudatimenooverlap")
    ops: list[Op] = []
    for k, ((_, i), lists, row) in enumerate(zip(rep.op_source, rep.op_lists, out.op_rows)):
        line = k + 2  # the header is line 1, and no cell spans lines
        src = trace.ops[i]
        op_id = int(row[cid])
        if lists is None:  # the traced row, renumbered
            ops.append(Op(k, op_id, src.name, src.inputs, src.outputs, src.duration_s, src.span_s, src.stage,
                          src.tpflag, line))
            continue
        # Written lists read back as they are: IDs hold no space, ';' or outer quote.
        span = cell_time_us(row[ct].strip(), "trace.csv", line, "Operator_cudatime")
        busy = cell_time_us(row[cn].strip(), "trace.csv", line, "Operator_cudatimenooverlap")
        ops.append(Op(k, op_id, src.name, lists[0], lists[1], (busy if time_column == "nooverlap" else span) / 1e6,
                      span / 1e6, src.stage, src.tpflag, line))
    # meta.json as the reader gives it back: keys sorted, the batch a whole number.
    info = json.loads(json.dumps(out.meta, sort_keys=True))
    if info.get("batch_size") is not None:
        info["batch_size"] = json_int(info["batch_size"], "meta.json", "batch_size")
    return derive(Trace(path=trace.path, batch_size=batch_size, ops=ops, tensors=tensors, info=info))


__all__ = ["LayerLayout", "RawTrace", "RepeatSummary", "find_layers", "load_repeated", "read_raw",
           "repeat_raw", "repeat_trace_dir", "write_raw"]
