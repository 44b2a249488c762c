"""Megatron tensor parallelism of multi-head latent attention (DeepSeek-V3's MLA): the blocks found,
an MLA layer's TP collectives against Megatron-Core's closed form (``MLASelfAttention`` with the
Transformer Engine spec: duplicated down projections, column-parallel up projections, row-parallel
output projection), with and without sequence parallelism, each with a planted bug; the weights a
rank holds; and the runs that were refused or fell back to per-op before."""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from cli_capture import run as run_argv

import triosim.graph.tensor.latent as latent
import triosim.graph.tensor.megatron as mg
from triosim.graph.tensor.per_op import TpCollective
from triosim.trace.card_variants import MlaSpec
from triosim.trace.load import load_trace
from triosim.trace.model_card import get_card
from triosim.trace.synthetic_card import CardTraceSpec, write_card_trace

# batch, sequence, hidden, heads, no-rope and rope query/key width per head, value width,
# query and key/value latent ranks, MLP width; bf16 (2 bytes)
B, S, H, HEADS, D, R, V, QL, KVL, F, E = 2, 32, 64, 4, 16, 8, 12, 24, 20, 96, 2
VOCAB = 100


def mla_card(rope: bool = True):
    card = replace(get_card("deepseek-v3"), layers=2, hidden=H, heads=HEADS, kv_heads=HEADS, head_dim_given=D,
                   ffn=F, vocab=VOCAB, seq_len=S, moe=None, mtp_layers=0,
                   mla=MlaSpec(q_lora_rank=QL, kv_lora_rank=KVL, rope_head_dim=R, v_head_dim=V))
    return card if rope else replace(card, position="none")


def mla_trace(rope: bool = True):
    d = write_card_trace(Path(tempfile.mkdtemp()) / "t", CardTraceSpec(mla_card(rope), B, E, 2))
    return load_trace(d, batch_size=B)


@pytest.fixture(scope="module")
def trace():
    return mla_trace()


def block_collectives(trace, plan, b) -> Counter:
    """(kind, bytes, re-gather) of every collective carrying one of block ``b``'s buffers."""
    mine = {*b.entries, *b.shared, *b.output, *b.output_grad, *b.input_grad}
    return Counter((c.kind, c.nbytes, c.redo) for c in plan.collectives if mine.intersection(c.buffers))


def closed_form(sp: bool) -> Counter:
    """Megatron-Core's collectives of one MLA layer's attention, bytes from the card's shapes."""
    tok = B * S * E
    if not sp:
        # linear_proj's output; the two up projections' input gradients (the rope key's gradient
        # is left as each rank has it: Megatron-Core issue #1699)
        return Counter({("all_reduce", tok * H, False): 1, ("all_reduce", tok * QL, False): 1,
                        ("all_reduce", tok * KVL, False): 1})
    return Counter({
        # forward: the up projections' inputs and the rope key gathered, linear_proj's output scattered
        ("all_gather", tok * QL, False): 1, ("all_gather", tok * KVL, False): 1, ("all_gather", tok * R, False): 1,
        ("reduce_scatter", tok * H, False): 1,
        # backward: the output gradient gathered, the up projections' inputs gathered again for their
        # weight gradients, their input gradients and the rope key's scattered
        ("all_gather", tok * H, False): 1, ("all_gather", tok * QL, True): 1, ("all_gather", tok * KVL, True): 1,
        ("reduce_scatter", tok * QL, False): 1, ("reduce_scatter", tok * KVL, False): 1,
        ("reduce_scatter", tok * R, False): 1,
    })


def check_mla_layers(trace, degree: int, sp: bool) -> None:
    plan = mg.plan_tensor_parallel(trace, degree, sequence_parallel=sp)
    assert plan.style == "megatron", plan.fallback_reason
    assert [b.kind for b in plan.blocks] == ["attention", "mlp"] * 2
    assert plan.heads == HEADS
    partner = trace.forward_partner
    for b in plan.blocks[::2]:
        assert block_collectives(trace, plan, b) == closed_form(sp), "MLA collectives off the closed form"
        for c in plan.collectives:
            if c.buffers == b.output:  # linear_proj's output: after it
                assert c.op == b.row, "the output's collective is not after the row linear"
            elif c.buffers[0] in b.input_grad:  # right after the backward op that wrote it
                assert c.buffers[0] in trace.writes[c.op] and c.op in b.backward, "gradient reduced elsewhere"
                assert sp or partner[c.op] in b.column, "a gradient other than an up projection's all-reduced"
            elif c.buffers[0] in b.inputs and not c.redo:  # gathered after its latent norm, before its reader
                assert c.buffers[0] in trace.writes[c.op] and c.op < min(b.column) + 3
    assert [c.op for c in plan.collectives] == sorted(c.op for c in plan.collectives)


def test_mla_blocks(trace):
    """The up projections are the column linears (two inputs, the normed latents); the kv down
    projection's output is a shared input; its rope half's rotation runs whole on every rank."""
    plan = mg.plan_tensor_parallel(trace, 2)
    assert plan.summary().startswith("megatron tensor parallel: 4 blocks (2 attention, 2 mlp), 4 attention heads")
    for b in plan.blocks[::2]:
        assert len(b.column) == 2 and len(b.inputs) == 2 and len(b.shared) == 1
        assert [trace.ops[j].name for j in b.whole] == ["aten::mul"]
        assert all(plan.time_scale[j] == 1.0 for j in b.whole)
        assert all(plan.time_scale[j] == 0.5 for j in (*b.column, b.row, *b.backward))
        down = trace.producer[b.shared[0]]
        assert plan.time_scale[down] == 1.0  # the down projection runs whole without sequence parallelism


def test_mla_tp_collectives_closed_form(trace):
    check_mla_layers(trace, 2, sp=False)
    check_mla_layers(trace, 4, sp=False)


def test_mla_sequence_parallel_collectives_closed_form(trace):
    check_mla_layers(trace, 2, sp=True)
    plan = mg.plan_tensor_parallel(trace, 2, sequence_parallel=True)
    # the down projections and latent norms work on the rank's sequence shard
    for b in plan.blocks[::2]:
        down = trace.producer[b.shared[0]]
        latent_norms = [trace.producer[k] for k in b.inputs]
        assert all(plan.time_scale[j] == 0.5 for j in (down, *latent_norms))


def test_mla_without_rope_closed_form():
    """No rotary embedding: the rope key goes straight into the key join, still gathered whole."""
    t = mla_trace(rope=False)
    check_mla_layers(t, 2, sp=False)
    check_mla_layers(t, 2, sp=True)


def test_catches_rope_key_gathered_with_its_latent(trace, monkeypatch):
    """Bug: the sequence-parallel gather of the rope key carries the whole kv down projection's
    output (kv_l + r wide), not the rope key Megatron-Core gathers."""
    monkeypatch.setattr(latent, "_read_bytes", lambda tr, ops, buf: tr.bytes_of(buf))
    with pytest.raises(AssertionError, match="closed form"):
        check_mla_layers(trace, 2, sp=True)


def test_catches_one_reduction_of_every_gradient(trace, monkeypatch):
    """Bug: the block handled as a plain one, all its handed gradients (both up projections' input
    gradients and the rope key's) in one all-reduce after its last backward op."""
    def plain(tr, b, sp):
        nb = tr.bytes_of
        last = b.backward[-1]
        return [(b.row, 1, TpCollective(b.row, "all_reduce", b.output, sum(nb(k) for k in b.output))),
                (last, 1, TpCollective(last, "all_reduce", b.input_grad, sum(nb(k) for k in b.input_grad)))]

    monkeypatch.setattr(mg, "latent_collectives", plain)
    with pytest.raises(AssertionError, match="closed form"):
        check_mla_layers(trace, 2, sp=False)


def rank_parameters(trace, plan) -> int:
    return sum(-(-trace.tensors[p].numel // plan.shard_divisor.get(p, 1)) for p in trace.parameters)


@pytest.mark.parametrize("degree", [2, 4])
def test_mla_weights_per_rank(trace, degree):
    """A rank holds the card's parameters (``triosim models``' count) less (1 − 1/T) of what
    Megatron-Core splits: the up projections, the output projection, the MLP, the word embedding
    and the head; the down projections and every norm stay whole."""
    card = mla_card()
    plan = mg.plan_tensor_parallel(trace, degree)
    split_per_layer = QL * HEADS * (D + R) + KVL * HEADS * (D + V) + HEADS * V * H + 3 * H * F
    split = card.layers * split_per_layer + 2 * VOCAB * H
    assert sum(trace.tensors[p].numel for p in trace.parameters) == card.parameter_count()
    assert rank_parameters(trace, plan) == card.parameter_count() - split + split // degree


def test_catches_down_projection_split(trace, monkeypatch):
    """Bug: the kv down projection sharded as a column linear's weight would be."""
    real = mg._block_shards

    def buggy(tr, blocks, params):
        return real(tr, blocks, params) | {k for b in blocks for k in b.shared
                                           for k in tr.reads[tr.producer[k]] if k in params}

    monkeypatch.setattr(mg, "_block_shards", buggy)
    with pytest.raises(AssertionError):
        test_mla_weights_per_rank(trace, 2)


def test_core_attention_recompute_still_refused_on_mla(trace):
    """Finding MLA's attention blocks does not make ``core_attn`` recomputation modelled there."""
    from triosim.errors import ConfigError
    from triosim.graph.recompute import recompute
    from triosim.graph.recompute_spec import RecomputeSpec

    with pytest.raises(ConfigError, match="not modelled with multi-head latent attention"):
        recompute(trace, RecomputeSpec("selective"))


SMALL_V3 = ["--model", "deepseek-v3", "--num-layers", "4", "--gpu", "h100-sxm", "--seq-len", "4096",
            "--global-batch", "2", "-micro-batch-size", "1", "--dtype", "bf16"]


@pytest.mark.parametrize("extra", [["--tp", "2"], ["--tp", "2", "--sequence-parallel"],
                                   ["--tp", "2", "--ep", "2", "--sequence-parallel"]])
def test_deepseek_v3_runs_megatron_tensor_parallel(extra):
    """DeepSeek-V3 under --tp: Megatron's blocks (it fell back to per-op, and with
    --sequence-parallel was refused: 'no attention block')."""
    code, out, err = run_argv(["run", *SMALL_V3, *extra])
    assert code == 0, err
    assert "Tensor parallel: megatron" in out
