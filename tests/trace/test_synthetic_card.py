"""The training-step trace built from a model card: exact shapes, checked against closed forms.

- Parameters: the trace's parameter elements equal the card's closed form, and each shipped
  card's count is within 2 % of its published size.
- Stored activations per layer (written by a forward op, read by a backward op): Korthikanti et
  al. 2022's sbh(34 + 5as/h) bytes for a 16-bit GPT layer with standard attention and dropout
  (plus the two norms' fp32 mean and rstd, 16sb); flash attention keeps the 4-byte row
  log-sum-exp instead of the 5as²b of scores, mask and dropout output.
- The attention core's batched products are costed (4·b·a·s²·d FLOPs per backward product).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from triosim.compute.op_cost import trace_op_costs
from triosim.graph.tensor.megatron import attention_heads, find_blocks
from triosim.trace.layers import find_layers
from triosim.trace.load import load_trace
from triosim.trace.model_card import ModelCard, get_card, shipped_cards
from triosim.trace.repeat import load_repeated
from triosim.trace.synthetic_card import CardTraceSpec, write_card_trace

CARDS = sorted(shipped_cards())


def small(card: ModelCard, **changes) -> ModelCard:
    """The card's structure at test-friendly sizes."""
    base = dict(layers=4, hidden=64, heads=8, kv_heads=8 if card.kv_heads == card.heads else 2, ffn=176, vocab=100,
                seq_len=32)
    return replace(card, **{**base, **changes})


def build(tmp_path, card: ModelCard, batch: int = 2, element_bytes: int = 2, layers: int = 2, name: str = "t"):
    d = write_card_trace(tmp_path / name, CardTraceSpec(card, batch, element_bytes, layers))
    return load_trace(d, batch_size=batch)


def parameter_elements(trace) -> int:
    return sum(trace.tensors[p].numel for p in trace.parameters)


def stored_bytes(trace) -> int:
    """Bytes of the activations the backward pass reads: written by a forward op (not a
    parameter), read by a backward op."""
    fwd = {k for i, op in enumerate(trace.ops) if op.stage == "forward" for k in trace.writes[i]}
    bwd = {k for i, op in enumerate(trace.ops) if op.stage == "backward" for k in trace.reads[i]}
    return sum(trace.tensors[k].bytes for k in (fwd & bwd) - set(trace.parameters))


@pytest.mark.parametrize("name", CARDS)
def test_shipped_card_parameter_count_matches_its_published_size(name: str) -> None:
    card = get_card(name)
    assert card.published_params is not None and "published_params" in card.sources
    assert abs(card.parameter_count() / card.published_params - 1) <= 0.02


UNIFORM = [n for n in CARDS if shipped_cards()[n].uniform_layers]
DENSE = [n for n in CARDS if shipped_cards()[n].moe is None and shipped_cards()[n].mla is None]
MIXED = [n for n in CARDS if not shipped_cards()[n].uniform_layers]


@pytest.mark.parametrize("name", MIXED)
def test_mixed_layer_trace_parameters_equal_the_closed_form(name: str, tmp_path) -> None:
    """Cards with layers of several kinds (dense and MoE; sliding and full attention) are written
    layer by layer, every layer as the card says."""
    card = small(get_card(name), layers=6)
    full = build(tmp_path, card, layers=card.layers)
    # DeepSeek-V3's multi-token-prediction module is written after the main model (counted apart)
    assert parameter_elements(full) == card.parameter_count() + card.mtp_parameter_count()
    if card.mtp_layers:
        bare = build(tmp_path, replace(card, mtp_layers=0), layers=card.layers, name="bare")
        assert parameter_elements(bare) == card.parameter_count()


@pytest.mark.parametrize("name", UNIFORM)
def test_trace_parameters_equal_the_closed_form(name: str, tmp_path) -> None:
    card = small(get_card(name))
    two = build(tmp_path, card, layers=2)
    assert parameter_elements(two) == replace(card, layers=2).parameter_count()
    full = load_repeated(tmp_path / "t", card.layers, batch_size=2)
    assert parameter_elements(full) == card.parameter_count()
    assert all(full.tensors[p].each_byte == 2 for p in full.parameters)


@pytest.mark.parametrize("name", ["megatron-22b", "gpt3-175b"])
def test_full_size_card_trace_has_the_published_parameter_count(name: str, tmp_path) -> None:
    card = get_card(name)
    d = write_card_trace(tmp_path / "t", CardTraceSpec(card, 1, 2, 2))
    full = load_repeated(d, card.layers, batch_size=1)
    assert parameter_elements(full) == card.parameter_count()


def test_standard_attention_stores_korthikanti_bytes_per_layer(tmp_path) -> None:
    card = small(get_card("gpt3-175b"), ffn=4 * 64)  # standard attention, dropout, GELU, LayerNorm; FFN 4h
    assert card.attention == "standard" and card.dropout > 0
    b, s, h, a = 2, card.seq_len, card.hidden, card.heads
    per_layer = stored_bytes(build(tmp_path, card, b, layers=2, name="two")) - \
        stored_bytes(build(tmp_path, card, b, layers=1, name="one"))
    assert per_layer == s * b * h * 34 + 5 * a * s * s * b + 16 * s * b


def test_flash_attention_keeps_the_log_sum_exp_instead_of_the_scores(tmp_path) -> None:
    std = small(get_card("gpt3-175b"))
    flash = replace(std, attention="flash")
    b, s, a = 2, std.seq_len, std.heads
    diff = stored_bytes(build(tmp_path, std, b, name="std")) - stored_bytes(build(tmp_path, flash, b, name="flash"))
    assert diff == 2 * (5 * a * s * s * b - 4 * a * s * b)  # two layers
    nodrop = replace(std, dropout=0.0)
    diff = stored_bytes(build(tmp_path, nodrop, b, name="nd")) - \
        stored_bytes(build(tmp_path, replace(nodrop, attention="flash"), b, name="ndf"))
    assert diff == 2 * (2 * a * s * s * b - 4 * a * s * b)  # the softmax output alone


def test_grouped_query_attention_shapes(tmp_path) -> None:
    card = small(get_card("llama3-8b"))  # 8 heads, 2 key/value heads, SwiGLU, RMSNorm, RoPE, untied
    trace = build(tmp_path, card)
    kv = card.kv_heads * card.head_dim
    linears = [op for op in trace.ops if op.name == "aten::linear"]
    widths = [trace.tensors[op.outputs[0]].shape[-1] for op in linears]
    # per layer q, k, v, o, gate, up, down; then the LM head
    assert widths == [card.hidden, kv, kv, card.hidden, card.ffn, card.ffn, card.hidden] * 2 + [card.vocab]
    assert not any("dropout" in op.name.lower() for op in trace.ops)
    std = build(tmp_path, replace(card, attention="standard"), name="std")
    assert sum(op.name == "aten::repeat_interleave" for op in std.ops) == 4  # K and V of two layers


@pytest.mark.parametrize("name", DENSE)
def test_megatron_finds_the_blocks_and_heads_and_the_layer_repeats(name: str, tmp_path) -> None:
    card = small(get_card(name))
    trace = build(tmp_path, card)
    blocks = find_blocks(trace)
    assert [b.kind for b in blocks] == ["attention", "mlp"] * 2
    assert attention_heads(trace, blocks) == card.heads
    assert find_layers(trace).count == 2
    assert sum(1 for c in trace_op_costs(trace) if not c.known) == 0


@pytest.mark.parametrize("attention", ["standard", "flash"])
def test_attention_core_flops(attention: str, tmp_path) -> None:
    card = replace(small(get_card("gpt3-175b"), seq_len=48), attention=attention)
    b, s, a, d = 2, card.seq_len, card.heads, card.head_dim
    trace = build(tmp_path, card, b, layers=1)
    costs = trace_op_costs(trace)
    core = [(op.name, c.flops) for op, c in zip(trace.ops, costs)
            if c.op_class in ("attention", "matmul") and not any(
                trace.tensors[k].category == "weight" for k in op.inputs)]
    fwd = sum(f for n, f in core if "evaluate_function" not in n)
    bwd = sum(f for n, f in core if "evaluate_function" in n)
    # the unfused core computes every score; the fused op counts the causal mask's half (meta.json)
    assert trace.info["attention_mask"] == "causal"
    half = 1 if attention == "standard" else 0.5
    assert fwd == 4 * b * a * s * s * d * half
    assert bwd == (8 if attention == "standard" else 10) * b * a * s * s * d * half  # two products' dX, dW; flash 2.5x
    bmm = [c.flops for op, c in zip(trace.ops, costs) if "BmmBackward0" in op.name]
    assert bmm == ([4 * b * a * s * s * d] * 2 if attention == "standard" else [])


def test_tied_embeddings_share_one_parameter(tmp_path) -> None:
    tied = small(get_card("gpt-neo-1.3b"))
    untied = replace(tied, tied_embeddings=False)
    t1, t2 = build(tmp_path, tied, name="tied"), build(tmp_path, untied, name="untied")
    assert parameter_elements(t2) - parameter_elements(t1) == tied.vocab * tied.hidden
    head = next(op for op in t1.ops if op.name == "aten::linear" and t1.tensors[op.outputs[0]].shape[-1] == tied.vocab)
    emb = next(op for op in t1.ops if op.name == "aten::embedding")
    assert set(head.inputs) & set(emb.inputs)


def test_element_sizes(tmp_path) -> None:
    trace = build(tmp_path, small(get_card("megatron-22b")), element_bytes=4)
    cats = {}
    for t in trace.tensors.values():
        cats.setdefault(t.category, set()).add(t.each_byte)
    assert cats["mask"] == {1} and cats["indices"] == {8} and cats["weight"] == {4}
    assert math.isclose(sum(op.duration_s for op in trace.ops), 0.0)
    assert trace.info["device"] == "synthetic" and trace.info["model_card"] == "megatron-22b"


def test_tensor_parallel_shards_the_fp32_moments_of_16_bit_weights(tmp_path) -> None:
    from triosim.graph.tensor.megatron import plan_tensor_parallel

    trace = build(tmp_path, small(get_card("llama3-8b")))  # bf16 weights, fp32 Adam moments
    plan = plan_tensor_parallel(trace, 2)
    params = set(trace.parameters)
    weights = [k for k in plan.shard_divisor if k in params]
    moments = [k for k in plan.shard_divisor if trace.tensors[k].category == "input"]
    assert weights and sum(trace.tensors[k].numel for k in moments) == 2 * sum(trace.tensors[k].numel for k in weights)
    assert {trace.tensors[k].each_byte for k in moments} == {4} and {trace.tensors[k].each_byte for k in weights} == {2}
