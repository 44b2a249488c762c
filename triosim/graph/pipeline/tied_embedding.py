"""Tied input and output embeddings across a pipeline: the gradient all-reduce between the first
and the last stage.

What it models (Megatron-LM, ``finalize_model_grads`` → ``_allreduce_embedding_grads``;
Narayanan et al. 2021, section 2.2's placement): when the LM head reads the word embedding's own table
and the pipeline has several stages, the first stage (embedding) and the last (head) each hold a
copy of the table and each computes its own part of the gradient. After the backward pass and
the data-parallel gradient reduction, the two parts are summed by an all-reduce over the two
GPUs that hold them (one pair per data- and tensor-parallel rank, each with its 1/T vocabulary
shard); both stages' optimizers wait for it. The trace's own hand-over of the head's part to the
embedding's backward (autograd accumulating into one ``.grad``) is not sent between stages: the
all-reduce replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...trace import Trace
from ..tensor.megatron import find_blocks
from ..tensor.vocab import find_vocab


@dataclass(frozen=True)
class TiedEmbedding:
    """The tied table, its gradient bytes, and the head's gradient part the trace hands on."""

    table: str
    nbytes: int  # the table's gradient, whole (the TP shard divides it)
    head_part: tuple[str, ...]  # buffers the head's backward writes for the embedding's backward


def find_tied(trace: Trace) -> TiedEmbedding | None:
    """The tied embedding of ``trace`` (None when the head has its own weight, or no head)."""
    vp = find_vocab(trace, find_blocks(trace))
    if vp is None or not vp.tied or vp.embedding is None:
        return None
    size, shape = trace.tensors[vp.table].bytes, trace.tensors[vp.table].shape
    # the head's part of the table gradient: what the head's backward writes of the table's shape
    # for the embedding's side to add (autograd's accumulation into one gradient)
    part = tuple(k for i in vp.backward for k in trace.writes[i]
                 if trace.tensors[k].shape == shape and k not in trace.parameters)
    return TiedEmbedding(table=vp.table, nbytes=size, head_part=part)


def add_tied_allreduce(b, comm, tied: TiedEmbedding, lasts: list[dict]) -> None:
    """The all-reduce of the tied table's gradient between pipeline rank 0 and the last rank of
    every built replica, after both ranks' programs (``lasts[p]``: each replica's last task on
    rank p, updated to the all-reduce)."""
    ranks = b.ranks
    first, last = 0, ranks.pp - 1
    nbytes = -(-tied.nbytes // b.tpp.shard_divisor.get(tied.table, 1))
    for d, t in b.replicas:
        group = [ranks.rank(d, t, first), ranks.rank(d, t, last)]
        after = {group[0]: list(lasts[first][(d, t)]), group[1]: list(lasts[last][(d, t)])}
        done = comm.run("all_reduce", group, nbytes, f"allreduce tied embedding dp{d} tp{t}", after,
                        group_kind="embedding")
        lasts[first][(d, t)] = [done[group[0]]]
        lasts[last][(d, t)] = [done[group[1]]]
        if (d, t) == b.replicas[0]:
            b.count("embedding", "all_reduce", group, nbytes)


__all__ = ["TiedEmbedding", "add_tied_allreduce", "find_tied"]
