"""Tensor-parallel plans: which ops run at 1/T, which collectives follow which op, which buffers
each of the T ranks holds a 1/T shard of.

Two styles:

- **megatron** (transformer traces). A *block* is a column-parallel group of linears, the ops
  between them and one row-parallel linear: attention (Q/K/V or a fused QKV linear → attention
  core → output projection) and MLP (fc1 → activation → fc2). Detection rule, on the forward
  ops: start at a linear *R* (a linear/addmm/mm op reading a 2-D parameter); walk its activation
  input back through producers. Walking stops at linears (the column group); it fails at a
  norm, embedding or convolution, at a buffer from outside the step, at a backward op, or
  after 64 ops. The column linears must read one and the same buffer (the block input), and
  every forward reader of a column output or of an op in between must be inside the block. A
  block whose in-between ops include an attention core (attention, softmax, bmm, matmul) is an
  *attention* block, else an *mlp* block. The backward ops of a block are the contiguous run of
  backward ops from the first to the last whose forward partner is in the block (gradient
  accumulation ops without a partner inside the run belong to it).

  **Latent attention** (DeepSeek's MLA, :mod:`triosim.graph.tensor.latent`): the walk back from
  the output projection reaches the query and key/value up projections, which read two different
  normed latents, and the key/value down projection, whose output ops outside the block read too
  (its latent half feeds the latent norm). Such a linear is no column linear but a *shared
  input* every rank computes whole; an attention block may then have several inputs (one per
  up projection). Its backward ops are the paired ones from first to last, less the latent
  norms' backward that autograd runs in between. Each input is gathered and its gradient reduced
  as a plain block's one input; the shared rope key as Megatron-Core does (see that module).

  Each block is split column-then-row: its weights (row-linear biases excepted), their
  gradients and optimizer state are 1/T per rank, its forward and backward ops run at 1/T
  time, and it issues one all-reduce of the row linear's output after the forward and one of
  the block input's gradient (partial sums of the column linears' input gradients) after its
  backward. Ops outside blocks (embeddings, LayerNorm, residual adds, dropout, the LM head, the
  loss) run at full time on every rank. Optimizer ops run at the fraction of the parameter
  bytes each rank still holds. With ``sequence_parallel`` the forward ops strictly between two
  blocks (LayerNorm, residual add, dropout) and their backward ops run at 1/T and hold 1/T of
  their activations, and every all-reduce becomes a reduce-scatter plus an all-gather of the
  same payload: forward, an all-gather of the block input after the op that wrote it and a
  reduce-scatter of the output after the row linear; backward, an all-gather of the output
  gradient before the block's backward and a reduce-scatter of the input gradient after it.
  A trace with no attention block falls back to the per-op style and says why.

- **per-op** (any trace): today's case 3 from :mod:`triosim.graph.tensor.per_op`, exactly:
  every ``tpflag`` op at 1/T, an all-gather after each forward tpflag op and an all-reduce of
  the input gradient after each backward one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError
from ...trace import Trace
from ...trace.precision import size_key
from . import per_op as case3
from .latent import feeders, gradient_sums, latent_backward_run, latent_collectives, shared_only
from .per_op import TpCollective, optimizer_state_of
from .vocab import VocabParallel, find_vocab, sequence_ends, vocab_collectives, vocab_shards

STYLES = ("megatron", "per-op")
_LINEAR_NAMES = frozenset({"linear", "addmm", "mm"})
_ATTENTION_MARKS = ("attention", "softmax", "bmm", "matmul")
_BARRIER_MARKS = ("norm", "embedding", "conv")
_MAX_BLOCK_OPS = 64


@dataclass(frozen=True)
class MegatronBlock:
    """One column-then-row block of a transformer trace (op indices into ``trace.ops``)."""

    kind: str  # "attention" | "mlp"
    column: tuple[int, ...]  # column-parallel linears (forward)
    middle: tuple[int, ...]  # forward ops between the column linears and the row linear
    row: int  # the row-parallel linear (forward)
    backward: tuple[int, ...]  # the block's backward ops, in trace order
    input: str  # the buffer every column linear reads
    output: tuple[str, ...]  # what the row linear writes
    output_grad: tuple[str, ...]  # gradients the block's backward reads from outside it
    input_grad: tuple[str, ...]  # gradients the block's backward hands on (partial sums)
    # Latent attention (see the module docstring): every column linear's input, in op order
    # (``input`` is the first), the outputs of the linears every rank runs whole whose result the
    # block reads (``shared``), and the block's forward ops that read only those (run whole).
    inputs: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    whole: tuple[int, ...] = ()

    @property
    def entries(self) -> tuple[str, ...]:
        """The buffers the column linears read: ``inputs``, or ``(input,)`` for a plain block."""
        return self.inputs or (self.input,)

    @property
    def forward(self) -> tuple[int, ...]:
        return tuple(sorted((*self.column, *self.middle, self.row)))


@dataclass(frozen=True)
class TensorParallelPlan:
    """How a trace runs on each of ``degree`` tensor-parallel ranks (all ranks alike)."""

    style: str  # "megatron" | "per-op"
    degree: int
    time_scale: tuple[float, ...]  # per trace op: time on one rank / traced time
    collectives: tuple[TpCollective, ...]  # in trace order; on one op a reduce before a gather
    shard_divisor: dict[str, int]  # buffer -> T: each rank holds ceil(bytes / T)
    blocks: tuple[MegatronBlock, ...] = ()
    fallback_reason: str | None = None
    heads: int | None = None  # attention heads the trace implies (None: none found)
    sequence_parallel: bool = False
    vocab: VocabParallel | None = None  # the vocabulary-parallel embedding/head/loss (None: no head found)
    # per trace op: the share of its work one rank does (``time_scale`` before the shape-timed
    # costing of graph/tensor/split_time.py; () when the two are the same)
    share: tuple[float, ...] = ()

    def op_time(self, i: int, duration_s: float) -> float:
        """Seconds op ``i`` takes on one rank when its traced time is ``duration_s`` (an op split
        over the ranks is divided by the degree, the same float as today's case 3)."""
        scale = self.time_scale[i]
        if scale == 1.0:
            return duration_s
        if scale == 1.0 / self.degree:
            return duration_s / self.degree
        return duration_s * scale

    def summary(self) -> str:
        """One line for the run summary: the blocks found, or why the per-op scheme is used."""
        if self.style == "megatron":
            att = sum(1 for b in self.blocks if b.kind == "attention")
            heads = f", {self.heads} attention heads" if self.heads else ""
            sp = ", sequence parallel" if self.sequence_parallel else ""
            vocab = f", vocabulary-parallel head ({self.vocab.vocab} words)" if self.vocab else ""
            return (f"megatron tensor parallel: {len(self.blocks)} blocks ({att} attention, "
                    f"{len(self.blocks) - att} mlp){heads}{vocab}{sp}")
        if self.fallback_reason:
            return f"per-op tensor parallel ({self.fallback_reason})"
        return "per-op tensor parallel"


# ----------------------------------------------------------------------------- detection


def _short(name: str) -> str:
    return name.rsplit("::", 1)[-1].strip().lower()


def _is_linear(trace: Trace, i: int, params: set[str]) -> bool:
    op = trace.ops[i]
    if op.stage != "forward" or _short(op.name) not in _LINEAR_NAMES:
        return False
    return any(k in params and len(trace.tensors[k].shape or ()) == 2 for k in trace.reads[i])


def _activation_inputs(trace: Trace, i: int, params: set[str]) -> list[str]:
    return [k for k in trace.reads[i] if k not in params]


def _walk_back(trace: Trace, row: int, params: set[str]) -> tuple[set[int], set[int]] | None:
    """(column linears, ops between) feeding linear ``row``, or None when it is no block."""
    column: set[int] = set()
    middle: set[int] = set()
    stack = _activation_inputs(trace, row, params)
    if len(stack) != 1:
        return None
    seen: set[str] = set()
    while stack:
        buf = stack.pop()
        if buf in seen:
            continue
        seen.add(buf)
        j = trace.producer.get(buf)
        if j is None:
            if trace.tensors[buf].bytes and buf not in trace.batch_invariant and not middle and not column:
                return None  # the row linear reads the step's input directly
            continue  # a constant from outside the step (mask, position ids)
        op = trace.ops[j]
        if op.stage != "forward" or j >= row:
            return None
        if _is_linear(trace, j, params):
            column.add(j)
            continue
        if any(m in _short(op.name) for m in _BARRIER_MARKS):
            return None
        if j not in middle:
            middle.add(j)
            if len(middle) > _MAX_BLOCK_OPS:
                return None
            stack.extend(_activation_inputs(trace, j, params))
    if not column:
        return None
    return column, middle


def _backward_run(trace: Trace, fwd: set[int], paired_with: dict[int, list[int]]) -> tuple[int, ...] | None:
    """The block's backward ops: first..last backward op paired with ``fwd`` (None if mixed).
    ``paired_with``: forward op -> the backward ops whose partner it is."""
    paired = sorted(i for j in fwd for i in paired_with.get(j, ()))
    if not paired:
        return ()
    hi = paired[-1]
    written = {k for i in range(paired[0], hi + 1) for k in trace.writes[i]}
    # Gradient accumulation right after the last paired op (summing the Q/K/V input
    # gradients) has no forward partner but only reads what the run wrote: it belongs to it.
    while (hi + 1 < len(trace.ops) and trace.ops[hi + 1].stage == "backward"
           and trace.forward_partner[hi + 1] is None and trace.reads[hi + 1]
           and set(trace.reads[hi + 1]) <= written):
        hi += 1
        written.update(trace.writes[hi])
    run = tuple(range(paired[0], hi + 1))
    for i in run:
        p = trace.forward_partner[i]
        if trace.ops[i].stage != "backward" or (p is not None and p not in fwd):
            return None
    return run


def _gradients_in_out(trace: Trace, run: tuple[int, ...], params: set[str],
                      fwd_written: set[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(gradients the run reads from before it, gradients it writes that later ops read);
    ``fwd_written``: every buffer a forward op writes."""
    if not run:
        return (), ()
    written_in: set[str] = set()
    needed: list[str] = []
    for i in run:
        for k in trace.reads[i]:
            if (k not in written_in and k not in params and k not in trace.batch_invariant
                    and k not in fwd_written and k not in needed):
                needed.append(k)
        written_in.update(trace.writes[i])
    handed: list[str] = []
    mine = set(run)
    for i in run:
        for k in trace.writes[i]:
            if k in params or k in trace.batch_invariant or k in handed:
                continue
            # read later by an op outside the run (for a contiguous run: after its last op)
            if any(c > i and c not in mine for c in trace.consumers.get(k, ())):
                handed.append(k)
    return tuple(needed), tuple(handed)


def find_blocks(trace: Trace) -> list[MegatronBlock]:
    """The Megatron blocks of ``trace`` in forward order (see the module docstring's rule)."""
    params = set(trace.parameters)
    fwd_readers: dict[str, list[int]] = {}
    for i, op in enumerate(trace.ops):
        if op.stage == "forward":
            for k in trace.reads[i]:
                fwd_readers.setdefault(k, []).append(i)
    fwd_written = {k for i, op in enumerate(trace.ops) if op.stage == "forward" for k in trace.writes[i]}
    paired_with: dict[int, list[int]] = {}
    for i, p in enumerate(trace.forward_partner):
        if p is not None and trace.ops[i].stage == "backward":
            paired_with.setdefault(p, []).append(i)
    blocks: list[MegatronBlock] = []
    used: set[int] = set()
    for r in range(len(trace.ops)):
        if not _is_linear(trace, r, params) or r in used:
            continue
        found = _walk_back(trace, r, params)
        if found is None:
            continue
        column, middle = found
        members = column | middle | {r}
        # A linear whose output the walk reached but that ops outside the block read too (latent
        # attention's key/value down projection: its latent half feeds the latent norm, its rope
        # half the attention core) is no column linear: every rank runs it whole (Megatron-Core's
        # duplicated down projections) and the block reads its output as a shared input.
        whole_linears = {c for c in column if any(x not in members for k in trace.writes[c]
                                                  for x in fwd_readers.get(k, ()))}
        if whole_linears & used:
            continue
        column -= whole_linears
        members -= whole_linears
        inputs = tuple(dict.fromkeys(k for c in sorted(column) for k in _activation_inputs(trace, c, params)))
        if not column or column & used or middle & used:
            continue
        kind = "attention" if any(m in _short(trace.ops[j].name) for j in middle for m in _ATTENTION_MARKS) \
            else "mlp"
        latent = len(inputs) > 1 or bool(whole_linears)
        if not inputs or (latent and kind != "attention"):
            continue  # several inputs or a shared one: only latent attention's
        inner = {k for j in column | middle for k in trace.writes[j]}
        if any(reader not in members for k in inner for reader in fwd_readers.get(k, ())):
            continue  # a column output or in-between result is needed outside the block
        run = (latent_backward_run if latent else _backward_run)(trace, members, paired_with)
        if run is None:
            continue
        out_grad, in_grad = _gradients_in_out(trace, run, params, fwd_written)
        if latent:  # a constant the backward reads (the rotary table) is no gradient to gather
            out_grad = tuple(k for k in out_grad if k in trace.producer)
        shared = tuple(k for c in sorted(whole_linears) for k in trace.writes[c] if k not in params)
        blocks.append(MegatronBlock(
            kind=kind, column=tuple(sorted(column)), middle=tuple(sorted(middle)), row=r, backward=run,
            input=inputs[0], output=trace.writes[r], output_grad=out_grad, input_grad=in_grad,
            inputs=inputs if latent else (), shared=shared,
            whole=shared_only(trace, sorted(middle), set(shared)) if shared else (),
        ))
        used |= members
    return blocks


def attention_heads(trace: Trace, blocks: list[MegatronBlock] | tuple[MegatronBlock, ...] | None = None) -> int | None:
    """Attention heads the trace implies: dim 1 of a 4-D ``[batch, heads, seq, head_dim]`` tensor
    written by an attention core, whose heads × head_dim is a column linear's output width; else
    (latent attention, whose values are narrower than its queries) of such a tensor one reads."""
    if blocks is None:
        blocks = find_blocks(trace)
    attention = [b for b in blocks if b.kind == "attention"]
    for read in (False, True):
        for b in attention:
            widths = {(trace.tensors[k].shape or (0,))[-1] for c in b.column for k in trace.writes[c]}
            for j in b.middle:
                for k in (trace.ops[j].inputs if read else trace.writes[j]):
                    shape = trace.tensors[k].shape or ()
                    # a fused QKV linear is three heads × head_dim wide
                    if len(shape) == 4 and (shape[1] * shape[3] in widths or 3 * shape[1] * shape[3] in widths):
                        return shape[1]
    return None


# ----------------------------------------------------------------------------- plans


def _per_op_plan(trace: Trace, degree: int, reference_compat: bool, reason: str | None) -> TensorParallelPlan:
    scale = []
    for op in trace.ops:
        rule = 1.0 / degree if op.tpflag and op.stage != "optimizer" else 1.0
        if op.duration_s > 0:
            # case 3's op_time, snapped to the exact factor so plan.op_time gives the same float
            ratio = case3.op_time(trace, op.index, degree) / op.duration_s
            rule = next((x for x in (1.0, 1.0 / degree) if abs(ratio - x) <= 1e-12), ratio)
        scale.append(rule)
    shards = {k: degree for k in sorted(case3.sharded_buffers(trace))} if degree > 1 else {}
    return TensorParallelPlan(
        style="per-op", degree=degree, time_scale=tuple(scale),
        collectives=tuple(case3.tp_collectives(trace, degree, reference_compat)), shard_divisor=shards,
        fallback_reason=reason,
    )


def _sequence_region(trace: Trace, blocks: list[MegatronBlock]) -> set[int]:
    """Forward ops strictly between consecutive blocks (LayerNorm, residual add, dropout) and
    the backward ops paired with them: what sequence parallelism splits along the sequence."""
    inside = {j for b in blocks for j in b.forward}
    region: set[int] = set()
    for a, b in zip(blocks, blocks[1:]):
        region.update(j for j in range(a.row + 1, min(b.column)) if j not in inside
                      and trace.ops[j].stage == "forward")
    for b in blocks:
        region |= feeders(trace, b, inside)
    region.update(i for i, p in enumerate(trace.forward_partner) if p in region
                  and trace.ops[i].stage == "backward")
    return region


def _block_shards(trace: Trace, blocks: list[MegatronBlock], params: set[str]) -> set[str]:
    """Weights (row biases excepted), their gradients and the activations inside each block."""
    shards: set[str] = set()
    for b in blocks:
        mine: dict[int, set[str]] = {}  # forward linear -> its sharded parameters
        for c in b.column:
            mine[c] = {k for k in trace.reads[c] if k in params}
        mine[b.row] = {k for k in trace.reads[b.row] if k in params and len(trace.tensors[k].shape or ()) == 2}
        for ks in mine.values():
            shards |= ks
        for j in (*b.column, *b.middle):
            if j not in b.whole:
                shards.update(k for k in trace.writes[j] if k not in params)
        handed = set(b.input_grad)
        for i in b.backward:
            sizes = {size_key(trace, k) for k in mine.get(trace.forward_partner[i], ())}
            for k in trace.writes[i]:
                if k in trace.batch_invariant:
                    # a parameter gradient: sharded when its linear's parameter of that size is
                    if k not in params and size_key(trace, k) in sizes:
                        shards.add(k)
                elif k not in handed and k not in params:
                    shards.add(k)
    return shards


def _optimizer_scale(trace: Trace, shards: set[str], t: float) -> float:
    """Fraction of the parameter bytes one rank still updates (optimizer ops run that long)."""
    total = trace.parameter_bytes
    kept = sum(trace.tensors[p].bytes / (t if p in shards else 1.0) for p in trace.parameters)
    return kept / total if total > 0 else 1.0


def _regather_slot(trace: Trace, b: MegatronBlock, taken: set[int], buf: str | None = None) -> int | None:
    """The op after which sequence parallelism's backward re-gathers ``b``'s input ``buf`` (by
    default ``b.input``): the last op before the first backward op reading it (the column
    linears' weight-gradient GEMMs), within the block's backward and on an op no other
    collective follows; None when there is none."""
    buf = b.input if buf is None else buf
    readers = [i for i in b.backward if buf in trace.reads[i]]
    if not readers:
        return None
    at = readers[0] - 1
    while at >= b.backward[0] and at in taken:
        at -= 1
    return at if at >= b.backward[0] else None


def _megatron_plan(trace: Trace, degree: int, blocks: list[MegatronBlock], heads: int | None,
                   sequence_parallel: bool) -> TensorParallelPlan:
    params = set(trace.parameters)
    t = float(degree)
    vp = find_vocab(trace, blocks)
    split: set[int] = {j for b in blocks for j in (*b.forward, *b.backward) if j not in b.whole}
    region = _sequence_region(trace, blocks) if sequence_parallel else set()
    if vp is not None:
        split.update(vp.split_ops)
        if sequence_parallel:
            ends = sequence_ends(trace, vp, blocks)
            region |= ends | {i for i, p in enumerate(trace.forward_partner) if p in ends
                              and trace.ops[i].stage == "backward"}
            region -= split
    if sequence_parallel:
        region |= gradient_sums(trace, blocks, region)
    shards = _block_shards(trace, blocks, params) if degree > 1 else set()
    if degree > 1 and vp is not None:
        shards |= vocab_shards(trace, vp)
    if degree > 1:
        shards |= optimizer_state_of(trace, shards & params)
        for j in region:
            shards.update(k for k in trace.writes[j] if k not in params and k not in trace.batch_invariant)
    opt_scale = _optimizer_scale(trace, shards, t)
    scale = []
    for op in trace.ops:
        if op.index in split or op.index in region:
            scale.append(1.0 / t)
        elif op.stage == "optimizer":
            scale.append(opt_scale)
        else:
            scale.append(1.0)
    colls: list[tuple[int, int, TpCollective]] = []
    if degree > 1:
        nb = trace.bytes_of
        for b in blocks:
            if b.inputs or b.shared:
                colls.extend(latent_collectives(trace, b, sequence_parallel))
                continue
            out_bytes = sum(nb(k) for k in b.output)
            in_grad_bytes = sum(nb(k) for k in b.input_grad)
            last_bwd = b.backward[-1] if b.backward else None
            if not sequence_parallel:
                colls.append((b.row, 1, TpCollective(b.row, "all_reduce", b.output, out_bytes)))
                if last_bwd is not None and b.input_grad:
                    colls.append((last_bwd, 1, TpCollective(last_bwd, "all_reduce", b.input_grad, in_grad_bytes)))
                continue
            src = trace.producer.get(b.input, min(b.column) - 1)
            colls.append((src, 0, TpCollective(src, "all_gather", (b.input,), nb(b.input))))
            colls.append((b.row, 1, TpCollective(b.row, "reduce_scatter", b.output, out_bytes)))
            if last_bwd is None:
                continue
            if b.output_grad:
                wanted = set(b.output_grad)
                at = next((i for i in range(b.backward[0] - 1, -1, -1) if wanted.intersection(trace.writes[i])),
                          b.backward[0] - 1)
                colls.append((at, 0, TpCollective(at, "all_gather", b.output_grad,
                                                  sum(nb(k) for k in b.output_grad))))
            if b.input_grad:
                colls.append((last_bwd, 1, TpCollective(last_bwd, "reduce_scatter", b.input_grad, in_grad_bytes)))
        if vp is not None:
            colls.extend(vocab_collectives(trace, vp, sequence_parallel))
        if sequence_parallel:
            # Megatron keeps only the sequence shard of a block's input for backward and gathers
            # it again for the column linears' weight gradients (Korthikanti et al. 2022, section 4.2.2).
            taken = {op for op, _, _ in colls}
            for b in blocks:
                for buf in b.inputs or (None,):
                    at = _regather_slot(trace, b, taken, buf) if buf else _regather_slot(trace, b, taken)
                    if at is not None:
                        taken.add(at)
                        k = buf or b.input
                        colls.append((at, 1, TpCollective(at, "all_gather", (k,), nb(k), redo=True)))
    # (op, tag): tag 1 reduces a block's result, tag 0 gathers a block's input. Where blocks
    # follow each other directly one op ends the first and feeds the second: its reduce-scatter
    # must come before the all-gather of what it reduced, in forward and in backward.
    colls.sort(key=lambda c: (c[0], -c[1]))
    return TensorParallelPlan(
        style="megatron", degree=degree, time_scale=tuple(scale), collectives=tuple(c for _, _, c in colls),
        shard_divisor={k: degree for k in sorted(shards)}, blocks=tuple(blocks), heads=heads,
        sequence_parallel=sequence_parallel, vocab=vp,
    )


def _fallback_reason(blocks: list[MegatronBlock]) -> str | None:
    """Why the megatron style does not apply (None: it does). Linear pairs alone (a CNN's
    classifier, an MLP) are no transformer: their convolutions would stay unsharded."""
    if any(b.kind == "attention" for b in blocks):
        return None
    found = "no transformer blocks found" if not blocks else f"{len(blocks)} linear pairs but no attention block"
    return found + ": not a transformer trace"


def plan_tensor_parallel(trace: Trace, degree: int, style: str = "megatron", sequence_parallel: bool = False,
                         reference_compat: bool = False) -> TensorParallelPlan:
    """The tensor-parallel plan of ``trace`` over ``degree`` ranks.

    ``style`` megatron falls back to per-op (``fallback_reason`` says why) when the trace has no
    attention block. ``reference_compat`` only affects the per-op style (the original's
    all-reduce of every tpflag op's outputs). A megatron plan refuses a degree that does not
    divide the attention heads (:class:`ConfigError`).
    """
    if degree < 1:
        raise ConfigError(f"--tp must be a positive integer, got {degree}")
    if style not in STYLES:
        raise ConfigError(f"--tp-style must be megatron or per-op, got {style!r}")
    if style == "per-op":
        if sequence_parallel and degree > 1:
            raise ConfigError("--sequence-parallel needs --tp-style megatron")
        return _per_op_plan(trace, degree, reference_compat, None)
    blocks = find_blocks(trace)
    reason = _fallback_reason(blocks)
    if reason is not None:
        if sequence_parallel and degree > 1:
            raise ConfigError(f"--sequence-parallel needs a transformer trace ({reason})")
        return _per_op_plan(trace, degree, reference_compat, reason)
    heads = attention_heads(trace, blocks)
    if heads is not None and heads % degree != 0:
        raise ConfigError(f"--tp {degree} does not divide the {heads} attention heads of this trace "
                          "(megatron splits whole heads: use a divisor of the head count, or --tp-style per-op)")
    return _megatron_plan(trace, degree, blocks, heads, sequence_parallel)


__all__ = ["MegatronBlock", "STYLES", "TensorParallelPlan", "TpCollective", "attention_heads", "find_blocks",
           "plan_tensor_parallel"]
