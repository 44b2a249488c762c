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
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..checks import MAX_BYTES, cell_time_us, json_int
from ..errors import ConfigError, TraceError
from ..output import atomic_write_text
from .load import (
    Op,
    Tensor,
    Trace,
    collector_paused,
    derive,
    load_trace,
    normalize_category,
    parse_id_list,
    trace_batch_size,
)

_LINEAR_NAMES = frozenset({"linear", "addmm", "mm"})
Key = tuple  # a tensor's position inside a layer (same in every layer)
IdLists = tuple[tuple[str, ...], tuple[str, ...]]  # an op's input and output tensor IDs


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


@dataclass(frozen=True)
class LayerLayout:
    """Where the repeated layers sit in a trace (op indices)."""

    forward: tuple[tuple[int, ...], ...]  # per layer, its forward ops
    backward: tuple[tuple[int, ...], ...]  # per layer, its backward ops
    optimizer: tuple[tuple[int, ...], ...]  # per layer, its per-parameter optimizer ops
    foreach: tuple[int, ...]  # optimizer ops whose tensor lists hold every parameter
    order: tuple[str, ...]  # the optimizer's parameter order (foreach lists)
    slots: tuple[tuple[int, ...], ...]  # per layer, its positions in ``order``

    @property
    def count(self) -> int:
        return len(self.forward)

    def ops(self, k: int) -> tuple[int, ...]:
        return (*self.forward[k], *self.backward[k], *self.optimizer[k])


# ----------------------------------------------------------------------------- reading/writing


def read_raw(path: str | os.PathLike) -> RawTrace:
    root = Path(path)

    def rows(name: str) -> tuple[list[str], list[list[str]]]:
        try:
            with open(root / name, newline="", encoding="utf-8") as fh:
                data = [r for r in csv.reader(fh) if r and any(x.strip() for x in r)]
        except OSError as exc:
            raise TraceError(str(root / name), f"cannot read file ({exc.strerror})") from None
        if not data:
            raise TraceError(name, "file is empty (no header row)")
        return [h.strip().lstrip("\ufeff") for h in data[0]], data[1:]

    oh, orows = rows("trace.csv")
    th, trows = rows("tensor.csv")
    meta = {}
    if (root / "meta.json").is_file():
        try:
            meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
        except ValueError as exc:
            raise TraceError(str(root / "meta.json"), f"unreadable JSON ({exc})") from None
    return RawTrace(oh, orows, th, trows, meta if isinstance(meta, dict) else {})


def _csv_text(header: list[str], rows: list[list[str]]) -> str:
    buf = io.StringIO()
    wr = csv.writer(buf, lineterminator="\n")
    wr.writerow(header)
    wr.writerows(rows)
    return buf.getvalue()


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


# ----------------------------------------------------------------------------- finding layers


def _short(name: str) -> str:
    return name.rsplit("::", 1)[-1].strip().lower()


def _repeat_runs(names: list[str]) -> list[tuple[int, int, int, int]]:
    """Every (period P, count n, run start, run length) of a unit repeated back to back: names
    ``[start, start + length)`` each equal the name P later. Best coverage n·P first (more,
    shorter units on ties)."""
    found = []
    size = len(names)
    for p in range(1, size // 2 + 1):
        run_start, best = 0, (0, 0)
        for i in range(size - p + 1):
            if i < size - p and names[i] == names[i + p]:
                continue
            length = i - run_start  # names[run_start : i] each equal to the one P later
            if length >= p and length > best[1]:
                best = (run_start, length)
            run_start = i + 1
        if best[1]:
            found.append((p, best[1] // p + 1, best[0], best[1]))
    found.sort(key=lambda f: (-f[0] * f[1], -f[1]))
    return found


def _cut(trace: Trace, ops: range) -> int:
    """How many activations the ops of ``ops`` read that were written before them."""
    params = set(trace.parameters)
    seen = set()
    for i in ops:
        for k in trace.reads[i]:
            j = trace.producer.get(k)
            if k not in params and j is not None and j < ops.start:
                seen.add(k)
    return len(seen)


def _forward_layers(trace: Trace) -> tuple[list[int], int, int, int]:
    """(forward op indices, period, count, start position in that list) of the repeated layer."""
    fwd = [op.index for op in trace.ops if op.stage == "forward"]
    names = [trace.ops[i].name for i in fwd]
    params = set(trace.parameters)
    for p, n, a, length in _repeat_runs(names):
        unit = fwd[a:a + p]
        if not any(_short(trace.ops[i].name) in _LINEAR_NAMES and
                   any(k in params and len(trace.tensors[k].shape or ()) == 2 for k in trace.reads[i])
                   for i in unit):
            continue
        # Any rotation of the unit repeats as often; take the one cut from the rest by the
        # fewest activations (a transformer layer reads only the residual stream).
        starts = range(a, a + length - (n - 1) * p + 1)
        best = min(starts, key=lambda s: (_cut(trace, range(fwd[s], fwd[s + p - 1] + 1)), s))
        return fwd, p, n, best
    raise TraceError(trace.path, "no repeated transformer layer found (the forward ops repeat no unit "
                     "with a linear layer at least twice)")


def find_layers(trace: Trace) -> LayerLayout:
    """The repeated layers of ``trace`` (see the module docstring's rule)."""
    fwd, p, n, s = _forward_layers(trace)
    forward = [tuple(fwd[s + k * p: s + (k + 1) * p]) for k in range(n)]
    layer_of: dict[int, int] = {i: k for k, unit in enumerate(forward) for i in unit}
    bwd = [op.index for op in trace.ops if op.stage == "backward"]
    owner: dict[int, int | None] = {}
    for i in bwd:
        partner = trace.forward_partner[i]
        owner[i] = layer_of.get(partner) if partner is not None else -1
    for pos, i in enumerate(bwd):
        if owner[i] != -1:
            continue
        before = next((owner[j] for j in reversed(bwd[:pos]) if owner[j] != -1), None)
        after = next((owner[j] for j in bwd[pos + 1:] if owner[j] != -1), None)
        owner[i] = before if before is not None and before == after else None
    backward = []
    for k in range(n):
        ops = tuple(i for i in bwd if owner[i] == k)
        if ops and ops != tuple(range(ops[0], ops[-1] + 1)):
            raise TraceError(trace.path, f"the backward ops of layer {k + 1} are not contiguous")
        backward.append(ops)
    for k in range(n - 1):
        if backward[k + 1] and backward[k] and backward[k + 1][-1] + 1 != backward[k][0]:
            raise TraceError(trace.path, f"other ops run between the backward ops of layers {k + 2} and {k + 1}")
    layer_tensors = [{t for i in (*forward[k], *backward[k]) for t in (*trace.ops[i].inputs, *trace.ops[i].outputs)}
                     for k in range(n)]
    params = set(trace.parameters)
    opt = [op.index for op in trace.ops if op.stage == "optimizer"]
    by_count = sorted(opt, key=lambda i: -sum(1 for t in trace.ops[i].inputs if t in params))
    order: tuple[str, ...] = ()
    if by_count:
        order = tuple(dict.fromkeys(t for t in trace.ops[by_count[0]].inputs if t in params))
    foreach: list[int] = []
    optimizer: list[list[int]] = [[] for _ in range(n)]
    if len(order) >= 2 * n:
        foreach = [i for i in opt if max(len(trace.ops[i].inputs), len(trace.ops[i].outputs)) >= len(order)]
    rest = [i for i in opt if i not in foreach]
    for i in rest:
        ids = set(trace.ops[i].inputs) | set(trace.ops[i].outputs)
        ks = [k for k in range(n) if ids & layer_tensors[k]]
        if len(ks) > 1:
            raise TraceError(trace.path, f"optimizer op at row {trace.ops[i].line} updates several layers")
        if ks:
            optimizer[ks[0]].append(i)
    slots: list[tuple[int, ...]] = []
    if foreach:
        for k in range(n):
            slots.append(tuple(r for r, t in enumerate(order) if t in layer_tensors[k]))
        for k in range(n):
            if not slots[k] or slots[k] != tuple(range(slots[k][0], slots[k][-1] + 1)) or \
                    len(slots[k]) != len(slots[0]) or (k and slots[k][0] != slots[k - 1][-1] + 1):
                raise TraceError(trace.path, "the optimizer's parameter lists do not hold each layer's "
                                 "parameters as one block, layer after layer")
    else:
        slots = [() for _ in range(n)]
    return LayerLayout(tuple(forward), tuple(backward), tuple(tuple(o) for o in optimizer), tuple(foreach),
                       order, tuple(slots))


# ----------------------------------------------------------------------------- positions


def _layer_positions(raw: RawTrace, layout: LayerLayout, k: int) -> dict[Key, str]:
    """Every tensor reference of layer ``k``: position -> tensor ID."""
    cin, cout = raw.col("Operator_input"), raw.col("Operator_output")
    pos: dict[Key, str] = {}
    for off, i in enumerate(layout.ops(k)):
        for side, c in (("in", cin), ("out", cout)):
            for s, t in enumerate(parse_id_list(raw.op_rows[i][c])):
                pos[("op", off, side, s)] = t
    m = len(layout.order)
    for f in layout.foreach:
        for side, c in (("in", cin), ("out", cout)):
            items = parse_id_list(raw.op_rows[f][c])
            for chunk in range(len(items) // m):
                for q, r in enumerate(layout.slots[k]):
                    pos[("fe", f, side, chunk, q)] = items[chunk * m + r]
    return pos


class _Union:
    def __init__(self) -> None:
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _groups(pos: dict[Key, str]) -> dict[str, list[Key]]:
    out: dict[str, list[Key]] = {}
    for key, t in pos.items():
        out.setdefault(t, []).append(key)
    return out


def _mean_times(raw: RawTrace, unit: list[list[int]]) -> list[tuple[float, float]]:
    """Per op offset in a layer: its (span, busy) time in µs averaged over the traced layers."""
    ct, cn = raw.col("Operator_cudatime"), raw.col("Operator_cudatimenooverlap")
    n = len(unit)
    return [(sum(float(raw.op_rows[u[o]][ct]) for u in unit) / n, sum(float(raw.op_rows[u[o]][cn]) for u in unit) / n)
            for o in range(len(unit[0]))]


def _fmt_list(items: Sequence[str]) -> str:
    return "[" + "; ".join(items) + "]"


def _fmt_us(value: float) -> str:
    return repr(round(value, 6))


@dataclass
class _Repeated:
    """A repeated trace's rows and where each comes from (to build its ``Trace`` without
    writing and re-reading them)."""

    raw: RawTrace
    layout: LayerLayout
    op_source: list[tuple[int, int]]  # per op row: (copy, or -1 outside the layers; traced op index)
    op_lists: list[IdLists | None]  # per op row: its (inputs, outputs), None where the traced row's
    template: dict[str, tuple[str, int]]  # new tensor ID -> (traced tensor it copies, copy)
    kept: int  # the first ``kept`` tensor rows are the traced trace's own, unchanged but for Index


def repeat_raw(raw: RawTrace, trace: Trace, layers: int) -> tuple[RawTrace, LayerLayout]:
    """``raw`` (the rows ``trace`` was loaded from) with its repeated layer repeated ``layers`` times."""
    rep = _repeat(raw, trace, layers)
    return rep.raw, rep.layout


def _repeat(raw: RawTrace, trace: Trace, layers: int) -> _Repeated:
    if layers < 1:
        raise ConfigError(f"--layers must be a positive integer, got {layers}")
    layout = find_layers(trace)
    n = layout.count
    pos = [_layer_positions(raw, layout, k) for k in range(n)]
    keys = sorted(pos[0], key=repr)
    for k in range(1, n):
        if set(pos[k]) != set(pos[0]):
            raise TraceError(trace.path, f"layers 1 and {k + 1} differ in their ops' tensor lists")
    for k in range(n):
        for key in keys:
            if trace.tensors[pos[k][key]].bytes != trace.tensors[pos[0][key]].bytes:
                raise TraceError(trace.path, f"layers 1 and {k + 1} differ in a tensor's size "
                                 f"({pos[0][key]} vs {pos[k][key]})")
    shared = {key for key in keys if len({pos[k][key] for k in range(n)}) == 1}
    layer_sets = [set(p.values()) for p in pos]
    in_layers = set().union(*layer_sets)
    cin, cout = raw.col("Operator_input"), raw.col("Operator_output")
    layer_ops = {i for k in range(n) for i in layout.ops(k)}
    outside: set[str] = set()
    m = len(layout.order)
    for i, row in enumerate(raw.op_rows):
        if i in layer_ops:
            continue
        for c in (cin, cout):
            items = parse_id_list(row[c])
            if i in layout.foreach:
                layer_slots = {r for s in layout.slots for r in s}
                items = tuple(t for x, t in enumerate(items) if x >= (len(items) // m) * m or x % m not in layer_slots)
            outside.update(items)
    links: set[tuple[Key, Key]] = set()
    for k in range(n - 1):
        g0, g1 = _groups(pos[k]), _groups(pos[k + 1])
        pairs = set()
        for t in set(g0) & set(g1):
            if any(key in shared for key in g0[t]):
                continue
            pairs.add((min(g0[t], key=repr), min(g1[t], key=repr)))
        if k == 0:
            links = pairs
        elif pairs != links:
            raise TraceError(trace.path, f"layers {k + 1} and {k + 2} are linked differently from layers 1 and 2")
    for k in range(1, n - 1):
        leak = (layer_sets[k] & outside) - {pos[k][key] for key in shared}
        if leak:
            raise TraceError(trace.path, f"tensor {sorted(leak)[0]} of layer {k + 1} is used outside the layers")
    # Copies follow the first traced layer's pattern of which positions hold one tensor (the
    # layers may differ there: a tracer can list one op's outputs in another order).

    # Positions that are one tensor: inside a copy those the first traced layer gives one tensor,
    # across copies the links. The union-find runs over those groups, each named by its smallest
    # position: a class's root, its smallest (copy, position), is the same as it would be over
    # single positions, at a fraction of the unions.
    uf = _Union()
    lead = {key: min(g) for g in _groups(pos[0]).values() for key in g}
    for j in range(layers - 1):
        for a, b in links:
            uf.union((j, lead[a]), (j + 1, lead[b]))
    fixed: dict = {}

    def fix(node, tid: str) -> None:
        root = uf.find((node[0], lead[node[1]]))
        if fixed.setdefault(root, tid) != tid:
            raise TraceError(trace.path, f"cannot repeat to {layers} layers: tensors {fixed[root]} and {tid} "
                             "would have to be one")

    for j in range(layers):
        for key in shared:
            fix((j, key), pos[0][key])
    for key in keys:
        if pos[0][key] in outside and key not in shared:
            fix((0, key), pos[0][key])
        if pos[n - 1][key] in outside and key not in shared:
            fix((layers - 1, key), pos[n - 1][key])
    numeric = all(t.isdigit() for t in trace.tensors)
    next_id = [max((int(t) for t in trace.tensors), default=0) + 1 if numeric else 0]
    names: dict = {}
    template: dict[str, tuple[str, int]] = {}  # new tensor ID -> (traced tensor whose rows it copies, copy)

    # Groups numbered 0..G-1; copy j's group g is named once, in the order the rows first use it.
    leads = list(dict.fromkeys(lead.values()))
    group_ix = {ld: g for g, ld in enumerate(leads)}
    group_of = {key: group_ix[ld] for key, ld in lead.items()}
    size = len(leads)
    resolved: list[str | None] = [None] * (layers * size)  # copy j, group g -> its tensor ID

    def resolve(j: int, g: int) -> str:
        root = uf.find((j, leads[g]))
        if root in fixed:
            hit = fixed[root]
        else:
            if root not in names:
                if numeric:
                    names[root] = str(next_id[0])
                    next_id[0] += 1
                else:
                    names[root] = f"{pos[0][root[1]]}.L{root[0] + 1}"
                template[names[root]] = (pos[0][root[1]], root[0])
            hit = names[root]
        resolved[j * size + g] = hit
        return hit

    def copy_ids(j: int, groups: Sequence[int]) -> tuple[str, ...]:
        """Copy ``j``'s tensor IDs of ``groups`` (named on first use, left to right)."""
        base = j * size
        return tuple([resolved[base + g] or resolve(j, g) for g in groups])

    # Ops: mean time over the traced layers, tensor lists renamed per copy.
    ct, cn = raw.col("Operator_cudatime"), raw.col("Operator_cudatimenooverlap")
    cid = raw.col("OperatorID")
    cfwd = raw.op_header.index("fwd_op") if "fwd_op" in raw.op_header else None
    unit = [list(layout.ops(k)) for k in range(n)]
    row_of_id = {op_id: i for i, op_id in enumerate(row[cid].strip() for row in raw.op_rows)}
    mean = _mean_times(raw, unit)
    out_rows: list[tuple[tuple[int, int], list[str]]] = []  # (original op or layer op, copy) -> row
    new_id: dict[tuple[int, int], str] = {}  # (copy or -1, original op index) -> new OperatorID

    # Per op offset in a layer, the positions of its input and output lists.
    layer_groups = [tuple(tuple(group_of[("op", off, side, s)] for s in range(len(parse_id_list(raw.op_rows[i][c]))))
                          for side, c in (("in", cin), ("out", cout))) for off, i in enumerate(unit[0])]
    times = [(_fmt_us(span), _fmt_us(busy)) for span, busy in mean]

    def layer_row(j: int, off: int) -> tuple[list[str], IdLists]:
        row = list(raw.op_rows[unit[0][off]])
        groups_in, groups_out = layer_groups[off]
        ins = copy_ids(j, groups_in)
        outs = copy_ids(j, groups_out)
        row[cin], row[cout] = _fmt_list(ins), _fmt_list(outs)
        row[ct], row[cn] = times[off]
        return row, (ins, outs)

    nf, nb = len(layout.forward[0]), len(layout.backward[0])
    first_fwd = layout.forward[0][0]
    bwd_span = (layout.backward[-1][0], layout.backward[0][-1]) if nb else None
    plan: list[tuple[int, int, int]] = []  # (copy or -1, original op index, offset in layer)
    for i in range(len(raw.op_rows)):
        if i == first_fwd:
            plan += [(j, unit[0][o], o) for j in range(layers) for o in range(nf)]
        if bwd_span and i == bwd_span[0]:
            plan += [(j, unit[0][nf + o], nf + o) for j in reversed(range(layers)) for o in range(nb)]
        if i == (layout.optimizer[0][0] if layout.optimizer[0] else -1):
            no = len(layout.optimizer[0])
            plan += [(j, unit[0][nf + nb + o], nf + nb + o) for j in range(layers) for o in range(no)]
        if i in layer_ops:
            continue
        plan.append((-1, i, -1))
    for seq, (j, i, _) in enumerate(plan, start=1):
        new_id[(j, i)] = str(seq)
    id_lists: list[IdLists | None] = []  # per written op: its new tensor lists (None: the traced row's)
    for j, i, off in plan:
        row, lists = layer_row(j, off) if j >= 0 else (list(raw.op_rows[i]), None)
        row[cid] = new_id[(j, i)]
        if cfwd is not None and row[cfwd].strip() not in ("", "-1"):
            target = row_of_id.get(row[cfwd].strip())
            if j >= 0 and (j, target) in new_id:
                row[cfwd] = new_id[(j, target)]  # the forward op of the same copy
            elif target is not None and (-1, target) in new_id:
                row[cfwd] = new_id[(-1, target)]
        if i in layout.foreach:
            row, lists = _foreach_row(row, raw, i, layout, layers, group_of, copy_ids, trace)
        out_rows.append(((j, i), row))
        id_lists.append(lists)

    # Tensor rows: untouched for tensors outside the layers, copied from the template per new ID.
    tcol = raw.tensor_header.index("TensorID")
    scol = raw.tensor_header.index("TensorStorgeid")
    icol = raw.tensor_header.index("Index")
    rows_of: dict[str, list[list[str]]] = {}
    for row in raw.tensor_rows:
        rows_of.setdefault(row[tcol].strip().strip("'\""), []).append(row)
    kept = {t for t in fixed.values()} | (set(trace.tensors) - in_layers)
    tensor_rows = [list(r) for r in raw.tensor_rows if r[tcol].strip().strip("'\"") in kept]
    kept_rows = len(tensor_rows)
    kept_storage = {r[scol].strip() for r in tensor_rows}
    storage_of: dict[tuple[int, str], str] = {}
    for tid, (src, j) in template.items():
        for r in rows_of.get(src, [])[:1]:
            if r[scol].strip() == src:
                storage_of[(j, src)] = tid  # a tensor with its own storage: the copy's ID
    ccol = raw.tensor_header.index("TensorType")
    for tid, (src, j) in template.items():
        # One row per copy, with the category the loader settled on for the template.
        for r in rows_of.get(src, [])[:1]:
            row = list(r)
            row[tcol] = tid
            row[ccol] = trace.tensors[src].category or r[ccol]
            st = r[scol].strip()
            if st not in ("", "0") and st not in kept_storage:
                # A view shares its base's storage: keep that pairing inside each copy.
                row[scol] = storage_of.setdefault((j, st), f"{st}.{j + 1}")
            tensor_rows.append(row)
    for x, row in enumerate(tensor_rows):
        row[icol] = str(x)
    meta = dict(raw.meta)
    meta["ops"] = len(out_rows)
    meta["repeat"] = {"traced_layers": n, "layers": layers, "ops_per_layer": len(unit[0])}
    desc = meta.get("model_description")
    if isinstance(desc, str):
        meta["model_description"] = re.sub(rf"\b{n} layers\b", f"{layers} layers", desc)
    if "layers" in meta:
        meta["layers"] = layers
    out = RawTrace(raw.op_header, [r for _, r in out_rows], raw.tensor_header, tensor_rows, meta)
    return _Repeated(out, layout, [src for src, _ in out_rows], id_lists, template, kept_rows)


def _foreach_row(row: list[str], raw: RawTrace, i: int, layout: LayerLayout, layers: int, group_of: dict[Key, int],
                 copy_ids: Callable[[int, Sequence[int]], tuple[str, ...]], trace: Trace) -> tuple[list[str], IdLists]:
    """A ``_foreach`` optimizer op over the repeated layers' parameters; time scaled by bytes."""
    m = len(layout.order)
    lo, hi = layout.slots[0][0], layout.slots[-1][-1] + 1
    row = list(row)
    old_bytes = new_bytes = 0
    lists: list[tuple[str, ...]] = []
    for side, c, sc in (("in", raw.col("Operator_input"), raw.col("InputSize")),
                        ("out", raw.col("Operator_output"), raw.col("OutputSize"))):
        items = parse_id_list(raw.op_rows[i][c])
        sizes = parse_id_list(raw.op_rows[i][sc])
        if len(sizes) != len(items):
            sizes = tuple("0" for _ in items)
        new_items: list[str] = []
        new_sizes: list[str] = []
        chunks = len(items) // m
        for chunk in range(chunks):
            base = chunk * m
            new_items += items[base:base + lo]
            new_sizes += sizes[base:base + lo]
            groups = [group_of[("fe", i, side, chunk, q)] for q in range(len(layout.slots[0]))]
            slot_sizes = [sizes[base + r] for r in layout.slots[0]]
            for j in range(layers):
                new_items += copy_ids(j, groups)
                new_sizes += slot_sizes
            new_items += items[base + hi:base + m]
            new_sizes += sizes[base + hi:base + m]
        new_items += items[chunks * m:]
        new_sizes += sizes[chunks * m:]
        if side == "in":
            old_bytes = sum(trace.tensors[t].bytes for t in items)
            in_layers = sum(trace.tensors[t].bytes for x, t in enumerate(items) if x < chunks * m and lo <= x % m < hi)
            new_bytes = old_bytes - in_layers + layers * in_layers / layout.count
        row[c] = _fmt_list(new_items)
        row[sc] = _fmt_list(new_sizes)
        lists.append(tuple(new_items))
    if old_bytes > 0:
        scale = new_bytes / old_bytes
        for c in (raw.col("Operator_cudatime"), raw.col("Operator_cudatimenooverlap")):
            row[c] = _fmt_us(float(raw.op_rows[i][c]) * scale)
    return row, (lists[0], lists[1])


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
    if layers < 1:
        raise ConfigError(f"--layers must be a positive integer, got {layers}")
    if dst_p.exists() and src_p.resolve() == dst_p.resolve():
        raise ConfigError(f"--out {dst}: refusing to overwrite the input trace")
    raw = read_raw(src_p)
    trace = load_trace(src_p, batch_size=_batch(src_p, raw.meta, batch_size))
    out, layout = repeat_raw(raw, trace, layers)
    write_raw(dst_p, out, protect=[src_p / "trace.csv", src_p / "tensor.csv", src_p / "meta.json"], flag="--out")
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
    if layers < 1:
        raise ConfigError(f"--num-layers must be a positive integer, got {layers}")
    raw = read_raw(path)
    trace = load_trace(path, batch_size=batch_size, time_column=time_column)
    rep = _repeat(raw, trace, layers)
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


def _repeated_trace(rep: _Repeated, raw: RawTrace, trace: Trace, batch_size: int, time_column: str) -> Trace | None:
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
