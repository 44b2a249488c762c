"""Multi-head latent attention (DeepSeek-V2/V3's MLA) under Megatron tensor parallelism: the parts
of :mod:`triosim.graph.tensor.megatron` that only a latent-attention block needs.

How Megatron-Core shards it (``MLASelfAttention`` in megatron/core/transformer/
multi_latent_attention.py, with the Transformer Engine layer spec of
megatron/core/models/gpt/gpt_layer_specs.py):

- ``linear_q_down_proj`` and ``linear_kv_down_proj`` are ``TELinear`` with ``parallel_mode
  'duplicated'``: every rank holds the whole weight and runs them whole (on its sequence shard
  under sequence parallelism), as it runs the two latent norms; no collective of their own;
- ``linear_q_up_proj`` and ``linear_kv_up_proj`` are column-parallel over the heads, the core
  attention runs on the rank's heads and ``linear_proj`` is row-parallel;
- the rope key (the last ``qk_pos_emb_head_dim`` columns of the kv down projection's output,
  one key every head shares) is rotated whole on every rank. Without sequence parallelism it
  takes no collective (its gradient stays each rank's partial sum: Megatron-Core issue #1699,
  an open fix in pull request #6839); with it, ``gather_from_sequence_parallel_region`` all-gathers
  it before the rotation and reduce-scatters its gradient;
- the up projections' inputs are gathered and their input gradients reduced as any column
  linear's: without sequence parallelism an all-reduce of each input gradient (q_l and kv_l wide),
  with it an all-gather of each input (again in the backward, for the weight gradients) and a
  reduce-scatter of each input gradient; the row linear's output as any block's.

In a trace the block's column linears are the up projections (reading the two normed latents),
the kv down projection is the linear whose output the block reads as a *shared input* (its
latent half also feeds the latent norm, outside the block), and autograd interleaves the latent
norms' backward with the up projections'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...trace import Trace
from .per_op import TpCollective

if TYPE_CHECKING:
    from .megatron import MegatronBlock


def latent_backward_run(trace: Trace, fwd: set[int], paired_with: dict[int, list[int]]) -> tuple[int, ...] | None:
    """A latent-attention block's backward ops: from the first to the last backward op paired
    with ``fwd``, less those paired with a forward op outside the block (autograd runs a latent
    norm's backward between the up projections') and the partner-less ones reading nothing the
    block's backward wrote; None when a forward op lies in between."""
    paired = sorted(i for j in fwd for i in paired_with.get(j, ()))
    run: list[int] = []
    written: set[str] = set()
    for i in range(paired[0], paired[-1] + 1) if paired else ():
        p = trace.forward_partner[i]
        if trace.ops[i].stage != "backward":
            return None
        if (p is None and not written.intersection(trace.reads[i])) or (p is not None and p not in fwd):
            continue
        run.append(i)
        written.update(trace.writes[i])
    return tuple(run)


def shared_only(trace: Trace, middle: list[int], shared: set[str]) -> tuple[int, ...]:
    """The in-between ops that read a shared input and, through the block, no column output
    (latent attention's rotary of the one key every head shares): every rank runs them whole."""
    from_shared = set(shared)
    out: list[int] = []
    for j in middle:
        reads = set(trace.reads[j])
        if reads & from_shared and all(k in from_shared or trace.producer.get(k) is None for k in reads):
            out.append(j)
            from_shared.update(trace.writes[j])
    return tuple(out)


def feeders(trace: Trace, b: MegatronBlock, inside: set[int]) -> set[int]:
    """Forward ops outside every block, between ``b``'s first column linear and its row linear,
    that feed ``b`` (latent attention's key/value down projection and latent norm, which run
    after the query up projection): none for a block whose column linears read one input."""
    if not b.inputs and not b.shared:
        return set()
    wanted = set(b.entries) | set(b.shared)
    found: set[int] = set()
    for j in range(b.row - 1, min(b.column), -1):
        if j in inside or trace.ops[j].stage != "forward" or not wanted.intersection(trace.writes[j]):
            continue
        found.add(j)
        wanted.update(trace.reads[j])
    return found


def gradient_sums(trace: Trace, blocks: list[MegatronBlock], region: set[int]) -> set[int]:
    """With latent attention, the partner-less backward ops outside the blocks that read only
    gradients sequence parallelism keeps sharded (the down projections' input gradients summed,
    the latent's and rope key's joined): they work on the sequence shard too."""
    if not any(b.inputs or b.shared for b in blocks):
        return set()
    inside = {j for b in blocks for j in (*b.forward, *b.backward)}
    sharded = {k for i in region if trace.ops[i].stage == "backward" for k in trace.writes[i]}
    sharded.update(k for b in blocks for k in b.input_grad)  # reduce-scattered
    found: set[int] = set()
    for i, op in enumerate(trace.ops):
        if op.stage != "backward" or i in region or i in inside or trace.forward_partner[i] is not None:
            continue
        grads = [k for k in trace.reads[i] if k not in trace.batch_invariant]  # no token IDs: no embedding
        if grads and all(k in sharded for k in grads):
            found.add(i)
            sharded.update(trace.writes[i])
    return found


def _read_bytes(trace: Trace, ops: tuple[int, ...], buf: str) -> int:
    """Bytes of ``buf`` that ``ops`` read: the largest view of it they read (the rope key's
    ``[b, s, r]`` of the down projection's ``[b, s, kv_l + r]`` output)."""
    seen = [trace.tensors[t].bytes for j in ops for t in trace.ops[j].inputs if trace.base(t) == buf]
    return max(seen, default=trace.bytes_of(buf))


def latent_collectives(trace: Trace, b: MegatronBlock, sequence_parallel: bool) -> list[tuple[int, int, TpCollective]]:
    """A latent-attention block's collectives as Megatron-Core's ``MLASelfAttention`` issues them
    (see the module docstring): (op, tag, collective), as the megatron plan sorts them."""
    nb = trace.bytes_of
    out: list[tuple[int, int, TpCollective]] = []
    out_bytes = sum(nb(k) for k in b.output)
    writer = {k: i for i in b.backward for k in trace.writes[i]}
    column = set(b.column)
    partner = trace.forward_partner
    # each handed gradient: an up projection's input gradient (a partial sum over the heads) or
    # the gradient of a shared input (the rope key's, summed over this rank's heads only)
    grads = [(writer[k], k, partner[writer[k]] in column) for k in b.input_grad if k in writer]
    if not sequence_parallel:
        out.append((b.row, 1, TpCollective(b.row, "all_reduce", b.output, out_bytes)))
        # Megatron-Core all-reduces the up projections' input gradients (column-parallel linears on
        # a replicated input) and leaves the rope key's gradient as each rank has it
        out.extend((i, 1, TpCollective(i, "all_reduce", (k,), nb(k))) for i, k, up in grads if up)
        return out
    for k in b.entries:
        src = trace.producer.get(k, min(b.column) - 1)
        out.append((src, 0, TpCollective(src, "all_gather", (k,), nb(k))))
    for k in b.shared:  # gather_from_sequence_parallel_region of the rope key
        src = trace.producer[k]
        out.append((src, 0, TpCollective(src, "all_gather", (k,), _read_bytes(trace, b.middle, k))))
    out.append((b.row, 1, TpCollective(b.row, "reduce_scatter", b.output, out_bytes)))
    if not b.backward:
        return out
    if b.output_grad:
        wanted = set(b.output_grad)
        at = next((i for i in range(b.backward[0] - 1, -1, -1) if wanted.intersection(trace.writes[i])),
                  b.backward[0] - 1)
        out.append((at, 0, TpCollective(at, "all_gather", b.output_grad, sum(nb(k) for k in b.output_grad))))
    # every handed gradient, up projections' and rope key's, leaves the block sequence-sharded
    out.extend((i, 1, TpCollective(i, "reduce_scatter", (k,), nb(k))) for i, k, _ in grads)
    return out


__all__ = ["feeders", "gradient_sums", "latent_backward_run", "latent_collectives", "shared_only"]
