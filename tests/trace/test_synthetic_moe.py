"""The MoE layer of a card trace: its ops, their FLOPs in closed form, and what the
tensor-parallel plan and the layer finder see in it."""

from __future__ import annotations

from dataclasses import replace

from triosim.compute.op_cost import trace_op_costs
from triosim.graph.tensor.megatron import find_blocks
from triosim.trace.card_variants import MoeSpec
from triosim.trace.layers import find_layers
from triosim.trace.load import load_trace
from triosim.trace.model_card import get_card
from triosim.trace.synthetic_card import CardTraceSpec, write_card_trace

B, S, H, E, K, F = 2, 32, 64, 8, 2, 48


def moe_card(**moe):
    card = get_card("qwen3-30b-a3b")
    spec = MoeSpec(experts=E, top_k=K, expert_ffn=F, **moe)
    return replace(card, layers=2, hidden=H, heads=4, kv_heads=2, head_dim_given=32, ffn=176, vocab=100,
                   seq_len=S, moe=spec)


def build(tmp_path, card, layers=2):
    d = write_card_trace(tmp_path / "t", CardTraceSpec(card, B, 2, layers))
    return load_trace(d, batch_size=B)


def test_grouped_gemm_flops_are_those_of_tokens_times_k_rows(tmp_path) -> None:
    """fc1: 2·(T·k)·h·2f, fc2: 2·(T·k)·f·h; backward twice each (data and weight gradients).
    Planted bug caught: rows T·E instead of T·k (×4 here), or fc1 at f wide instead of 2f."""
    trace = build(tmp_path, moe_card())
    costs = trace_op_costs(trace)
    grouped = [(op.name, c.flops) for op, c in zip(trace.ops, costs) if "rouped" in op.name]
    rows = B * S * K
    fwd = [f for n, f in grouped if "evaluate_function" not in n]
    bwd = [f for n, f in grouped if "evaluate_function" in n]
    assert fwd == [2 * rows * H * 2 * F, 2 * rows * F * H] * 2
    assert bwd == [4 * rows * F * H, 4 * rows * H * 2 * F] * 2
    assert all(c.known for c in costs)


def test_moe_layer_repeats_and_has_no_tensor_parallel_mlp_block(tmp_path) -> None:
    """The experts are no column/row block (expert tensor parallelism is not the dense TP); a
    shared expert is an ordinary MLP block."""
    trace = build(tmp_path, moe_card())
    assert [b.kind for b in find_blocks(trace)] == ["attention"] * 2
    assert find_layers(trace).count == 2
    shared = build(tmp_path / "shared", moe_card(shared_experts=1, shared_ffn=F))
    assert [b.kind for b in find_blocks(shared)] == ["attention", "mlp"] * 2


def test_sliding_window_layers_cost_the_window(tmp_path) -> None:
    """GPT-OSS: the sliding layers' attention sees 128 keys per query, the full ones every key
    before it (the causal mask: half the square)."""
    card = replace(get_card("gpt-oss-120b"), layers=2, hidden=64, heads=4, kv_heads=2, head_dim_given=16,
                   vocab=100, seq_len=512, moe=MoeSpec(E, K, F))
    trace = build(tmp_path, card)
    costs = trace_op_costs(trace)
    attn = [c.flops for op, c in zip(trace.ops, costs) if op.name.endswith("flash_attention")]
    assert attn == [4 * B * 4 * 512 * 16 * 128, 4 * B * 4 * 512 * 16 * 512 / 2]


def test_router_weights_are_applied_in_the_activation_and_the_expert_output_is_not_kept(tmp_path) -> None:
    """Megatron-Core's memory-efficient permutation: the permutation carries the router weights
    (T·k fp32 values), the activation multiplies them in, and the un-permutation only sums, so the
    last reader of the experts' output (fc2's) is the forward un-permutation: nothing in the
    backward keeps it. The weights' gradient comes from the activation's backward and goes to
    the router through the permutation's. Planted bug caught: the un-permutation's backward
    reading fc2's output (the weights applied there, as before), which keeps T·k·h per layer."""
    for activation in ("swiglu", "gelu"):
        trace = build(tmp_path / activation, replace(moe_card(), activation=activation))
        names = [op.name.split(": ")[-1].split("::")[-1] for op in trace.ops]
        permute = names.index("permute")
        probs = trace.ops[permute].outputs[1]
        assert trace.bytes_of(probs) == B * S * K * 4
        readers = {names[c] for c in trace.consumers[probs]}
        assert readers == ({"WeightedSwiGLUFunction", "WeightedSwiGLUFunctionBackward"} if activation == "swiglu"
                           else {"mul", "MulBackward0"})
        fc2 = [i for i, n in enumerate(names) if n == "_grouped_mm"][1]
        out = trace.ops[fc2].outputs[0]
        assert [names[c] for c in trace.consumers[out]] == ["unpermute"]
        unpermute_bwd = names.index("MoeUnpermuteBackward0")
        assert all(trace.producer.get(k) is None or trace.ops[trace.producer[k]].stage == "backward"
                   or names[trace.producer[k]] == "topk" for k in trace.ops[unpermute_bwd].inputs)
        topk_bwd = names.index("TopkBackward0")
        assert names[trace.producer[trace.ops[topk_bwd].inputs[0]]] == "MoePermuteBackward0"
