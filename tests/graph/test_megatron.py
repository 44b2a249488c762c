"""Megatron tensor-parallel plans: block detection, Megatron's closed forms on the GPT sample and
on synthetic transformers (hypothesis, each property with a planted bug), per-op fallback and
the per-op style being today's case 3."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triosim.graph.megatron as mg
import triosim.graph.tensor_parallel as tp
from triosim.errors import ConfigError
from triosim.synthetic import SyntheticModel, write_synthetic_trace
from triosim.synthetic_transformer import SyntheticTransformer, write_synthetic_transformer
from triosim.trace import Trace, load_trace

SAMPLES = Path(__file__).resolve().parents[2] / "sample_trace"
MiB = 1 << 20


@pytest.fixture(scope="module")
def gpt() -> Trace:
    return load_trace(SAMPLES / "gpt-cpu-bs8", batch_size=8)


@pytest.fixture(scope="module")
def resnet() -> Trace:
    return load_trace(SAMPLES / "resnet18-cpu-bs16", batch_size=16)


def load_transformer(model: SyntheticTransformer) -> Trace:
    with tempfile.TemporaryDirectory() as tmp:
        return load_trace(write_synthetic_transformer(tmp, model), batch_size=model.batch_size)


# ----------------------------------------------------------------------------- the GPT sample


def test_gpt_sample_blocks(gpt):
    plan = mg.plan_tensor_parallel(gpt, 4)
    assert plan.style == "megatron" and plan.fallback_reason is None
    assert [b.kind for b in plan.blocks] == ["attention", "mlp"] * 4
    assert plan.heads == 4
    names = {gpt.ops[j].name for b in plan.blocks for j in b.middle}
    assert names == {"aten::scaled_dot_product_attention", "aten::gelu"}
    assert all(len(b.column) == 3 for b in plan.blocks if b.kind == "attention")  # separate Q, K, V
    assert plan.summary() == "megatron tensor parallel: 8 blocks (4 attention, 4 mlp), 4 attention heads"


def test_gpt_sample_megatron_closed_form(gpt):
    """4 layers × 2 blocks × (1 forward + 1 backward) all-reduce of b·s·h·4 bytes = 8·128·256·4."""
    b, s, h, layers, t = 8, 128, 256, 4, 4
    plan = mg.plan_tensor_parallel(gpt, t)
    assert Counter(c.kind for c in plan.collectives) == {"all_reduce": 4 * layers}
    assert {c.nbytes for c in plan.collectives} == {b * s * h * 4}
    total = sum(c.nbytes for c in plan.collectives)
    assert total == 16 * MiB
    # A ring all-reduce sends 2(T-1)/T of its payload from each GPU: 24 MiB per GPU.
    assert total * 2 * (t - 1) / t == 24 * MiB
    ops = [c.op for c in plan.collectives]
    assert ops == sorted(ops), "collectives must be in trace order"
    fwd = [c for c in plan.collectives if gpt.ops[c.op].stage == "forward"]
    assert [c.op for c in fwd] == [blk.row for blk in plan.blocks]


def test_gpt_sample_sequence_parallel_closed_form(gpt):
    """Each all-reduce becomes a reduce-scatter + an all-gather of the same payload."""
    plan = mg.plan_tensor_parallel(gpt, 4, sequence_parallel=True)
    assert Counter(c.kind for c in plan.collectives) == {"all_gather": 16, "reduce_scatter": 16}
    assert {c.nbytes for c in plan.collectives} == {MiB}
    plain = mg.plan_tensor_parallel(gpt, 4)
    by_kind = Counter()
    for c in plan.collectives:
        by_kind[c.kind] += c.nbytes
    assert by_kind["all_gather"] == by_kind["reduce_scatter"] == sum(c.nbytes for c in plain.collectives)
    # LayerNorms and residual adds between blocks now run at 1/T, the ones outside the stack do not.
    ln = [op.index for op in gpt.ops if op.name == "aten::layer_norm"]
    assert [plan.time_scale[i] for i in ln] == [1.0] + [0.25] * 7 + [1.0]
    assert [plain.time_scale[i] for i in ln] == [1.0] * 9


def test_gpt_sample_time_and_shards(gpt):
    plan = mg.plan_tensor_parallel(gpt, 4)
    split = {j for b in plan.blocks for j in (*b.forward, *b.backward)}
    for op in gpt.ops:
        want = 0.25 if op.index in split else 1.0
        if op.stage == "optimizer":
            assert 0.25 < plan.time_scale[op.index] < 1.0
        else:
            assert plan.time_scale[op.index] == want, op.name
    # Per layer the sharded parameters are the Q/K/V weights and biases, the output projection's
    # weight, fc1's weight and bias and fc2's weight: 4h² + 3h + 2hf + f elements.
    h, f = 256, 1024
    sharded_params = [p for p in gpt.parameters if p in plan.shard_divisor]
    assert sum(gpt.bytes_of(p) for p in sharded_params) == 4 * 4 * (4 * h * h + 3 * h + 2 * h * f + f)
    assert set(plan.shard_divisor.values()) == {4}


def test_gpt_sample_heads_refuse_degree(gpt):
    with pytest.raises(ConfigError, match="--tp 3 does not divide the 4 attention heads"):
        mg.plan_tensor_parallel(gpt, 3)
    assert mg.plan_tensor_parallel(gpt, 3, style="per-op").style == "per-op"


def test_degree_one_is_the_trace(gpt):
    plan = mg.plan_tensor_parallel(gpt, 1)
    assert plan.collectives == () and plan.shard_divisor == {}
    assert set(plan.time_scale) == {1.0}


def test_cnn_falls_back_to_per_op(resnet):
    plan = mg.plan_tensor_parallel(resnet, 4)
    assert plan.style == "per-op" and plan.blocks == ()
    assert "not a transformer trace" in plan.fallback_reason
    assert plan.summary().startswith("per-op tensor parallel (")
    with pytest.raises(ConfigError, match="--sequence-parallel"):
        mg.plan_tensor_parallel(resnet, 4, sequence_parallel=True)


@pytest.mark.parametrize("sample", ["gpt", "resnet"])
@pytest.mark.parametrize("compat", [False, True])
def test_per_op_style_is_case_3(sample, compat, request):
    trace = request.getfixturevalue(sample)
    for n in (1, 3, 4):
        plan = mg.plan_tensor_parallel(trace, n, style="per-op", reference_compat=compat)
        assert list(plan.collectives) == tp.tp_collectives(trace, n, compat)
        assert set(plan.shard_divisor) == (tp.sharded_buffers(trace) if n > 1 else set())
        for op in trace.ops:
            assert plan.op_time(op.index, op.duration_s) == tp.op_time(trace, op.index, n)


def test_bad_style_and_degree(gpt):
    with pytest.raises(ConfigError, match="--tp-style"):
        mg.plan_tensor_parallel(gpt, 2, style="columns")
    with pytest.raises(ConfigError, match="--tp must be"):
        mg.plan_tensor_parallel(gpt, 0)


# ----------------------------------------------------------------------------- properties


@st.composite
def transformer_cases(draw):
    heads = draw(st.sampled_from([1, 2, 4]))
    model = SyntheticTransformer(
        layers=draw(st.integers(1, 3)),
        batch_size=draw(st.sampled_from([1, 2])),
        seq_len=draw(st.sampled_from([4, 8])),
        hidden=heads * draw(st.sampled_from([2, 4])),
        heads=heads,
        ffn_mult=draw(st.sampled_from([2, 4])),
        fused_qkv=draw(st.booleans()),
        foreach_optimizer=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
    )
    degree = draw(st.sampled_from([d for d in (1, 2, 4) if heads % d == 0]))
    return model, degree, draw(st.booleans())


def check_megatron_plan(model: SyntheticTransformer, degree: int, sp: bool) -> None:
    trace = load_transformer(model)
    plan = mg.plan_tensor_parallel(trace, degree, sequence_parallel=sp)
    assert plan.style == "megatron"
    assert [b.kind for b in plan.blocks] == ["attention", "mlp"] * model.layers
    assert plan.heads == model.heads
    assert all(0.0 < s <= 1.0 for s in plan.time_scale), "time scale outside (0, 1]"
    split = {j for b in plan.blocks for j in (*b.forward, *b.backward)}
    assert all(plan.time_scale[j] == 1.0 / degree for j in split)
    # Megatron's closed form: per block one forward and one backward collective of b·s·h·4 bytes
    # (with sequence parallelism a reduce-scatter and an all-gather of that payload each way).
    act = model.batch_size * model.seq_len * model.hidden * 4
    per_block = 0 if degree == 1 else (4 if sp else 2)
    assert len(plan.collectives) == per_block * len(plan.blocks)
    assert all(c.nbytes == act and c.buffers for c in plan.collectives), "bytes per block off the closed form"
    kinds = Counter(c.kind for c in plan.collectives)
    if degree > 1:
        assert kinds == ({"all_gather": 2 * len(plan.blocks), "reduce_scatter": 2 * len(plan.blocks)} if sp
                         else {"all_reduce": 2 * len(plan.blocks)})
    assert [c.op for c in plan.collectives] == sorted(c.op for c in plan.collectives)
    # Sharded weights: 4h² + 3h + 2hf + f elements per layer, nothing when degree is 1.
    h, f = model.hidden, model.hidden * model.ffn_mult
    sharded = sum(trace.bytes_of(p) for p in trace.parameters if p in plan.shard_divisor)
    assert sharded == (0 if degree == 1 else model.layers * 4 * (4 * h * h + 3 * h + 2 * h * f + f))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transformer_cases())
def test_megatron_plan_properties(case):
    check_megatron_plan(*case)


PLANTED = (SyntheticTransformer(layers=2, hidden=16, heads=4, seq_len=4), 2, False)


def test_planted_model_passes():
    check_megatron_plan(*PLANTED)


def test_catches_unsummed_input_gradient(monkeypatch):
    """Bug: the backward run stops before the Q/K/V gradient sum, so two partial gradients
    (twice the bytes) are all-reduced."""
    real = mg._backward_run

    def buggy(trace, fwd):
        run = real(trace, fwd)
        return run[:-1] if run and trace.forward_partner[run[-1]] is None else run

    monkeypatch.setattr(mg, "_backward_run", buggy)
    with pytest.raises(AssertionError, match="closed form"):
        check_megatron_plan(*PLANTED)


def test_catches_inverted_optimizer_scale(monkeypatch):
    """Bug: optimizer time scaled by total/kept instead of kept/total (more than the trace)."""
    real = mg._optimizer_scale
    monkeypatch.setattr(mg, "_optimizer_scale", lambda trace, shards, t: 1.0 / real(trace, shards, t))
    with pytest.raises(AssertionError, match=r"\(0, 1\]"):
        check_megatron_plan(*PLANTED)


def check_cnn_fallback(model: SyntheticModel, degree: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trace = load_trace(write_synthetic_trace(tmp, model), batch_size=model.batch_size)
    plan = mg.plan_tensor_parallel(trace, degree)
    assert plan.style == "per-op" and plan.fallback_reason, "a trace without attention must fall back"
    assert list(plan.collectives) == tp.tp_collectives(trace, degree)
    assert all(0.0 < s <= 1.0 for s in plan.time_scale)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 5), st.integers(0, 1000), st.sampled_from([0.0, 0.5, 1.0]), st.integers(1, 4))
def test_fallback_on_layer_chains(layers, seed, frac, degree):
    check_cnn_fallback(SyntheticModel(layers=layers, seed=seed, tp_fraction=frac), degree)


def test_catches_mlp_pairs_taken_for_attention(monkeypatch):
    """Bug: any linear pair is taken for a transformer, so a chain of linears gets a megatron plan."""
    monkeypatch.setattr(mg, "_fallback_reason", lambda blocks: None if blocks else "no blocks")
    with pytest.raises(AssertionError, match="fall back"):
        check_cnn_fallback(SyntheticModel(layers=4, seed=3), 2)
