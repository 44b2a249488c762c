"""Megatron's vocabulary-parallel embedding, LM head and cross-entropy under tensor parallelism.

What it models (Shoeybi et al. 2019, "Megatron-LM", section 3; Megatron-LM's ``VocabParallelEmbedding``,
``ColumnParallelLinear`` output layer and ``vocab_parallel_cross_entropy``):

- **Word embedding.** Each of the T ranks holds V/T rows of the table (and of its gradient and
  optimizer state). Every rank looks up every token, rows it does not hold masked to zero, so the
  lookup keeps its traced time; the partial outputs are summed by an **all-reduce of the
  embedding output** (with sequence parallelism a reduce-scatter, leaving each rank its 1/T of
  the sequence). Its backward needs no communication.
- **LM head.** A column-parallel linear over the vocabulary: each rank computes the logits of its
  V/T words, so the head's forward and backward take 1/T of the time and the logits 1/T of the
  memory. Its input gradient is a partial sum: an all-reduce after the head's backward (with
  sequence parallelism, an all-gather of the head's input after the op that writes it and a
  reduce-scatter of the input gradient).
- **Cross-entropy.** Computed on the split logits (the loss ops and their backward at 1/T), with
  three all-reduces of one fp32 value per token: the maximum logit (after the head, before the
  loss), then the target logit and the sum of exponentials (after the loss op). Megatron computes
  them in fp32 whatever the logits' dtype, hence 4 bytes per token.

Detection (forward ops): the **head** is the last linear reading a 2-D parameter that no
Megatron block owns and whose output's last dimension is the parameter's first (V); the **loss
ops** are the forward ops after it that read a V-wide activation (last dimension V); the **word
embedding** is an ``embedding`` op reading a 2-D parameter of V rows. The backward ops of head
and loss are those that read a V-wide activation (or its gradient) of this data flow. With a table the head also reads, the
embedding is *tied*. A trace without a head keeps the embedding and head unsplit.

Placement: the embedding is among the first forward ops and the head and loss among the last, so
a pipeline's contiguous cuts put them on the first and last stage, as Megatron does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...trace import Trace
from ...trace.precision import size_key
from .per_op import TpCollective

_LINEAR_NAMES = frozenset({"linear", "addmm", "mm"})
# Megatron's cross-entropy all-reduces fp32 [s, b] tensors (logits are cast to float first).
LOSS_REDUCE_BYTES_PER_TOKEN = 4


@dataclass(frozen=True)
class VocabParallel:
    """Where the vocabulary-wide parts of a transformer trace are (op indices into ``trace.ops``)."""

    vocab: int  # V: rows of the head's weight
    tokens: int  # tokens per step (logits' elements / V)
    head: int  # the LM head's forward linear
    head_weight: str
    loss: tuple[int, ...]  # forward ops reading the logits or another V-wide activation
    backward: tuple[int, ...]  # backward ops reading or writing a V-wide activation
    embedding: int | None  # the word embedding's forward op (None: none of V rows)
    table: str | None  # its parameter
    wide: frozenset[str]  # the V-wide activations and activation gradients

    @property
    def tied(self) -> bool:
        """True when the head reads the embedding's own table (tied input/output embeddings)."""
        return self.table is not None and self.table == self.head_weight

    @property
    def split_ops(self) -> tuple[int, ...]:
        """The ops that run on 1/T of the vocabulary (head, loss and their backward)."""
        return tuple(sorted({self.head, *self.loss, *self.backward}))


def _short(name: str) -> str:
    return name.rsplit("::", 1)[-1].strip().lower()


def _matrix_params(trace: Trace, i: int, params: set[str]) -> list[str]:
    return [k for k in trace.reads[i] if k in params and len(trace.tensors[k].shape or ()) == 2]


def _last_dim(trace: Trace, k: str) -> int | None:
    shape = trace.tensors[k].shape
    return shape[-1] if shape else None


def find_vocab(trace: Trace, blocks: Sequence) -> VocabParallel | None:
    """The head, loss and word embedding of ``trace`` (see the module docstring), or None when
    no LM head is found. ``blocks``: the Megatron blocks (their linears are no head)."""
    params = set(trace.parameters)
    owned = {j for b in blocks for j in b.forward}
    head = None
    for i in range(len(trace.ops) - 1, -1, -1):
        op = trace.ops[i]
        if op.stage != "forward" or i in owned or _short(op.name) not in _LINEAR_NAMES:
            continue
        weights = _matrix_params(trace, i, params)
        if not weights:
            continue
        vocab = trace.tensors[weights[0]].shape[0]
        if any(_last_dim(trace, k) == vocab for k in trace.writes[i]) and vocab > 1:
            head = (i, weights[0], vocab)
        break  # only the last linear can be the head
    if head is None:
        return None
    h, weight, vocab = head
    logits = [k for k in trace.writes[h] if _last_dim(trace, k) == vocab]
    tokens = trace.tensors[logits[0]].numel // vocab
    wide = set(logits)
    loss: list[int] = []
    for i in range(h + 1, len(trace.ops)):
        if trace.ops[i].stage != "forward":
            continue
        if any(k in wide for k in trace.reads[i]):
            loss.append(i)
            wide.update(k for k in trace.writes[i] if _last_dim(trace, k) == vocab and k not in params)
    backward: list[int] = []
    for i, op in enumerate(trace.ops):
        if op.stage != "backward":
            continue
        # through the data flow from the logits: an MLP as wide as the vocabulary is no loss
        if any(k in wide for k in trace.reads[i]):
            backward.append(i)
            wide.update(k for k in trace.writes[i] if k not in trace.batch_invariant and _last_dim(trace, k) == vocab)
    embedding = table = None
    for i, op in enumerate(trace.ops):
        if op.stage == "forward" and "embedding" in _short(op.name):
            rows = [k for k in _matrix_params(trace, i, params) if trace.tensors[k].shape[0] == vocab]
            if rows:
                embedding, table = i, rows[0]
                break
    return VocabParallel(vocab=vocab, tokens=tokens, head=h, head_weight=weight, loss=tuple(loss),
                         backward=tuple(backward), embedding=embedding, table=table, wide=frozenset(wide))


def _gradient_of(trace: Trace, param: str) -> list[str]:
    """The gradient buffers of ``param``: what the backward op completing it writes, of its size."""
    i = trace.grad_ready_op.get(param)
    if i is None:
        return []
    size = size_key(trace, param)  # elements under a training dtype: a bf16 weight's fp32 gradient
    return [k for k in trace.writes[i]
            if k in trace.batch_invariant and k not in trace.parameters and size_key(trace, k) == size]


def vocab_shards(trace: Trace, vp: VocabParallel) -> set[str]:
    """Buffers each TP rank holds 1/T of: the table and head weight, their gradients, the
    V-wide activations (logits, log-probabilities and their gradients)."""
    shards = set(vp.wide)
    for p in {vp.head_weight, vp.table} - {None}:
        shards.add(p)
        shards.update(_gradient_of(trace, p))
    return shards


def _input_gradients(trace: Trace, i: int) -> tuple[str, ...]:
    return tuple(k for k in trace.writes[i] if k not in trace.batch_invariant and k not in trace.parameters)


def vocab_collectives(trace: Trace, vp: VocabParallel, sequence_parallel: bool) -> list[tuple[int, int, TpCollective]]:
    """The vocabulary-parallel collectives as (op, order, collective): order 1 runs after the
    op (sorting key as the block collectives')."""
    nb = trace.bytes_of
    out: list[tuple[int, int, TpCollective]] = []
    if vp.embedding is not None:
        emb_out = trace.writes[vp.embedding]
        kind = "reduce_scatter" if sequence_parallel else "all_reduce"
        out.append((vp.embedding, 1, TpCollective(vp.embedding, kind, emb_out, sum(nb(k) for k in emb_out))))
    head_in = [k for k in trace.reads[vp.head] if k not in trace.parameters and k not in trace.batch_invariant]
    if sequence_parallel and head_in:
        src = trace.producer.get(head_in[0])
        if src is not None:
            out.append((src, 1, TpCollective(src, "all_gather", tuple(head_in), sum(nb(k) for k in head_in))))
    per_call = vp.tokens * LOSS_REDUCE_BYTES_PER_TOKEN
    logits = tuple(k for k in trace.writes[vp.head] if k in vp.wide)
    out.append((vp.head, 1, TpCollective(vp.head, "all_reduce", logits, per_call)))  # the max logit
    if vp.loss:
        first = vp.loss[0]  # the target logit and the sum of exponentials
        out.append((first, 1, TpCollective(first, "all_reduce", trace.writes[first], per_call, calls=2)))
    head_bwd = [i for i in vp.backward if trace.forward_partner[i] == vp.head]
    if head_bwd:
        i = head_bwd[-1]
        grads = _input_gradients(trace, i)
        if grads:
            kind = "reduce_scatter" if sequence_parallel else "all_reduce"
            out.append((i, 1, TpCollective(i, kind, grads, sum(nb(k) for k in grads))))
    return out


def sequence_ends(trace: Trace, vp: VocabParallel, blocks: Sequence) -> set[int]:
    """Forward ops sequence parallelism also splits beyond those between blocks: from the word
    embedding's output to the first block (its residual add, dropout, LayerNorm) and from the
    last block to the head (the last residual add, the final LayerNorm), as Megatron keeps the
    whole residual stream sequence-sharded."""
    if not blocks:
        return set()
    inside = {j for b in blocks for j in b.forward}
    first = min(min(b.column) for b in blocks)
    last = max(b.row for b in blocks)
    ends: set[int] = set()
    if vp.embedding is not None:
        reach = set(trace.writes[vp.embedding])
        for j in range(vp.embedding + 1, first):
            if trace.ops[j].stage == "forward" and any(k in reach for k in trace.reads[j]):
                ends.add(j)
                reach.update(trace.writes[j])
    ends.update(j for j in range(last + 1, vp.head) if j not in inside and trace.ops[j].stage == "forward")
    return ends


__all__ = ["LOSS_REDUCE_BYTES_PER_TOKEN", "VocabParallel", "find_vocab", "sequence_ends", "vocab_collectives",
           "vocab_shards"]
