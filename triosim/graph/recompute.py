"""Activation recomputation as a rewrite of the trace: the forward ops a backward pass re-runs
become new op rows right before the backward ops that need them.

What it models (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", §4 and §5):

- **full**: before each transformer layer's backward, every forward op of that layer runs again
  (a *re-run*), and the layer's backward reads the re-made activations. The forward pass then
  keeps only each layer's input (what the re-run reads from outside the layer) until backward;
  everything else the layer writes is freed after its last forward use.
- **selective**: only the attention core is re-run — the ops between the attention block's
  column linears (Q, K, V) and its row linear (QKᵀ, softmax, dropout, ·V, or one fused
  scaled-dot-product-attention op). The column outputs stay stored; the scores, whose size grows
  with s², do not.

A re-run copies its forward op's row: same name behind an ``rc<k>::`` marker (k: the layer),
the same time, the same tensor shapes; each activation it writes is a new buffer
``rc<k>:<buffer>`` of the same size. Re-runs take the backward phase, so a pipeline runs them in
the backward block of their micro-batch on their layer's stage (each re-run's forward partner
is the op it repeats). A re-run follows its op's tensor-parallel plan (time scale, shards and
the collectives after it: the all-reduces, or all-gathers and reduce-scatters with sequence
parallelism), as Megatron's recomputed forward communicates as the first one did.

Layer boundaries are the repeated transformer layer of the trace
(:func:`triosim.trace.layers.find_layers`: the rotation cut from the rest by the fewest
activations, i.e. the residual stream) and, for ``selective``, the attention blocks of the
Megatron detection (:func:`triosim.graph.tensor.megatron.find_blocks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..errors import ConfigError, TraceError
from ..trace import Trace
from ..trace.layers import find_layers
from .tensor.megatron import find_blocks
from .tensor.per_op import TpCollective

MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class Recomputed:
    """A trace with its re-runs inserted, and how its ops map to the original's.

    ``origin[i]``: the original op new op ``i`` is (a re-run: the forward op it repeats);
    ``rerun[i]``: the layer a re-run belongs to, None for an original op; ``renamed[k]``: layer
    k's original buffer -> its re-made copy; ``layers``: per layer the original forward ops."""

    trace: Trace
    mode: str
    origin: tuple[int, ...]
    rerun: tuple[int | None, ...]
    renamed: tuple[dict[str, str], ...]
    layers: tuple[tuple[int, ...], ...]
    reads_from: tuple[int | None, ...] = ()  # per new op: the unit whose copies it reads (None: none)

    @property
    def rerun_ops(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.rerun) if k is not None)

    @property
    def new_index(self) -> dict[int, int]:
        """Original op -> its index in the rewritten trace (originals only)."""
        return {o: i for i, (o, k) in enumerate(zip(self.origin, self.rerun)) if k is None}

    def rerun_seconds(self) -> float:
        """Traced seconds of all re-runs (one iteration at the trace's batch)."""
        return sum(self.trace.ops[i].duration_s for i in self.rerun_ops)

    def summary(self) -> dict:
        """JSON-ready facts: the mode, how many layers and ops are re-run, their traced time."""
        return {"mode": self.mode, "layers": len(self.layers), "rerun_ops": len(self.rerun_ops),
                "rerun_traced_s": round(self.rerun_seconds(), 9)}


def _units(trace: Trace, mode: str) -> list[tuple[tuple[int, ...], int, frozenset[int]]]:
    """(forward ops to re-run, the backward op to put them before, backward ops that keep reading
    the stored originals) per layer, in forward order."""
    try:
        layout = find_layers(trace)
    except TraceError as e:
        raise ConfigError(f"--recompute {mode} needs a transformer trace with repeated layers ({e.message})") from None
    units = []
    if mode == "full":
        for fwd, bwd in zip(layout.forward, layout.backward):
            if bwd:
                units.append((fwd, bwd[0], frozenset()))
        return units
    blocks = [b for b in find_blocks(trace) if b.kind == "attention"]
    if not blocks:
        raise ConfigError("--recompute selective needs attention blocks (none found in this trace)")
    for b in blocks:
        # The row linear saved its input (the core's output) for its weight gradient, as
        # Megatron's does: its backward reads the stored copy. The core's own backward reads
        # what the re-run makes: re-run the core right before it.
        core = set(b.middle)
        made = {k for j in core for k in trace.writes[j]}
        stored = frozenset(i for i in b.backward if trace.forward_partner[i] == b.row)
        readers = [i for i in b.backward if i not in stored and made.intersection(trace.reads[i])]
        if core and readers:
            units.append((tuple(sorted(core)), readers[0], stored))
    return units


def _activation(trace: Trace, k: str) -> bool:
    return k not in trace.batch_invariant


def recompute(trace: Trace, mode: str) -> Recomputed | None:
    """``trace`` with the re-runs of ``mode`` inserted (None for ``none``). A ConfigError when
    the trace has no layers to recompute."""
    if mode not in MODES:
        raise ConfigError(f"--recompute must be none, selective or full, got {mode!r}")
    if mode == "none":
        return None
    units = _units(trace, mode)
    before: dict[int, int] = {at: u for u, (_, at, _) in enumerate(units)}
    renamed: list[dict[str, str]] = []
    for u, (fwd, _, _) in enumerate(units):
        names: dict[str, str] = {}
        for j in fwd:
            for k in trace.writes[j]:
                if _activation(trace, k):
                    names.setdefault(k, f"rc{u}:{k}")
        renamed.append(names)
    # the backward ops each unit's copies replace the originals for: the unit's backward run
    owner: dict[int, int] = {}
    for u, (fwd, at, stored) in enumerate(units):
        names = renamed[u]
        end = units[u - 1][1] if u and units[u - 1][1] > at else len(trace.ops)
        for i in range(at, end):
            if trace.ops[i].stage != "backward" or i in owner or i in stored:
                continue
            if names.keys() & set(trace.reads[i]):
                owner[i] = u
    tensors = dict(trace.tensors.items())
    for names in renamed:
        for k, new in names.items():
            tensors[new] = tensors[k]._replace(id=new)
    next_id = max((op.op_id for op in trace.ops), default=0) + 1
    ops, reads, writes, origin, rerun, reads_from = [], [], [], [], [], []
    partner: list[int | None] = []
    old_partner = trace.forward_partner
    for i, op in enumerate(trace.ops):
        u = before.get(i)
        if u is not None:
            fwd = units[u][0]
            names = renamed[u]
            for j in fwd:
                src = trace.ops[j]
                # a re-run reads the copies made by earlier re-runs, the originals from outside
                r = tuple(names[k] if k in names and trace.producer.get(k, -1) < j else k for k in trace.reads[j])
                w = tuple(names.get(k, k) for k in trace.writes[j])
                ops.append(src._replace(index=len(ops), op_id=next_id, name=f"rc{u}::{src.name}", inputs=r,
                                        outputs=w))
                next_id += 1
                reads.append(r)
                writes.append(w)
                origin.append(j)
                rerun.append(u)
                reads_from.append(u)
                partner.append(j)  # placed with the op it repeats (its stage)
        names = renamed[owner[i]] if i in owner else {}
        r = tuple(names.get(k, k) for k in trace.reads[i]) if names else trace.reads[i]
        ops.append(op._replace(index=len(ops)))
        reads.append(r)
        writes.append(trace.writes[i])
        origin.append(i)
        rerun.append(None)
        reads_from.append(owner.get(i))
        partner.append(old_partner[i])
    new_index = {o: n for n, (o, k) in enumerate(zip(origin, rerun)) if k is None}
    partner = [new_index[p] if p is not None else None for p in partner]
    producer = {k: new_index[j] for k, j in trace.producer.items()}
    for n, (w, k) in enumerate(zip(writes, rerun)):
        if k is not None:
            for b in w:
                producer.setdefault(b, n)
    model = trace.op_time
    if model is not None:
        pick = lambda xs: tuple(xs[o] for o in origin)  # noqa: E731
        model = replace(model, measured=pick(model.measured), fixed=pick(model.fixed),
                        per_sample=pick(model.per_sample), floor=pick(model.floor))
    new = replace(trace, ops=ops, tensors=tensors, reads=reads, writes=writes, producer=producer, op_time=model,
                  _columns=None, _op_codes=None)
    new._partner = tuple(partner)
    return Recomputed(trace=new, mode=mode, origin=tuple(origin), rerun=tuple(rerun), renamed=tuple(renamed),
                      layers=tuple(u[0] for u in units), reads_from=tuple(reads_from))


def carry_plan(plan, rec: Recomputed):
    """``plan`` (a tensor-parallel plan of the original trace) for the rewritten trace: every op
    at its original's time scale; a re-run followed by the collective its original is followed
    by, carrying the re-made buffers; a backward op's collective carrying the copies it reads;
    the copies sharded as their originals."""
    new_index = rec.new_index
    at: dict[int, list] = {}
    for c in plan.collectives:
        at.setdefault(c.op, []).append(c)
    colls = []
    for n, (o, u) in enumerate(zip(rec.origin, rec.rerun)):
        names = rec.renamed[u] if u is not None else (rec.renamed[rec.reads_from[n]]
                                                      if rec.reads_from[n] is not None else {})
        if u is None and new_index[o] != n:
            continue
        for c in at.get(o, ()):
            colls.append(TpCollective(n, c.kind, tuple(names.get(k, k) for k in c.buffers), c.nbytes, c.calls))
    shards = dict(plan.shard_divisor)
    for names in rec.renamed:
        for k, copy in names.items():
            if k in shards:
                shards[copy] = shards[k]
    return replace(plan, time_scale=tuple(plan.time_scale[o] for o in rec.origin), collectives=tuple(colls),
                   shard_divisor=shards)


def activations_into_backward_bytes(trace: Trace, layers: Sequence[Sequence[int]],
                                    shard_divisor: dict[str, int] | None = None) -> list[int]:
    """Per layer: bytes of the activations its forward ops write (at the trace's batch) that an
    op of the backward phase reads — what the forward pass keeps for backward. ``layers``: each
    layer's forward ops in ``trace``; ``shard_divisor``: buffer -> T for a tensor-parallel shard."""
    div = shard_divisor or {}
    first_back = next((i for i, op in enumerate(trace.ops) if op.stage != "forward"), len(trace.ops))
    out = []
    for fwd in layers:
        kept = set()
        for j in fwd:
            for k in trace.writes[j]:
                if _activation(trace, k) and any(c >= first_back for c in trace.consumers.get(k, ())):
                    kept.add(k)
        out.append(sum(-(-trace.tensors[k].bytes // div.get(k, 1)) for k in kept))
    return out




def activation_facts(original: Trace, rec: Recomputed | None, plan, fraction: float) -> dict:
    """JSON-ready: the recomputation done (mode, re-run ops, their traced time) and, per layer,
    the activation bytes one micro-batch (``fraction`` of the batch) keeps into backward on one
    tensor-parallel rank; ``layers`` None when the trace has no repeated layer."""
    trace = rec.trace if rec is not None else original
    facts = rec.summary() if rec is not None else {"mode": "none", "layers": 0, "rerun_ops": 0, "rerun_traced_s": 0.0}
    try:
        layout = find_layers(original)
    except TraceError:
        return {**facts, "activations_into_backward_bytes": None}
    index = rec.new_index if rec is not None else {i: i for i in range(len(original.ops))}
    per_layer = activations_into_backward_bytes(trace, [[index[j] for j in f] for f in layout.forward],
                                                plan.shard_divisor)
    return {**facts, "activations_into_backward_bytes": [int(round(b * fraction)) for b in per_layer]}


__all__ = ["MODES", "Recomputed", "activation_facts", "activations_into_backward_bytes", "carry_plan", "recompute"]
