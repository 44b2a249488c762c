"""FP8 training (``--dtype fp8``, :mod:`triosim.trace.fp8`) against closed forms: an FP8 linear's
extra cast bytes, its GEMMs at the fp8 peak with attention and the LM head still in bf16, the FP8
weight copy's memory, the FP8 parameter all-gather's bytes, and the recipes each GPU runs. Each
check is shown to catch a planted bug (``*_catches_*``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import triosim.compute.fp8_time as fp8_time_module
import triosim.compute.op_time_source as source_module
import triosim.graph.data.precision as sizing_module
import triosim.trace.fp8 as fp8_module
from triosim.compute.fp8_linears import Fp8Linear, find_fp8_linears
from triosim.compute.fp8_time import fp8_gemm_cost, linear_casts
from triosim.compute.op_cost import OpCost
from triosim.compute.op_kinds import classify
from triosim.compute.roofline import Precision, roofline_seconds
from triosim.config import configure
from triosim.errors import ConfigError
from triosim.graph import composition
from triosim.hardware.device_db import get_device
from triosim.trace.fp8 import Fp8Training
from triosim.trace.precision import elements
from triosim.trace.synthetic_transformer import SyntheticTransformer, write_synthetic_transformer

M, N, K = 4096, 1024, 512
HOPPER = Fp8Training("current", transposed_copy=True)


@pytest.fixture(scope="module")
def layer(tmp_path_factory) -> Path:
    """One decoder layer big enough that its GEMMs are compute-bound on an H100 (hidden 1,024,
    512 tokens), small enough to build in milliseconds."""
    model = SyntheticTransformer(layers=1, batch_size=1, seq_len=512, hidden=1024, heads=8, vocab=256)
    return write_synthetic_transformer(tmp_path_factory.mktemp("fp8") / "layer", model)


def _run(path: Path, **flags):
    return configure(trace_dir=str(path), gpu="h100-sxm", **flags)[0]


def _built(path: Path, **flags) -> dict:
    flags.setdefault("dp", 1)  # a composed (hybrid) run: its memory and collectives per stage
    flags.setdefault("gpu", "h100-sxm")
    trace, platform, strategy = configure(trace_dir=str(path), **flags)
    g = composition.build(trace, platform, strategy)
    return {"trace": trace, "memory": g.meta["hybrid"]["memory"][0], "meta": g.meta["hybrid"]}


def _fc1(trace):
    """The MLP's first linear (the widest FP8 linear) and its forward op."""
    linears = find_fp8_linears(trace)
    i, lin = max(linears.forward.items(), key=lambda kv: kv[1].n)
    return i, lin, linears


# ----------------------------------------------------------------------------- cast bytes, closed form


def test_an_fp8_linears_cast_bytes_are_the_closed_form() -> None:
    """Current scaling on Hopper: an amax pass (2 bytes read per element) and a cast-transpose
    (2 read, 1 + 1 written) per tensor: 6MK for the input, 6MN for the output gradient, 6NK for
    the weight. Delayed scaling has no amax pass (4 per element); Blackwell needs no transpose
    (current: 5); blockwise and MXFP8 write two copies plus E/32 bytes of scales each."""
    lin = Fp8Linear("w", "x", N, K)

    def total(fp8, forward=True):
        c = linear_casts(lin, forward, M, fp8)
        return sum(k.total for k in c.kernels), sum(k.total for k in c.weight)

    assert total(HOPPER) == (6 * M * K, 6 * N * K)
    assert total(HOPPER, forward=False) == (6 * M * N, 0)
    assert total(Fp8Training("delayed")) == (4 * M * K, 4 * N * K)
    assert total(Fp8Training("current", transposed_copy=False)) == (5 * M * K, 5 * N * K)
    assert total(Fp8Training("mxfp8", transposed_copy=False)) == (4 * M * K + 2 * M * K // 32, 4 * N * K + 2 * N * K // 32)
    assert total(Fp8Training("blockwise")) == (4 * M * K + 2 * 4 * M * K // 128, 4 * N * K + 2 * 4 * N * K // 16384)
    # --fp8-param-gather: the weight arrives in FP8; on Hopper only its transpose is made
    assert total(Fp8Training("current", param_gather=True))[1] == 2 * N * K
    assert total(Fp8Training("current", param_gather=True, transposed_copy=False))[1] == 0


def test_cast_bytes_catch_a_missing_transpose(monkeypatch) -> None:
    monkeypatch.setattr(fp8_module, "copies", lambda fp8: 1)  # the bug: Hopper's transposed copy forgotten
    with pytest.raises(AssertionError):
        test_an_fp8_linears_cast_bytes_are_the_closed_form()


def test_a_linear_op_takes_its_fp8_gemm_plus_the_casts_of_those_bytes(layer) -> None:
    """The MLP's first linear (input [512, 1024], weight [4096, 1024]), one micro-batch: its op
    time is its fp8 GEMM plus four memory-bound kernels — the input's amax (2MK read) and
    cast-transpose (2MK read, 2MK written), the weight's (2NK; 2NK, 2NK) — each its own roofline."""
    trace = _run(layer, dtype="fp8")
    device = get_device("h100-sxm")
    i, lin, _ = _fc1(trace)
    m, n, k = 512, lin.n, lin.k
    assert (n, k) == (4096, 1024)

    def kernel(read: int, written: int) -> float:
        return roofline_seconds(OpCost(read, read, written, "fp8_cast", "elementwise", "bf16"), device, Precision())

    casts = kernel(2 * m * k, 0) + kernel(2 * m * k, 2 * m * k) + kernel(2 * n * k, 0) + kernel(2 * n * k, 2 * n * k)
    model = trace.op_time
    assert model.cast_seconds(trace.batch_size)[i] == pytest.approx(casts, rel=1e-12)
    gemm = roofline_seconds(fp8_gemm_cost(model.shapes.costs[i]), device, Precision())
    assert trace.ops[i].duration_s == pytest.approx(gemm + casts, rel=1e-12)


def test_op_casts_catch_a_dropped_amax_pass(monkeypatch, layer) -> None:
    real = fp8_module.amax_bytes
    monkeypatch.setattr(fp8_time_module, "amax_bytes", lambda e, fp8: real(e, replace(fp8, recipe="delayed")))
    with pytest.raises(AssertionError):
        test_a_linear_op_takes_its_fp8_gemm_plus_the_casts_of_those_bytes(layer)


# ----------------------------------------------------------------------------- what runs in fp8


def test_linear_gemms_run_at_the_fp8_peak_and_attention_and_head_stay_bf16(layer) -> None:
    """An FP8 linear's GEMM (compute-bound here) takes F / (fp8 peak × fp8 curve(F)) plus the
    launch floor; the attention core and the LM head take exactly their bf16 time."""
    fp8, bf16 = _run(layer, dtype="fp8"), _run(layer, dtype="bf16")
    device = get_device("h100-sxm")
    i, _, linears = _fc1(fp8)
    flops = fp8.op_time.shapes.costs[i].flops
    gemm = fp8.ops[i].duration_s - fp8.op_time.cast_seconds(fp8.batch_size)[i]
    at_peak = flops / (device.matrix_peak("fp8") * device.compute_curve("fp8").at(flops)) + device.launch_floor_s
    assert gemm == pytest.approx(at_peak, rel=1e-12)
    assert gemm < bf16.ops[i].duration_s  # its bf16 GEMM, on the bf16 peak and curve
    attention = [j for j, op in enumerate(fp8.ops) if classify(op.name, op.stage)[1] == "attention"]
    head = max((j for j, op in enumerate(fp8.ops) if op.name == "aten::linear"), key=lambda j: j)
    assert len(attention) == 2 and head not in linears.forward
    for j in (*attention, head):
        assert fp8.ops[j].duration_s == bf16.ops[j].duration_s


def test_fp8_peak_check_catches_attention_run_in_fp8(monkeypatch, layer) -> None:
    monkeypatch.setattr(source_module, "FP8_BASE_DTYPE", "fp8")  # the old math mode: every matrix op in fp8
    with pytest.raises(AssertionError):
        test_linear_gemms_run_at_the_fp8_peak_and_attention_and_head_stay_bf16(layer)


def test_fp8_peak_check_catches_gemms_left_in_bf16(monkeypatch, layer) -> None:
    monkeypatch.setattr(fp8_time_module, "fp8_gemm_cost", lambda cost: cost)
    with pytest.raises(AssertionError):
        test_linear_gemms_run_at_the_fp8_peak_and_attention_and_head_stay_bf16(layer)


# ----------------------------------------------------------------------------- memory and all-gather


def test_fp8_weight_copies_add_one_byte_per_fp8_linear_parameter_and_usage(layer) -> None:
    """bf16 weights plus their cached FP8 copies: the weights grow by exactly the FP8 linears'
    parameter count per copy — 1 byte each on Blackwell (one layout serves both usages), 2 on
    Hopper (the rowwise copy and its transpose). With --fp8-param-gather the FP8 parameter and its
    transpose replace the bf16 weight. Inputs only FP8 linears read are saved in FP8; the
    attention output keeps its bf16 tensor beside its FP8 copy."""
    bf16, fp8 = _built(layer, dtype="bf16"), _built(layer, dtype="fp8")
    blackwell = {d: _built(layer, gpu="b200", dtype=d, fp8_recipe="current" if d == "fp8" else "auto")
                 for d in ("bf16", "fp8")}
    gather = _built(layer, dtype="fp8", fp8_param_gather=True, dp=2, zero=1)
    trace = fp8["trace"]
    linears = find_fp8_linears(trace)
    fp8_params = sum(elements(trace.tensors[w]) for w in linears.weights)
    all_params = sum(elements(trace.tensors[p]) for p in trace.parameters)
    assert fp8_params > 0.85 * all_params and len(linears.weights) == 6  # q, k, v, out, fc1, fc2
    assert blackwell["fp8"]["memory"]["weights_bytes"] - blackwell["bf16"]["memory"]["weights_bytes"] == fp8_params
    assert fp8["memory"]["weights_bytes"] - bf16["memory"]["weights_bytes"] == 2 * fp8_params
    assert gather["memory"]["weights_bytes"] == bf16["memory"]["weights_bytes"]  # FP8 + transpose: 2 bytes
    shared = {x: any(c not in {*linears.forward, *linears.backward} for c in trace.consumers[x]) for x in linears.inputs}
    assert sorted(shared.values()) == [False, False, False, True]  # LN1, LN2, GELU outputs; attention output
    bf16_trace = bf16["trace"]
    for x, also_bf16 in shared.items():
        assert trace.tensors[x].bytes == bf16_trace.tensors[x].bytes // 2 * (3 if also_bf16 else 1)


def test_weight_memory_catches_a_missing_fp8_copy(monkeypatch, layer) -> None:
    monkeypatch.setattr(sizing_module, "weight_copy_bytes", lambda n, fp8: 0)
    with pytest.raises(AssertionError):
        test_fp8_weight_copies_add_one_byte_per_fp8_linear_parameter_and_usage(layer)


def test_fp8_param_gather_halves_the_fp8_weights_all_gather(layer) -> None:
    """ZeRO-1 all-gathers every parameter once after the step, ZeRO-3 before each forward and
    backward pass: with --fp8-param-gather the FP8 linears' weights move 1 byte, not 2."""
    for zero, gathers in ((1, 1), (3, 2)):
        flags = {"dtype": "fp8", "dp": 2, "zero": zero}
        plain = _built(layer, **flags)
        fp8 = _built(layer, fp8_param_gather=True, **flags)
        trace = fp8["trace"]
        fp8_params = sum(elements(trace.tensors[w]) for w in find_fp8_linears(trace).weights)
        saved = plain["meta"]["collectives_dp0_tp0"]["dp"]["payload_bytes"] - fp8["meta"]["collectives_dp0_tp0"]["dp"]["payload_bytes"]
        assert saved == gathers * fp8_params  # 2 bytes per parameter before, 1 after


def test_param_gather_check_catches_gathering_bf16(monkeypatch, layer) -> None:
    monkeypatch.setattr(sizing_module, "gathered_bytes_per_element", lambda fp8, training: training)
    with pytest.raises(AssertionError):
        test_fp8_param_gather_halves_the_fp8_weights_all_gather(layer)


# ----------------------------------------------------------------------------- recipes and refusals


def test_the_default_recipe_follows_the_gpu(layer) -> None:
    assert _run(layer, dtype="fp8").precision.fp8 == Fp8Training("current", False, True, 1.0)
    blackwell = configure(trace_dir=str(layer), gpu="b200", dtype="fp8")[0].precision.fp8
    assert (blackwell.recipe, blackwell.transposed_copy) == ("mxfp8", False)
    # ZeRO-1 with 4 micro-batches: each pays a quarter of the weights' cast; ZeRO-3 all of it
    assert _run(layer, dtype="fp8", dp=1, global_batch=4, micro_batch_size=1, zero=1).precision.fp8.weight_cast_share == 0.25


@pytest.mark.parametrize("flags,message", [
    ({"dtype": "fp8", "fp8_recipe": "mxfp8"}, "--fp8-recipe mxfp8: H100-SXM (h100-sxm) runs delayed, current, blockwise"),
    ({"dtype": "bf16", "fp8_recipe": "current"}, "--fp8-recipe needs --dtype fp8"),
    ({"dtype": "fp8", "fp8_param_gather": True}, "--fp8-param-gather needs the distributed optimizer or FSDP"),
    ({"dtype": "fp8", "op_time_source": "trace"}, "--dtype fp8 trains in FP8"),
    # Megatron-Core (TransformerConfig): "Delayed scaling does not support moe_act and layernorm recompute for fp8"
    ({"dtype": "fp8", "fp8_recipe": "delayed", "dp": 1, "recompute_modules": "core_attn,layernorm"},
     "--recompute-modules layernorm with --fp8-recipe delayed"),
])
def test_refusals_name_the_flag(layer, flags, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _run(layer, **flags)


def test_the_breakdown_shows_the_casts_beside_the_gemms(layer, tmp_path) -> None:
    from triosim import simulate

    kinds = {}
    for dtype in ("bf16", "fp8"):
        result = simulate(*configure(trace_dir=str(layer), gpu="h100-sxm", dtype=dtype, dp=2))
        block = result.time_breakdown()
        kinds[dtype] = block["compute_by_kind"]
        compute = sum(block["mean"][f"{p}_ms"] for p in ("forward", "backward", "recompute", "optimizer"))
        assert sum(kinds[dtype].values()) == pytest.approx(compute, abs=1e-8)  # each rounded to 1e-9 ms
        assert result.graph.meta["precision"].get("fp8", {}).get("recipe") == ("current" if dtype == "fp8" else None)
    assert kinds["bf16"]["fp8_casts_ms"] == 0 < kinds["fp8"]["fp8_casts_ms"]
    assert kinds["fp8"]["gemm_ms"] < kinds["bf16"]["gemm_ms"]
    assert kinds["fp8"]["attention_ms"] == pytest.approx(kinds["bf16"]["attention_ms"], rel=1e-9)


def test_an_moe_router_is_no_fp8_linear(tmp_path) -> None:
    """Megatron-Core's router is a PyTorch product (``router_gating_linear``), not a Transformer
    Engine module: of an MoE layer's linears, the router (its scores go to the top-k) stays in
    bf16, the experts' grouped GEMMs and the attention linears run in FP8. Its input, the norm
    output the permutation also reads, then keeps no FP8 copy. Planted bug caught: the router
    counted as an FP8 linear (its input sized bf16 plus an FP8 copy)."""
    from dataclasses import replace as with_

    from triosim.compute.op_kinds import base_name
    from triosim.trace.card_variants import MoeSpec
    from triosim.trace.load import load_trace
    from triosim.trace.model_card import get_card
    from triosim.trace.synthetic_card import CardTraceSpec, write_card_trace
    card = with_(get_card("qwen3-30b-a3b"), layers=1, hidden=64, heads=4, kv_heads=2, head_dim_given=16, ffn=128,
                 vocab=100, seq_len=32, moe=MoeSpec(experts=8, top_k=2, expert_ffn=48))
    trace = load_trace(write_card_trace(tmp_path / "moe", CardTraceSpec(card, 2, 2, 1)), batch_size=2)
    names = [base_name(op.name) for op in trace.ops]
    router = next(i for i, n in enumerate(names) if n == "linear" and any(
        names[c] == "_softmax" for k in trace.writes[i] for c in trace.consumers.get(k, ())))
    linears = find_fp8_linears(trace)
    assert router not in linears.forward
    assert {names[i] for i in linears.forward} == {"linear", "_grouped_mm"}
    assert sum(names[i] == "_grouped_mm" for i in linears.forward) == 2
    assert trace.ops[router].inputs[0] not in linears.inputs
