"""Activation recomputation as a rewrite of the trace: the forward ops a backward pass re-runs
become new op rows right before the backward ops that need them.

What it models (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4 and section 5):

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ..compute.op_time import reindex_op_time
from ..errors import TraceError
from ..trace import Trace
from ..trace.layers import find_layers
from .pipeline.schedules import FORWARD
from .pipeline.stages import with_same_cuts
from .recompute_units import GRANULARITIES, RecomputeSpec, as_spec, find_units

MODES = GRANULARITIES


@dataclass(frozen=True)
class Recomputed:
    """A trace with its re-runs inserted, and how its ops map to the original's.

    ``origin[i]``: the original op new op ``i`` is (a re-run: the forward op it repeats);
    ``rerun[i]``: the unit a re-run belongs to, None for an original op; ``renamed[u]``: unit
    u's original buffer -> its re-made copy; ``layers``: per unit the original forward ops it
    re-runs (a layer, its attention core, or a layer's part on one pipeline stage)."""

    trace: Trace
    mode: str
    origin: tuple[int, ...]
    rerun: tuple[int | None, ...]
    renamed: tuple[dict[str, str], ...]
    layers: tuple[tuple[int, ...], ...]
    made_by: dict[str, int] = field(default_factory=dict)  # re-made buffer -> its unit
    inserted: tuple[int, ...] = ()  # per unit: the new index of its first re-run
    spec: RecomputeSpec | None = None
    units: tuple = ()  # what find_units gave (forward ops, re-run before, readers of originals)

    def copy_at(self, k: str, n: int) -> str:
        """What buffer ``k`` is at new op ``n``: its copy once its unit has been re-run."""
        u = self.made_by.get(k)
        return self.renamed[u][k] if u is not None and self.inserted[u] < n else k

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
        detail = self.spec is not None and self.spec.label != self.mode  # a method, layer count or module set
        return {"mode": self.mode, **({**self.spec.facts(), "label": self.spec.label} if detail else {}),
                "units": len(self.layers), "rerun_ops": len(self.rerun_ops),
                "rerun_traced_s": round(self.rerun_seconds(), 9)}


def _activation(trace: Trace, k: str) -> bool:
    return k not in trace.batch_invariant


def recompute(trace: Trace, mode: str | RecomputeSpec, cuts: frozenset[int] = frozenset(),
              units: list | None = None) -> Recomputed | None:
    """``trace`` with the re-runs of ``mode`` (a granularity or a whole setting) inserted (None
    for ``none``); ``cuts``: forward ops that begin a pipeline stage (a unit they split is re-run
    stage by stage; block and uniform groups count layers per stage). ``units``: what
    :func:`find_units` gives for them, when the caller has it from a trace with the same ops (the
    planner's copies of one trace scaled to other batches). A ConfigError when the trace has no
    layers to recompute."""
    spec = as_spec(mode)
    if spec.granularity == "none":
        return None
    units = find_units(trace, spec, cuts) if units is None else units
    before: dict[int, list[int]] = {}
    for u, (_, at, _) in enumerate(units):
        before.setdefault(at, []).append(u)
    renamed: list[dict[str, str]] = []
    made_by: dict[str, int] = {}  # re-made buffer -> its unit
    for u, (fwd, _, _) in enumerate(units):
        names: dict[str, str] = {}
        for j in fwd:
            for k in trace.writes[j]:
                if _activation(trace, k):
                    names.setdefault(k, f"rc{u}:{k}")
                    made_by[k] = u
        renamed.append(names)
    tensors = dict(trace.tensors.items())
    for names in renamed:
        for k, new in names.items():
            tensors[new] = tensors[k]._replace(id=new)
    next_id = max((op.op_id for op in trace.ops), default=0) + 1
    ops, reads, writes, origin, rerun = [], [], [], [], []
    partner: list[int | None] = []
    inserted: dict[int, int] = {}  # unit -> new index of its first re-run
    current: dict[str, str] = {}  # buffer -> the copy made by a unit re-run so far
    old_partner = trace.forward_partner
    for i, op in enumerate(trace.ops):
        for u in before.get(i, ()):
            fwd = units[u][0]
            names = renamed[u]
            inserted[u] = len(ops)
            for j in fwd:
                src = trace.ops[j]
                # a re-run reads the copies made by earlier re-runs of its unit or of a unit re-run
                # before it (a norm an MLP re-run reads), the rest as stored
                r = tuple(names[k] if k in names and trace.producer.get(k, -1) < j else current.get(k, k)
                          for k in trace.reads[j])
                w = tuple(names.get(k, k) for k in trace.writes[j])
                ops.append(src._replace(index=len(ops), op_id=next_id, name=f"rc{u}::{src.name}", inputs=r,
                                        outputs=w))
                next_id += 1
                reads.append(r)
                writes.append(w)
                origin.append(j)
                rerun.append(u)
                partner.append(j)  # placed with the op it repeats (its stage)
            current.update(names)
        r = trace.reads[i]
        if op.stage == "backward" and inserted:
            # a backward op reads the copy of a buffer once its unit has been re-run (unless it
            # is one that reads the stored original)
            r = tuple(renamed[made_by[k]][k] if k in made_by and made_by[k] in inserted
                      and i not in units[made_by[k]][2] else k for k in r)
        ops.append(op._replace(index=len(ops)))
        reads.append(r)
        writes.append(trace.writes[i])
        origin.append(i)
        rerun.append(None)
        partner.append(old_partner[i])
    new_index = {o: n for n, (o, k) in enumerate(zip(origin, rerun)) if k is None}
    partner = [new_index[p] if p is not None else None for p in partner]
    producer = {k: new_index[j] for k, j in trace.producer.items()}
    for n, (w, k) in enumerate(zip(writes, rerun)):
        if k is not None:
            for b in w:
                producer.setdefault(b, n)
    model = reindex_op_time(trace.op_time, tuple(origin))
    new = replace(trace, ops=ops, tensors=tensors, reads=reads, writes=writes, producer=producer, op_time=model,
                  _columns=None, _op_codes=None)
    new._partner = tuple(partner)
    return Recomputed(trace=new, mode=spec.granularity, origin=tuple(origin), rerun=tuple(rerun), renamed=tuple(renamed),
                      layers=tuple(u[0] for u in units), made_by=made_by,
                      inserted=tuple(inserted[u] for u in range(len(units))), spec=spec, units=tuple(units))


def carry_plan(plan, rec: Recomputed):
    """``plan`` (a tensor-parallel plan of the original trace) for the rewritten trace: every op
    at its original's time scale; a re-run followed by the collective its original is followed
    by, carrying the re-made buffers; a backward op's collective carrying the copies made by
    then; the copies sharded as their originals."""
    new_index = rec.new_index
    at: dict[int, list] = {}
    for c in plan.collectives:
        at.setdefault(c.op, []).append(c)
    colls = []
    for n, (o, u) in enumerate(zip(rec.origin, rec.rerun)):
        if u is None and new_index[o] != n:
            continue
        for c in at.get(o, ()):
            if u is not None:
                names = rec.renamed[u]
                buffers = tuple(names.get(k, k) for k in c.buffers)
            else:
                buffers = tuple(rec.copy_at(k, n) for k in c.buffers)
            colls.append(replace(c, op=n, buffers=buffers))
    shards = dict(plan.shard_divisor)
    for names in rec.renamed:
        for k, copy in names.items():
            if k in shards:
                shards[copy] = shards[k]
    share = getattr(plan, "share", ())
    return replace(plan, time_scale=tuple(plan.time_scale[o] for o in rec.origin), collectives=tuple(colls),
                   shard_divisor=shards, **({"share": tuple(share[o] for o in rec.origin)} if share else {}))


def fit_to_stages(original: Trace, rec: Recomputed, plan_for: Callable[[Trace], tuple]) -> tuple[Recomputed, tuple]:
    """The re-runs and the pipeline plan (``plan_for(trace)`` -> (plan, candidates)) chosen on
    them, with every unit on one stage: where a chosen cut splits a unit, the re-runs are split
    at the chosen cuts and the plan's cuts kept (the forward phase is the same)."""
    chosen = plan_for(rec.trace)
    plan = chosen[0]
    partial = rec.spec is not None and rec.spec.partial  # which layers re-run depends on the cuts
    if not partial and not straddling(rec, plan.stage):
        return rec, chosen
    forward = [i for i, ph in enumerate(plan.phase) if ph == FORWARD]
    rec = recompute(original, rec.spec or rec.mode, frozenset(forward[s] for s in plan.starts[1:]))
    return rec, (with_same_cuts(rec.trace, plan), *chosen[1:])


def straddling(rec: Recomputed, stage: Sequence[int]) -> bool:
    """Whether some unit's re-runs would run on two stages (``stage``: per op of ``rec.trace``,
    taken from the op each re-run repeats)."""
    new_index = rec.new_index  # a property that builds the dict: once, not once per op (0.3 s on the 1T run)
    for part in rec.layers:
        if len({stage[new_index[j]] for j in part}) > 1:
            return True
    return False


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
    facts = rec.summary() if rec is not None else {"mode": "none", "units": 0, "rerun_ops": 0, "rerun_traced_s": 0.0}
    try:
        layout = find_layers(original)
    except TraceError:
        return {**facts, "activations_into_backward_bytes": None}
    index = rec.new_index if rec is not None else {i: i for i in range(len(original.ops))}
    per_layer = activations_into_backward_bytes(trace, [[index[j] for j in f] for f in layout.forward],
                                                plan.shard_divisor)
    return {**facts, "activations_into_backward_bytes": [int(round(b * fraction)) for b in per_layer]}


__all__ = ["MODES", "Recomputed", "activation_facts", "activations_into_backward_bytes",
           "carry_plan", "fit_to_stages", "recompute", "straddling"]
