"""Writing a trace's repeated layer L times: the rows of the L copies, with every tensor of a
layer renamed per copy and the copies linked (see :mod:`triosim.trace.repeat` for the rule)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ConfigError, TraceError
from .dataflow import Trace
from .layers import LayerLayout, find_layers
from .model import parse_id_list
from .raw import RawTrace

Key = tuple  # a tensor's position inside a layer (same in every layer)
IdLists = tuple[tuple[str, ...], tuple[str, ...]]  # an op's input and output tensor IDs


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
class Repeated:
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
    rep = copy_layers(raw, trace, layers)
    return rep.raw, rep.layout


def copy_layers(raw: RawTrace, trace: Trace, layers: int) -> Repeated:
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
    return Repeated(out, layout, [src for src, _ in out_rows], id_lists, template, kept_rows)


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


__all__ = ["repeat_raw"]
