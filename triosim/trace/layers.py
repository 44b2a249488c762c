"""Finding the repeated layer of a trace: the longest run of one unit of forward ops repeated back
to back (containing a linear layer), and each layer's backward and optimizer ops (see
:mod:`triosim.trace.repeat` for the rule)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import TraceError
from .dataflow import Trace

_LINEAR_NAMES = frozenset({"linear", "addmm", "mm"})


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



def _short(name: str) -> str:
    return name.rsplit("::", 1)[-1].strip().lower()


def _repeat_runs(names: list[str]) -> list[tuple[int, int, int, int]]:
    """Every (period P, count n, run start, run length) of a unit repeated back to back: names
    ``[start, start + length)`` each equal the name P later. Best coverage n·P first (more,
    shorter units on ties). Per period, the runs of equal pairs with numpy (a large model's
    forward pass has 10^4 ops: the pairwise loop, :func:`_repeat_runs_by_loop`, took a second)."""
    size = len(names)
    code: dict[str, int] = {}
    codes = np.fromiter((code.setdefault(x, len(code)) for x in names), dtype=np.int64, count=size)
    found = []
    for p in range(1, size // 2 + 1):
        eq = codes[:size - p] == codes[p:]
        edges = np.diff(np.concatenate(([0], eq.view(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        if not len(starts):
            continue
        lengths = ends - starts
        k = int(np.argmax(lengths))  # the first of the longest runs, as the loop keeps it
        length = int(lengths[k])
        if length >= p:
            found.append((p, length // p + 1, int(starts[k]), length))
    found.sort(key=lambda f: (-f[0] * f[1], -f[1]))
    return found


def _repeat_runs_by_loop(names: list[str]) -> list[tuple[int, int, int, int]]:
    """:func:`_repeat_runs` one pair at a time (what the numpy path must equal)."""
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


def forward_layers(trace: Trace) -> tuple[tuple[int, ...], ...]:
    """The forward ops of each repeated layer, in order (a TraceError when none repeats). Unlike
    :func:`find_layers` it reads only the forward ops, so it also holds for a trace whose
    backward pass was rearranged (activation recomputation inserts re-runs there)."""
    fwd, p, n, s = _forward_layers(trace)
    return tuple(tuple(fwd[s + k * p: s + (k + 1) * p]) for k in range(n))


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


__all__ = ["LayerLayout", "find_layers", "forward_layers"]
