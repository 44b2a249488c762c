"""Fused attention's cost: the causal mask's counted FLOPs and the measured attention curves.

Closed forms: a causal op counts half the full mask's 4·b·h·s²·d (2.5× backward), a sliding
window's keys are already the window (no halving); on a device with a measured attention curve
the op's compute time is its counted FLOPs over (bf16 peak × the curve at its keys per query),
which gives back the measured H200 cuDNN kernels; without one, a causal op is charged its full mask
at the GEMM curve (what runs charged before the curves existed).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from triosim.compute.op_cost import op_cost
from triosim.compute.roofline import Precision, roofline_seconds
from triosim.errors import ConfigError
from triosim.hardware.device_db import get_device, parse_device
from triosim.trace import Op, Tensor

DATA = Path(__file__).resolve().parents[2] / "bench" / "data" / "h200-curves.json"
BF16 = Precision("bf16")


def _t(tid: str, shape: tuple[int, ...], category: str = "output") -> Tensor:
    n = 1
    for d in shape:
        n *= d
    return Tensor(tid, 2 * n, n, 2, category, "", shape)


def _attention(b: int, h: int, s: int, d: int, keys: int | None = None, causal: bool = False, backward: bool = False):
    q, k, v = _t("q", (b, h, s, d)), _t("k", (b, h, keys or s, d)), _t("v", (b, h, keys or s, d))
    o, lse = _t("o", (b, h, s, d)), Tensor("lse", 4 * b * h * s, b * h * s, 4, "output", "", (b, h, s))
    if backward:
        g = _t("g", (b, h, s, d), "grad_output")
        ins, name, stage = [g, q, k, v, o, lse], ("autograd::engine::evaluate_function: "
                                                  "ScaledDotProductFlashAttentionBackward0"), "backward"
        outs = [_t("dq", (b, h, s, d)), _t("dk", (b, h, keys or s, d)), _t("dv", (b, h, keys or s, d))]
    else:
        ins, outs, name, stage = [q, k, v], [o, lse], "aten::_scaled_dot_product_flash_attention", "forward"
    tensors = {t.id: t for t in [*ins, *outs]}
    op = Op(0, 1, name, tuple(t.id for t in ins), tuple(t.id for t in outs), 0.0, 0.0, stage, False, 2)
    return op_cost(op, tensors, causal=causal)


def test_causal_mask_halves_the_counted_flops_forward_and_backward():
    b, h, s, d = 2, 8, 1024, 128
    full = 4.0 * b * h * s * s * d
    assert _attention(b, h, s, d).flops == full
    assert _attention(b, h, s, d, causal=True).flops == full / 2
    assert _attention(b, h, s, d, causal=True, backward=True).flops == 2.5 * full / 2
    assert _attention(b, h, s, d, causal=True).attention == (d, True, s)
    assert _attention(b, h, s, d).attention == (d, False, s)


def test_a_sliding_windows_keys_are_not_halved_again():
    c = _attention(1, 8, 4096, 64, keys=128, causal=True)
    assert c.flops == 4.0 * 8 * 4096 * 128 * 64 and c.attention == (64, False, 128)


@pytest.mark.parametrize("causal", [False, True])
def test_the_h200_model_gives_back_each_measured_cudnn_kernel(causal):
    """Each curve point is one measured sequence length: the roofline returns that kernel's time
    (less the back-to-back gap the curves take out), forward and backward, within 1 %; the one
    shape whose length another shares (1×64×8192×128, beside 1×32×8192×128) within 8 %."""
    device = get_device("h200")
    records = [r for r in json.loads(DATA.read_text())["records"]
               if r["suite"] == "sdpa" and r["op"].startswith("cudnn") and r["causal"] == causal]
    assert len(records) == 20
    gap = 1.92e-6 - device.launch_floor_s  # the measured gap between back-to-back kernels
    for r in records:
        b, h, s, d = r["shape"]
        cost = _attention(b, h, s, d, causal=causal, backward=r["op"].endswith("bwd"))
        assert cost.flops == pytest.approx(r["flops"], rel=1e-9)
        model = roofline_seconds(cost, device, BF16) + gap
        assert model == pytest.approx(r["t_s"], rel=0.08 if h == 64 and s == 8192 else 0.01), r


def test_fewer_heads_of_the_same_sequence_run_at_the_sequences_fraction():
    """Tensor parallelism splits the heads, not the sequence: 8 heads of 8,192 tokens take the
    fraction measured at 8,192 tokens, not the one of the shorter sequence with the same FLOPs."""
    device = get_device("h100-sxm")
    few = _attention(1, 8, 8192, 128, causal=True)
    peak = device.matrix_peak("bf16")
    frac = few.flops / (peak * (roofline_seconds(few, device, BF16) - device.launch_floor_s))
    assert frac == pytest.approx(device.attention_efficiency.curve(False, True, 128).at(8192), rel=1e-9)
    assert frac == pytest.approx(0.619, abs=0.001)


def test_without_a_measured_curve_a_causal_op_is_charged_its_full_mask_at_the_gemm_curve():
    b200 = get_device("b200")
    assert b200.attention_efficiency is None
    causal, full = _attention(1, 32, 8192, 128, causal=True), _attention(1, 32, 8192, 128)
    assert roofline_seconds(causal, b200, BF16) == roofline_seconds(full, b200, BF16)
    peak, curve = b200.matrix_peak("bf16"), b200.compute_curve("bf16")
    assert roofline_seconds(full, b200, BF16) == pytest.approx(
        full.flops / (peak * curve.at(full.flops)) + b200.launch_floor_s, rel=1e-12)


def test_the_nearest_measured_head_size_times_an_op():
    h100 = get_device("h100-sxm")
    curves = h100.attention_efficiency
    assert curves.curve(False, True, 192) is curves.curve(False, True, 128)  # MLA's 192: nearer 128 than 64
    assert curves.curve(True, False, 80) is curves.curve(True, False, 64)
    assert curves.curve(False, True, 96) is curves.curve(False, True, 128)  # a tie by ratio: the larger
    # a fused op in fp32 has no 16-bit curve: the GEMM path
    c = replace(_attention(1, 8, 2048, 128, causal=True), dtype="fp32")
    assert roofline_seconds(c, h100, Precision("fp32")) == roofline_seconds(c, replace(h100, attention_efficiency=None),
                                                                            Precision("fp32"))


def test_a_traced_three_dimensional_query_has_no_head_size_and_takes_no_curve():
    """A tracer records SDPA's q as a view with its base's [b, s, heads·d] shape: the head size is
    not the last dimension, so no measured curve is picked; the causal op is charged its full mask."""
    q, k, v = _t("q", (2, 1024, 768)), _t("k", (2, 1024, 768)), _t("v", (2, 1024, 768))
    o = _t("o", (2, 1024, 768))
    op = Op(0, 1, "aten::_scaled_dot_product_flash_attention", ("q", "k", "v"), ("o",), 0.0, 0.0, "forward", False, 2)
    cost = op_cost(op, {t.id: t for t in (q, k, v, o)}, causal=True)
    assert cost.attention == (0, True, 1024) and cost.flops == 4.0 * 2 * 1024 * 1024 * 768 / 2
    h100 = get_device("h100-sxm")
    assert roofline_seconds(cost, h100, BF16) == roofline_seconds(cost, replace(h100, attention_efficiency=None), BF16)


def _device_file(attention) -> dict:
    return {"name": "x", "memory_gb": 80, "hbm_gbps": 3000, "launch_floor_us": 1, "matrix_tflops": {"bf16": 900},
            "vector_tflops": {"fp32": 60}, "efficiency": {"source": "s", "compute": [[1e9, 0.5]],
                                                        "memory": [[1e6, 0.5]], "attention": attention},
            "sources": {k: "s" for k in ("matrix_tflops", "vector_tflops", "hbm_gbps", "memory_gb")}}


@pytest.mark.parametrize("attention, message", [
    ({"head_dim_128": {"forward": [[1e9, 0.5]]}}, "efficiency.attention.source"),
    ({"source": "s", "dim_128": {"forward": [[1e9, 0.5]]}}, "unknown field efficiency.attention.dim_128"),
    ({"source": "s", "head_dim_128": {"fwd": [[1e9, 0.5]]}}, "unknown field efficiency.attention.head_dim_128.fwd"),
    ({"source": "s", "head_dim_128": {"forward": [[1e9, 1.5]]}}, "fraction must be at most 1"),
    ({"source": "s"}, "lists no head_dim_N curves"),
    ([1, 2], "must map head_dim_N"),
])
def test_a_bad_attention_block_is_one_line_naming_the_field(attention, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_device("x.yaml", _device_file(attention))
