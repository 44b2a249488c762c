"""What one context-parallel rank runs and holds, and the closed forms of its exchange.

With ``--cp N`` (Megatron-Core's ``--context-parallel-size``, Transformer Engine's attention
with context parallelism) every sample's sequence is cut into 2N chunks and context rank r
holds chunks r and 2N−1−r (causal load balancing: a rank with an early chunk, whose queries
see few keys under the causal mask, also holds a late one, which see many). So:

- **Every op outside attention** works on the rank's s/N tokens: its share of the op is 1/N
  (on top of its tensor-parallel share), and **every activation** is 1/N on each rank: the
  tensor-parallel plan's ``shard_divisor`` is multiplied by N for every buffer that scales with
  the batch (parameters, their gradients and optimizer state stay whole; the rank is a replica
  of the model).
- **Attention** does the same work on every rank: in units of one chunk-by-chunk block (a
  block on the diagonal half, as the causal mask leaves it), the 2N chunks make 2N² units and
  each rank does 2N, 2 in each of its N ring steps (:func:`rank_work`, :func:`step_work`).
  ``p2p`` (ring attention, Liu et al. 2023, "Ring Attention with Blockwise Transformers"):
  the attention op runs as N partial attentions, each 1/N² of the whole op; ``a2a``
  (Jacobs et al. 2023, "DeepSpeed Ulysses") and ``allgather``: one attention of 1/N of the op
  (the whole sequence on 1/N of the heads, or the rank's queries against every key).
- **Exchange bytes** per layer and direction (:func:`ring_exchange_bytes`), as Transformer
  Engine's ``AttnFuncWithCPAndKVP2P`` sends them: forward N−1 sends of the rank's key/value
  chunk; backward N sends, the first of keys/values only, the last of their gradients only,
  those between of both: (N−1)·(K,V) + (N−1)·(dK,dV).

When the op times come from shapes (``roofline``, ``retarget``), a rank's share of an op is
costed at its size (:func:`triosim.graph.tensor.split_time.split_time_scale`: FLOPs × the
share, each tensor at its size on the rank, weights whole), so a context-parallel rank's op
runs where a 1/N sequence sits on the device's efficiency curves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ...compute.op_kinds import classify
from ...errors import ConfigError
from ...trace import Trace
from ..tensor.split_time import block_edges, split_time_scale

FORWARD, BACKWARD = "forward", "backward"
# Causal work of one ring step under the balanced layout, in chunk-by-chunk blocks.
BALANCED_STEP_WORK = 2.0


# ----------------------------------------------------------------------------- closed forms


def chunks_of(rank: int, cp: int) -> tuple[int, int]:
    """The two of the sequence's 2·cp chunks context rank ``rank`` holds (causal load balancing,
    Transformer Engine's ``get_seq_chunk_ids_for_reordering``): ``rank`` and ``2·cp − 1 − rank``."""
    return rank, 2 * cp - 1 - rank


def causal_blocks(q_chunks: Sequence[int], kv_chunks: Sequence[int]) -> float:
    """Causal attention work of the queries of ``q_chunks`` over the keys of ``kv_chunks``, in
    chunk-by-chunk blocks: a key chunk before the query chunk counts 1, the same chunk ½ (the
    mask keeps its lower triangle), a later one 0."""
    return sum(1.0 if k < q else 0.5 if k == q else 0.0 for q in q_chunks for k in kv_chunks)


def kv_owner(rank: int, step: int, cp: int, phase: str = FORWARD) -> int:
    """The context rank whose keys and values rank ``rank`` attends to in ring step ``step``:
    forward, its own first and then those passed on from rank − 1; backward, in the reverse
    order, starting from the last block the forward received (rank + 1)."""
    return (rank - step) % cp if phase == FORWARD else (rank + step + 1) % cp


def step_work(rank: int, step: int, cp: int, phase: str = FORWARD) -> float:
    """Causal blocks of rank ``rank``'s ring step ``step``."""
    return causal_blocks(chunks_of(rank, cp), chunks_of(kv_owner(rank, step, cp, phase), cp))


def rank_work(rank: int, cp: int) -> float:
    """Causal blocks rank ``rank`` computes over its ring (2·cp under the balanced layout, of the
    sequence's 2·cp² in all)."""
    return sum(step_work(rank, j, cp) for j in range(cp))


def ring_exchange_bytes(kv_bytes: int, dkv_bytes: int, cp: int, phase: str) -> list[int]:
    """Bytes each rank sends to its ring neighbour in each exchange of one attention op:
    forward N−1 sends of its key/value chunk (``kv_bytes``), backward N sends: keys/values
    first, then keys/values with the gradients of the block before (``dkv_bytes``), the
    gradients alone last."""
    if cp < 2:
        return []
    if phase == FORWARD:
        return [kv_bytes] * (cp - 1)
    return [(kv_bytes if j < cp - 1 else 0) + (dkv_bytes if j > 0 else 0) for j in range(cp)]


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class AttentionOp:
    """One fused attention op of the trace and the buffers its exchange carries."""

    index: int
    phase: str  # forward | backward
    q: str
    k: str
    v: str
    out: str  # the attention output (forward); its gradient (backward: dO)
    grads: tuple[str, ...] = ()  # backward: (dQ, dK, dV)


@dataclass(frozen=True)
class ContextPlan:
    """The attention ops of a trace under ``degree`` context-parallel ranks exchanging keys and
    values as ``comm_type`` says (p2p, a2a, allgather)."""

    degree: int
    comm_type: str
    ops: dict[int, AttentionOp]

    @property
    def steps(self) -> int:
        """Partial attentions per attention op (N for the ring, 1 otherwise)."""
        return self.degree if self.comm_type == "p2p" else 1


def _data_inputs(trace: Trace, i: int) -> list[str]:
    return [t for t in trace.ops[i].inputs if trace.tensors[t].category not in ("indices", "target", "mask")]


def attention_ops(trace: Trace, comm_type: str = "p2p", cp: int = 2) -> dict[int, AttentionOp]:
    """Every fused attention op of ``trace`` (forward and backward, re-runs included) with its
    query, key, value and output buffers."""
    out: dict[int, AttentionOp] = {}
    partner = None
    for op in trace.ops:
        kind = classify(op.name, op.stage)[0]
        if kind == "attention":
            data = _data_inputs(trace, op.index)
            if len(data) < 3 or not op.outputs:
                raise ConfigError(f"--cp {cp}: cannot find the query, key and value inputs of "
                                  f"{trace.op_label(op)}")
            q, k, v = (trace.base(t) for t in data[:3])
            out[op.index] = AttentionOp(op.index, FORWARD, q, k, v, trace.base(op.outputs[0]))
        elif kind == "attention_backward":
            if partner is None:
                partner = trace.forward_partner
            fwd = partner[op.index]
            data = _data_inputs(trace, op.index)
            if fwd is None or fwd not in out or len(op.outputs) < 3 or not data:
                raise ConfigError(f"--cp {cp}: cannot find the forward attention and the query, key and value "
                                  f"gradients of {trace.op_label(op)}")
            f = out[fwd]
            out[op.index] = AttentionOp(op.index, BACKWARD, f.q, f.k, f.v, trace.base(data[0]),
                                        tuple(trace.base(t) for t in op.outputs[:3]))
    return out


def attention_shape(trace: Trace, op: AttentionOp) -> tuple[int, int, int] | None:
    """(heads, key/value heads, sequence) of a forward attention op from its 4-D tensors
    (batch, heads, sequence, head size), None where the trace does not show them."""
    shapes = [trace.tensors[t].shape for t in (*trace.ops[op.index].inputs[:3], *trace.ops[op.index].outputs[:1])]
    four = [s for s in shapes if s is not None and len(s) == 4]
    if not four:
        return None
    b, heads, seq, head_dim = four[-1]  # the output: (batch, heads, sequence, head size)
    k = trace.tensors[trace.ops[op.index].inputs[1]].shape
    if k is not None and len(k) == 4:
        kv_heads = k[1]
    elif k is not None and len(k) == 3 and head_dim:
        kv_heads = k[2] // head_dim
    else:
        kv_heads = heads
    return heads, kv_heads, seq


def _check(trace: Trace, ops: dict[int, AttentionOp], cp: int, comm_type: str, tp: int) -> None:
    """The one-line refusals: no fused attention, a sequence that does not cut into 2·cp
    chunks, heads that an all-to-all cannot split."""
    if not any(a.phase == FORWARD for a in ops.values()):
        raise ConfigError(f"--cp {cp} needs fused attention ops (scaled-dot-product or flash attention, as "
                          "Transformer Engine runs context parallelism); this trace has none (a model card with "
                          "attention: standard runs softmax and the two products as separate ops)")
    shape = attention_shape(trace, next(a for a in ops.values() if a.phase == FORWARD))
    if shape is None:
        return
    heads, kv_heads, seq = shape
    if seq % (2 * cp):
        raise ConfigError(f"--cp {cp} cuts each sequence into {2 * cp} chunks (causal load balancing): the "
                          f"sequence of {seq} tokens is not a multiple of {2 * cp}")
    if comm_type == "a2a":
        per_rank, kv_per_rank = heads // tp, max(1, kv_heads // tp)
        if per_rank % cp or kv_per_rank % cp:
            raise ConfigError(f"--cp-comm-type a2a splits the attention heads over the {cp} context ranks, but each "
                              f"tensor-parallel rank holds {per_rank} heads and {kv_per_rank} key/value heads: not "
                              f"multiples of --cp {cp} (use --cp-comm-type p2p)")


def context_split(trace: Trace, tpp, cp: int, comm_type: str):
    """``tpp`` (the tensor-parallel plan of ``trace``) for one context-parallel rank of ``cp``:
    each op's time at its share of the work (see the module doc) and every activation 1/cp in
    ``shard_divisor``. Raises ConfigError for a trace context parallelism cannot run on."""
    ops = attention_ops(trace, comm_type, cp)
    _check(trace, ops, cp, comm_type, tpp.degree)
    invariant = trace.batch_invariant
    divisor = dict(tpp.shard_divisor)
    for k in trace.tensors:  # every buffer that scales with the batch holds 1/cp of the tokens
        if k not in invariant and trace.tensors[k].bytes > 0:
            divisor[k] = divisor.get(k, 1) * cp
    raw = tpp.share or tpp.time_scale
    # The tensor-parallel block edges a rank reads whole (split_time.py) are still 1/cp of the tokens.
    whole = block_edges(getattr(tpp, "blocks", ()) or ())
    costed = {k: (cp if k in whole else d) for k, d in divisor.items()}
    ring = comm_type == "p2p"
    shares = []
    for i, op in enumerate(trace.ops):
        if op.stage == "optimizer":
            shares.append(raw[i])
        elif ring and i in ops:
            shares.append(raw[i] / (cp * cp))  # one of the cp partial attentions
        else:
            shares.append(raw[i] / cp)
    scale = list(split_time_scale(trace, tuple(shares), costed))
    if ring:
        for i in ops:
            scale[i] *= cp  # the whole ring's partial attentions
    return replace(tpp, time_scale=tuple(scale), shard_divisor=divisor)


def context_plan(trace: Trace, cp: int, comm_type: str) -> ContextPlan:
    """The attention ops of ``trace`` (after any recomputation rewrite) for the DAG."""
    return ContextPlan(cp, comm_type, attention_ops(trace, comm_type, cp))


__all__ = ["BACKWARD", "BALANCED_STEP_WORK", "FORWARD", "AttentionOp", "ContextPlan", "attention_ops",
           "attention_shape", "causal_blocks", "chunks_of", "context_plan", "context_split", "kv_owner",
           "rank_work", "ring_exchange_bytes", "step_work"]
