"""Which forward ops a backward pass re-runs, as Megatron-Core chooses them: the *units* of
activation recomputation (the rewrite itself is :mod:`triosim.graph.recompute`).

A unit is a run of forward ops re-run together right before one backward op; what the forward
pass kept for it is only what the unit reads from outside (its checkpoint). The settings, with
Megatron-Core's names (``TransformerConfig.recompute_granularity``, ``recompute_method``,
``recompute_num_layers``, ``recompute_modules``; ``TransformerBlock._checkpointed_forward`` and
``TransformerLayer``'s per-module checkpoints):

- **full**, ``method`` uniform, ``num_layers`` N (N = 1 when not given): every transformer layer
  re-run; each group of N consecutive layers of a model chunk is one checkpoint (only the
  group's input kept), re-run as a whole before the group's first backward op.
- **full**, ``method`` block, ``num_layers`` N: the first N layers of each model chunk (a
  pipeline stage, or each virtual stage of an interleaved schedule) are re-run one by one; the
  other layers keep everything.
- **selective** with ``modules`` (default ``core_attn``): per layer, ``core_attn`` re-runs the
  attention core (the ops between the Q/K/V linears and the output projection), ``mlp`` the MLP
  (fc1, activation, fc2, and the communication after them), ``layernorm`` each norm of the
  layer (its output, the next linear's input, is not kept), ``moe_act`` each expert
  activation, ``mla_up_proj`` the up projections of multi-head latent attention and the rotary
  embedding after them (Megatron-Core's ``MLASelfAttention``: ``qkv_up_proj_and_rope_apply``
  under ``CheckpointWithoutOutput``, its inputs the normed latents; the queries, keys and values
  it makes are dropped once the attention core has run and re-made before the core's backward).
  Modules combine; a norm re-run that an MLP re-run reads goes first.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..compute.op_kinds import classify
from ..errors import ConfigError, TraceError
from ..trace import Trace
from ..trace.layers import find_layers
from .recompute_spec import DEFAULT_MODULES, GRANULARITIES, METHODS, MODULES, RecomputeSpec, as_spec
from .tensor.megatron import find_blocks

Unit = tuple[tuple[int, ...], int, frozenset[int]]  # (forward ops, backward op before which, readers of originals)


def split_at(ops: Sequence[int], cuts: frozenset[int]) -> list[tuple[int, ...]]:
    """``ops`` (forward order) cut before every op in ``cuts``: one part per pipeline stage."""
    parts: list[list[int]] = []
    for j in ops:
        if not parts or j in cuts:
            parts.append([])
        parts[-1].append(j)
    return [tuple(p) for p in parts]


def find_units(trace: Trace, spec: RecomputeSpec, cuts: frozenset[int]) -> list[Unit]:
    """The units of ``spec`` in ``trace``, in forward order; ``cuts``: the first forward op of
    each pipeline stage (model chunk). A unit a cut splits is one unit per stage, each re-run
    right before the first backward op of its own part, so that every re-run stays on its
    stage."""
    try:
        layout = find_layers(trace)
    except TraceError as e:
        raise ConfigError(f"--recompute {spec.granularity} needs a transformer trace with repeated layers: {e}") from None
    if spec.granularity == "full":
        return _full_units(trace, layout, spec, cuts)
    units: list[Unit] = []
    blocks = find_blocks(trace)
    if "core_attn" in spec.modules or "mlp" in spec.modules:
        if _mla_up_units(trace) or not any(b.kind == "attention" for b in blocks):
            if _mla_up_units(trace):  # latent attention: its blocks read latents, not one norm output
                which = "core_attn" if "core_attn" in spec.modules else "mlp"
                default = " (--recompute selective's default module)" if which == "core_attn" else ""
                raise ConfigError(f"--recompute-modules {which}{default} is not modelled with multi-head latent "
                                  "attention: use --recompute-modules mla_up_proj, layernorm or moe_act, or "
                                  "--recompute full")
            raise ConfigError("--recompute selective needs attention blocks (none found in this trace)")
    if "layernorm" in spec.modules:
        units += _norm_units(trace, layout, cuts)
    if "moe_act" in spec.modules:
        found = _expert_activation_units(trace)
        if not found:
            raise ConfigError("--recompute-modules moe_act needs mixture-of-experts layers (this model has none)")
        units += found
    if "mla_up_proj" in spec.modules:
        found = _mla_up_units(trace)
        if not found:
            raise ConfigError("--recompute-modules mla_up_proj needs multi-head latent attention layers "
                              "(this model has none)")
        units += found
    for b in blocks:
        if b.kind == "attention" and "core_attn" in spec.modules:
            units += _block_units(trace, b, tuple(sorted(b.middle)), cuts, keep_row_input=True)
        elif b.kind == "mlp" and "mlp" in spec.modules:
            units += _block_units(trace, b, b.forward, cuts, keep_row_input=False)
    units.sort(key=lambda u: u[0][0])
    return _readers_first(trace, units)


def _full_units(trace: Trace, layout, spec: RecomputeSpec, cuts: frozenset[int]) -> list[Unit]:
    """Whole layers: per model chunk the first N (block) or every group of N (uniform)."""
    chunk_of = []  # per layer, the chunk its first forward op is on
    ordered = sorted(cuts)
    for fwd in layout.forward:
        chunk_of.append(sum(1 for c in ordered if c <= fwd[0]) if fwd else -1)
    groups: list[list[int]] = []
    seen: dict[int, int] = {}  # chunk -> layers of it met so far
    for k, (fwd, bwd) in enumerate(zip(layout.forward, layout.backward)):
        if not bwd or not fwd:
            continue
        c = chunk_of[k]
        n = seen.get(c, 0)
        seen[c] = n + 1
        if spec.method == "block":
            if n < spec.num_layers:
                groups.append([k])
        elif n % spec.num_layers == 0:
            groups.append([k])
        else:
            groups[-1].append(k)
    partner = trace.forward_partner
    units: list[Unit] = []
    for g in groups:
        fwd = tuple(j for k in g for j in layout.forward[k])
        bwd = sorted(i for k in g for i in layout.backward[k])
        parts = split_at(fwd, cuts)
        for n, part in enumerate(parts):
            mine = set(part)
            at = bwd[0] if n == len(parts) - 1 else next((i for i in bwd if partner[i] in mine), None)
            if at is not None:
                units.append((part, at, frozenset()))
    return units


def _made(trace: Trace, ops: Sequence[int]) -> set[str]:
    return {k for j in ops for k in trace.writes[j] if k not in trace.batch_invariant}


def _block_units(trace: Trace, b, ops: tuple[int, ...], cuts: frozenset[int], keep_row_input: bool) -> list[Unit]:
    """A Megatron block's ``ops`` re-run before the first backward op of the block that reads
    what they make. ``keep_row_input``: the row linear's backward reads its stored input (the
    attention core's output, kept for the weight gradient as Megatron keeps it)."""
    partner = trace.forward_partner
    stored = frozenset(i for i in b.backward if partner[i] == b.row) if keep_row_input else frozenset()
    units = []
    for part in split_at(ops, cuts):
        made = _made(trace, part)
        readers = [i for i in b.backward if i not in stored and made.intersection(trace.reads[i])]
        if readers:
            units.append((part, readers[0], stored))
    return units


def _norm_units(trace: Trace, layout, cuts: frozenset[int]) -> list[Unit]:
    """Each norm of a layer, re-run before the first backward op that reads its output."""
    first_back = next((i for i, op in enumerate(trace.ops) if op.stage != "forward"), len(trace.ops))
    units = []
    for fwd in layout.forward:
        for j in fwd:
            if classify(trace.ops[j].name, "forward")[0] == "norm":
                units += _single_op_unit(trace, j, first_back)
    return units


def _expert_activation_units(trace: Trace) -> list[Unit]:
    """Each expert activation (an elementwise op fed by a grouped GEMM), re-run before the first
    backward op that reads its output."""
    first_back = next((i for i, op in enumerate(trace.ops) if op.stage != "forward"), len(trace.ops))
    units = []
    for j in range(first_back):
        if classify(trace.ops[j].name, "forward")[0] != "elementwise":
            continue
        fed = [trace.producer.get(k) for k in trace.reads[j]]
        if any(p is not None and "_grouped_mm" in trace.ops[p].name for p in fed):
            units += _single_op_unit(trace, j, first_back)
    return units


def _mla_up_units(trace: Trace) -> list[Unit]:
    """Per attention op fed through latent up projections: the ops from the normed latents to the
    attention's inputs (the up-projection linears, the rotary products, the key join), re-run
    before the first backward op reading what they make. A latent norm is a norm of a down
    projection's output (a linear of a norm's output); the walk back from the attention stops at norms and at linears that do not read a
    latent norm (the down projections, whose outputs the checkpoint keeps)."""
    first_back = next((i for i, op in enumerate(trace.ops) if op.stage != "forward"), len(trace.ops))
    kind = [classify(trace.ops[j].name, "forward")[0] for j in range(first_back)]

    def made_by(p: int | None, what: str) -> bool:
        return p is not None and p < first_back and kind[p] == what

    def latent_norm(p: int | None) -> bool:  # a norm of a down projection (a linear of a norm's output)
        return made_by(p, "norm") and any(
            made_by(q := trace.producer.get(k), "matmul") and any(made_by(trace.producer.get(x), "norm")
                                                                  for x in trace.reads[q])
            for k in trace.reads[p])

    units = []
    for a in range(first_back):
        if kind[a] != "attention":
            continue
        ops: set[int] = set()
        up = False
        todo = [trace.producer.get(k) for k in trace.reads[a]]
        while todo:
            p = todo.pop()
            if p is None or p in ops or p >= first_back or kind[p] == "norm":
                continue
            if kind[p] == "matmul":
                if not any(latent_norm(trace.producer.get(k)) for k in trace.reads[p]):
                    continue
                up = True
                ops.add(p)
                continue
            ops.add(p)
            todo += [trace.producer.get(k) for k in trace.reads[p]]
        if not up:
            continue
        part = tuple(sorted(ops))
        made = _made(trace, part)
        readers = sorted(i for k in made for i in trace.consumers.get(k, ()) if i >= first_back)
        if readers:
            units.append((part, readers[0], frozenset()))
    return units


def _single_op_unit(trace: Trace, j: int, first_back: int) -> list[Unit]:
    """Op ``j`` re-run alone before the first backward op reading what it makes (none if no
    backward op does)."""
    made = _made(trace, (j,))
    readers = sorted(i for k in made for i in trace.consumers.get(k, ()) if i >= first_back)
    return [((j,), readers[0], frozenset())] if readers else []


def _readers_first(trace: Trace, units: list[Unit]) -> list[Unit]:
    """A unit whose re-run reads what another unit re-makes (an MLP re-run reading the norm's
    output) needs that unit re-run no later: move its re-run point up."""
    made_by = {k: u for u, (fwd, _, _) in enumerate(units) for k in _made(trace, fwd)}
    at = [u[1] for u in units]
    changed = True
    while changed:
        changed = False
        for u, (fwd, _, _) in enumerate(units):
            for j in fwd:
                for k in trace.reads[j]:
                    v = made_by.get(k)
                    if v is not None and v != u and at[v] > at[u]:
                        at[v] = at[u]
                        changed = True
    return [(fwd, at[u], stored) for u, (fwd, _, stored) in enumerate(units)]


__all__ = ["DEFAULT_MODULES", "GRANULARITIES", "METHODS", "MODULES", "RecomputeSpec", "Unit", "as_spec",
           "find_units", "split_at"]
