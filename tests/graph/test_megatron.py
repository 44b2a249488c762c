"""Megatron tensor-parallel plans: block detection, Megatron's closed forms on the GPT sample and
on synthetic transformers (hypothesis, each property with a planted bug), per-op fallback, the
per-op style being today's case 3, and the task DAG built from a plan."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triosim.graph.tensor.megatron as mg
import triosim.graph.tensor.per_op as tp
import triosim.graph.tensor.vocab as vocab
from triosim import build_platform
from triosim.errors import ConfigError
from triosim.graph import build_graph
from triosim.graph.strategy import Strategy
from triosim.report.result import summarize
from triosim.schedule.list_scheduler import schedule
from triosim.schedule.validate import schedule_violations
from triosim.trace import Trace, load_trace
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace
from triosim.trace.synthetic_transformer import (
    SyntheticTransformer,
    write_synthetic_transformer,
)

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
    assert plan.summary() == ("megatron tensor parallel: 8 blocks (4 attention, 4 mlp), 4 attention heads, "
                              "vocabulary-parallel head (4096 words)")


def test_gpt_sample_megatron_closed_form(gpt):
    """4 layers × 2 blocks × (1 forward + 1 backward) all-reduce of b·s·h·4 bytes = 8·128·256·4;
    the vocabulary-parallel embedding's output and the head's input gradient, b·s·h·4 bytes each;
    the cross-entropy's three all-reduces of one fp32 per token (max, then target logit and sum)."""
    b, s, h, layers, t = 8, 128, 256, 4, 4
    plan = mg.plan_tensor_parallel(gpt, t)
    assert Counter(c.kind for c in plan.collectives) == {"all_reduce": 4 * layers + 4}
    blocks = [c for c in plan.collectives if c.op not in (1, 53, 54, 58)]
    assert {c.nbytes for c in blocks} == {b * s * h * 4} and len(blocks) == 4 * layers
    vocab = {c.op: (c.nbytes, c.calls) for c in plan.collectives if c.op in (1, 53, 54, 58)}
    assert vocab == {1: (MiB, 1), 53: (b * s * 4, 1), 54: (b * s * 4, 2), 58: (MiB, 1)}
    total = sum(c.nbytes * c.calls for c in plan.collectives)
    assert total == 18 * MiB + 3 * 4096
    # A ring all-reduce sends 2(T-1)/T of its payload from each GPU.
    assert total * 2 * (t - 1) / t == 27 * MiB + 18432
    ops = [c.op for c in plan.collectives]
    assert ops == sorted(ops), "collectives must be in trace order"
    fwd = [c for c in plan.collectives if gpt.ops[c.op].stage == "forward"]
    # the embedding's all-reduce, one per block's row linear, the max logit after the head and
    # the target-logit and sum-of-exponentials calls after the loss
    assert [c.op for c in fwd] == [1, *(blk.row for blk in plan.blocks), 53, 54]


def test_gpt_sample_sequence_parallel_closed_form(gpt):
    """Each all-reduce becomes a reduce-scatter + an all-gather of the same payload."""
    plan = mg.plan_tensor_parallel(gpt, 4, sequence_parallel=True)
    # + the backward re-gather of each block's input (8), the head's input gathered (1), the
    # embedding's output and the head's input gradient reduce-scattered (2); the cross-entropy's
    # all-reduces stay
    assert Counter(c.kind for c in plan.collectives) == {"all_gather": 16 + 8 + 1, "reduce_scatter": 16 + 2,
                                                         "all_reduce": 2}
    assert {c.nbytes for c in plan.collectives if c.kind != "all_reduce"} == {MiB}
    plain = mg.plan_tensor_parallel(gpt, 4)
    by_kind = Counter()
    for c in plan.collectives:
        by_kind[c.kind] += c.nbytes * c.calls
    big = sum(c.nbytes for c in plain.collectives if c.nbytes == MiB)
    assert by_kind["reduce_scatter"] == big and by_kind["all_gather"] == big + 7 * MiB  # 16 + 8 + 1 vs 16 + 2
    # Every LayerNorm and residual add from the embedding to the head runs at 1/T under sequence
    # parallelism (the whole residual stream is sequence-sharded), none without it.
    ln = [op.index for op in gpt.ops if op.name == "aten::layer_norm"]
    assert [plan.time_scale[i] for i in ln] == [0.25] * 9
    assert [plain.time_scale[i] for i in ln] == [1.0] * 9


def test_gpt_sample_time_and_shards(gpt):
    plan = mg.plan_tensor_parallel(gpt, 4)
    split = {j for b in plan.blocks for j in (*b.forward, *b.backward)} | set(plan.vocab.split_ops)
    assert plan.vocab.split_ops == (53, 54, 56, 57, 58)  # head, cross-entropy, their backward
    for op in gpt.ops:
        want = 0.25 if op.index in split else 1.0
        if op.stage == "optimizer":
            assert 0.25 < plan.time_scale[op.index] < 1.0
        else:
            assert plan.time_scale[op.index] == want, op.name
    # Per layer the sharded parameters are the Q/K/V weights and biases, the output projection's
    # weight, fc1's weight and bias and fc2's weight: 4h² + 3h + 2hf + f elements; and the word
    # embedding and the head, V·h each (the position embedding is not split).
    h, f, v = 256, 1024, 4096
    sharded_params = [p for p in gpt.parameters if p in plan.shard_divisor]
    assert sum(gpt.bytes_of(p) for p in sharded_params) == 4 * (4 * (4 * h * h + 3 * h + 2 * h * f + f) + 2 * v * h)
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
    split = {j for b in plan.blocks for j in (*b.forward, *b.backward)} | set(plan.vocab.split_ops)
    assert all(plan.time_scale[j] == 1.0 / degree for j in split), "an op of a block or of the head not at 1/T"
    # The head's forward and backward FLOPs split by T: its ops take exactly 1/T of the traced time.
    head = [plan.vocab.head, *(i for i in plan.vocab.backward if trace.forward_partner[i] == plan.vocab.head)]
    assert len(head) == 2 and all(plan.op_time(i, trace.ops[i].duration_s) == trace.ops[i].duration_s / degree
                                  for i in head), "head FLOPs not split by T"
    # Megatron's closed form: per block one forward and one backward collective of b·s·h·4 bytes
    # (with sequence parallelism a reduce-scatter and an all-gather of that payload each way, and
    # the block input gathered again for the weight gradients); the embedding's output and the
    # head's input gradient (with sequence parallelism also the head's input), b·s·h·4 bytes; the
    # cross-entropy's max, target-logit and sum all-reduces of b·s fp32 values.
    act = model.batch_size * model.seq_len * model.hidden * 4
    tokens = model.batch_size * model.seq_len
    per_block, vocab = (0, 0) if degree == 1 else ((5, 3) if sp else (2, 2))
    small = [c for c in plan.collectives if c.kind == "all_reduce" and c.nbytes == tokens * 4]
    big = [c for c in plan.collectives if c not in small]
    assert len(big) == per_block * len(plan.blocks) + vocab, "collective count off the closed form"
    assert all(c.nbytes == act and c.buffers for c in big), "bytes per block off the closed form"
    assert [(c.op, c.calls) for c in small] == ([] if degree == 1 else
                                                 [(plan.vocab.head, 1), (plan.vocab.loss[0], 2)])
    kinds = Counter(c.kind for c in big)
    if degree > 1:
        n = len(plan.blocks)
        assert kinds == ({"all_gather": 3 * n + 1, "reduce_scatter": 2 * n + 2} if sp
                         else {"all_reduce": 2 * n + 2})
    if sp and degree > 1:
        # the backward re-gather: one all-gather of each block's input inside its backward, before
        # the first op that reads it (the column linears' weight gradients)
        for b in plan.blocks:
            regather = [c for c in big if c.kind == "all_gather" and c.op in b.backward]
            first_reader = next(i for i in b.backward if b.input in trace.reads[i])
            assert [(c.buffers, c.op < first_reader) for c in regather] == [((b.input,), True)], \
                "no backward re-gather of the block input"
    assert [c.op for c in plan.collectives] == sorted(c.op for c in plan.collectives)
    # Sharded weights: 4h² + 3h + 2hf + f elements per layer, the embedding and the head V·h each,
    # nothing when degree is 1.
    h, f, v = model.hidden, model.hidden * model.ffn_mult, model.vocab
    sharded = sum(trace.bytes_of(p) for p in trace.parameters if p in plan.shard_divisor)
    assert sharded == (0 if degree == 1 else model.layers * 4 * (4 * h * h + 3 * h + 2 * h * f + f) + 2 * v * h * 4)


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

    def buggy(trace, fwd, paired_with):
        run = real(trace, fwd, paired_with)
        return run[:-1] if run and trace.forward_partner[run[-1]] is None else run

    monkeypatch.setattr(mg, "_backward_run", buggy)
    with pytest.raises(AssertionError, match="closed form"):
        check_megatron_plan(*PLANTED)


def test_catches_head_left_whole(monkeypatch):
    """Bug: the LM head and the loss run whole on every rank (the vocabulary not split)."""
    monkeypatch.setattr(vocab.VocabParallel, "split_ops", property(lambda self: ()))
    with pytest.raises(AssertionError, match="head FLOPs not split by T"):
        check_megatron_plan(*PLANTED)


def test_planted_sp_model_passes():
    check_megatron_plan(PLANTED[0], 2, True)


def test_catches_missing_backward_regather(monkeypatch):
    """Bug: sequence parallelism keeps the gathered block input for backward (no re-gather)."""
    monkeypatch.setattr(mg, "_regather_slot", lambda trace, b, taken: None)
    with pytest.raises(AssertionError, match="closed form"):
        check_megatron_plan(PLANTED[0], 2, True)


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


# ----------------------------------------------------------------------------- the task DAG


def wire_mib_per_gpu(trace: Trace, style: str, sp: bool = False, gpus: int = 4) -> float:
    platform = build_platform(gpus)
    plan = mg.plan_tensor_parallel(trace, gpus, style=style, sequence_parallel=sp)
    graph = tp.build_from_plan(trace, platform, Strategy(case=3, collective_detail="macro"), plan)
    _, per_link = summarize(graph, schedule(graph), platform)
    return sum(k.bytes for k in per_link) / gpus / MiB


def test_gpt_sample_bytes_on_the_wire(gpt):
    """Per GPU on the ring: 24 MiB with Megatron's pairs (with or without sequence parallelism),
    + 3 MiB for the embedding's and the head's b·s·h payloads and 3 × 4 KiB × 3/2 for the
    cross-entropy's; with sequence parallelism 18 MiB reduce-scattered and 25 MiB all-gathered
    (+ 8 backward re-gathers and the head's input), 3/4 of each on the wire; against 107.3 MiB for
    the per-op scheme of case 3."""
    assert wire_mib_per_gpu(gpt, "megatron") == 27.0 + 18432 / MiB
    assert wire_mib_per_gpu(gpt, "megatron", sp=True) == (18 + 25) * 0.75 + 18432 / MiB
    assert wire_mib_per_gpu(gpt, "per-op") == pytest.approx(107.34375)


def test_gpt_sample_summary_in_the_result(gpt):
    plan = mg.plan_tensor_parallel(gpt, 4)
    graph = tp.build_from_plan(gpt, build_platform(4), Strategy(case=3), plan)
    meta = graph.meta["tensor_parallel"]
    assert meta["summary"] == plan.summary() and meta["blocks"] == 8
    assert meta["collectives"] == 16 + 5 and meta["all_reduce_bytes"] == 18 * MiB + 3 * 4096
    # case 3 itself keeps its JSON as it was
    case3 = build_graph(gpt, build_platform(4), Strategy(case=3)).meta["tensor_parallel"]
    assert set(case3) == {"collectives", "all_gather_bytes", "all_reduce_bytes", "sharded_ops"}


def check_megatron_dag(model: SyntheticTransformer, degree: int, sp: bool, detail: str) -> None:
    trace = load_transformer(model)
    plan = mg.plan_tensor_parallel(trace, degree, sequence_parallel=sp)
    graph = tp.build_from_plan(trace, build_platform(degree), Strategy(case=3, collective_detail=detail), plan)
    assert nx.is_directed_acyclic_graph(graph.to_networkx()), "the task graph has a cycle"
    sch = schedule(graph)
    assert schedule_violations(graph, sch) == []
    runs: dict[tuple[int, int], list[int]] = {}
    for t, kind in enumerate(graph.kind):
        if kind == "compute":
            runs.setdefault((graph.attrs[t]["op"], graph.devices[t][0]), []).append(t)
    assert set(runs) == {(op.index, g) for op in trace.ops for g in range(degree)}
    for (i, _), ts in runs.items():
        assert len(ts) == 1, "an op runs twice on one GPU"
        assert graph.duration[ts[0]] == plan.op_time(i, trace.ops[i].duration_s), "wrong op time"
    # Bytes each collective moves: its payload (macro), or every ring step's (expanded).
    steps = {"all_reduce": 2 * (degree - 1), "all_gather": degree - 1, "reduce_scatter": degree - 1}
    moved: Counter = Counter()
    for t, kind in enumerate(graph.kind):
        if kind in ("transfer", "collective"):
            moved[graph.attrs[t]["op"]] += graph.nbytes[t]
    want: Counter = Counter()
    for c in plan.collectives:
        want[c.op] += c.nbytes * c.calls * (steps[c.kind] if detail == "expanded" else 1)
    assert moved == want, "collective bytes differ from the plan"
    # An op reading a buffer a collective completes starts after that collective on its GPU
    # (until some op writes the buffer again).
    done: dict[tuple[int, int], float] = {}
    for t, kind in enumerate(graph.kind):
        a = graph.attrs[t] or {}
        if kind == "sync" and "collective" in a and len(graph.devices[t]) == 1:
            key = (a["op"], graph.devices[t][0])
            done[key] = max(done.get(key, 0.0), sch.end[t])
    for c in plan.collectives:
        # what the op before the collective writes for later ops: the block's output, its
        # input gradient, or (sequence parallel) the LayerNorm output and residual gradient
        filled = {k for k in trace.writes[c.op] if k not in trace.batch_invariant}
        for op in trace.ops[c.op + 1:]:
            if filled & set(trace.reads[op.index]):
                for g in range(degree):
                    (t,) = runs[(op.index, g)]
                    assert sch.start[t] >= done[(c.op, g)] - 1e-15, "an op ran before its input's collective"
            filled -= set(trace.writes[op.index])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transformer_cases(), st.sampled_from(["expanded", "macro"]))
def test_megatron_dag_properties(case, detail):
    check_megatron_dag(*case, detail)


DAG_PLANTED = (SyntheticTransformer(layers=2, hidden=16, heads=4, seq_len=4), 4, True, "expanded")


def test_dag_planted_model_passes():
    check_megatron_dag(*DAG_PLANTED)


def test_dag_catches_collective_forgetting_its_buffers(monkeypatch):
    real = mg.TpCollective
    monkeypatch.setattr(mg, "TpCollective", lambda op, kind, buffers, nbytes, **kw: real(op, kind, (), nbytes, **kw))
    with pytest.raises(AssertionError, match="before its input's collective"):
        check_megatron_dag(*DAG_PLANTED)


def test_dag_catches_reduce_scatter_built_as_all_reduce(monkeypatch):
    monkeypatch.setattr(tp, "add_reduce_scatter", tp.add_all_reduce)
    with pytest.raises(AssertionError, match="bytes differ"):
        check_megatron_dag(*DAG_PLANTED)


# ----------------------------------------------------------------------------- the command line


def test_run_summary_says_which_scheme(capsys):
    from triosim.cli.console import main

    gpt_dir, resnet_dir = str(SAMPLES / "gpt-cpu-bs8"), str(SAMPLES / "resnet18-cpu-bs16")
    assert main(["run", "--trace-dir", gpt_dir, "--tp", "4", "-GPUnumber", "4"]) == 0
    assert "Tensor parallel: megatron, 8 transformer block(s)" in capsys.readouterr().out
    assert main(["run", "--trace-dir", resnet_dir, "--tp", "4", "-GPUnumber", "4"]) == 0
    assert "Tensor parallel: per-op scheme (no transformer blocks found" in capsys.readouterr().out
    assert main(["run", "--trace-dir", gpt_dir, "--tp", "3", "-GPUnumber", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("triosim: error: --tp 3 does not divide the 4 attention heads")
