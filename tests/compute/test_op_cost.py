"""Op costs from shapes: closed forms per op kind, on small synthetic ops and the shipped traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from triosim.compute.op_cost import op_cost, trace_op_costs
from triosim.trace import Op, Tensor
from triosim.trace.load import load_trace

SAMPLES = Path(__file__).resolve().parents[2] / "sample_trace"


def _t(tid: str, shape: tuple[int, ...], category: str = "input", each: int = 4) -> Tensor:
    n = 1
    for d in shape:
        n *= d
    return Tensor(tid, n * each, n, each, category, "", shape)


def _op(name: str, ins: list[Tensor], outs: list[Tensor], stage: str = "forward"):
    tensors = {t.id: t for t in [*ins, *outs]}
    return Op(0, 1, name, tuple(t.id for t in ins), tuple(t.id for t in outs), 1e-3, 1e-3, stage, False, 2), tensors


def test_linear_is_2_b_in_out():
    b, i, o = 32, 256, 512
    op, ts = _op("aten::linear", [_t("x", (b, i)), _t("w", (o, i), "weight"), _t("bias", (o,), "bias")],
                 [_t("y", (b, o), "output")])
    c = op_cost(op, ts)
    assert c.flops == 2 * b * i * o and c.op_class == "matmul" and c.dtype == "fp32" and c.known
    assert c.bytes_read == 4 * (b * i + o * i + o) and c.bytes_written == 4 * b * o


def test_linear_on_3d_input_and_bf16():
    op, ts = _op("aten::linear", [_t("x", (4, 8, 64), each=2), _t("w", (32, 64), "weight", 2)],
                 [_t("y", (4, 8, 32), "output", 2)])
    c = op_cost(op, ts)
    assert c.flops == 2 * 32 * 64 * 32 and c.dtype == "bf16"


def test_bmm_and_matmul_use_the_contraction_length():
    op, ts = _op("aten::bmm", [_t("a", (3, 5, 7)), _t("b", (3, 7, 11))], [_t("y", (3, 5, 11), "output")])
    assert op_cost(op, ts).flops == 2 * 3 * 5 * 7 * 11


def test_addmm_backward_is_twice_the_forward():
    m, k, n = 64, 128, 96
    op, ts = _op("autograd::engine::evaluate_function: AddmmBackward0",
                 [_t("g", (m, n), "grad_output"), _t("w", (n, k), "weight"), _t("x", (m, k))],
                 [_t("gx", (m, k), "output"), _t("gw", (n, k), "output"), _t("gb", (1, n), "output")], "backward")
    c = op_cost(op, ts)
    assert c.flops == 2 * (2 * m * n * k) and c.op_class == "matmul"


def test_addmm_backward_listing_only_the_weight_takes_rows_from_the_hint_or_the_batch():
    op, ts = _op("autograd::engine::evaluate_function: AddmmBackward0", [_t("wt", (25088, 4096))],
                 [_t("gw", (4096, 25088), "output")], "backward")
    assert op_cost(op, ts, gemm_hint=(128, 4096, 25088)).flops == 4 * 128 * 4096 * 25088
    assert op_cost(op, ts, rows=64).flops == 4 * 64 * 4096 * 25088
    assert not op_cost(op, ts).known  # no rows at all: bytes only


@pytest.mark.parametrize("groups", [1, 2, 8])
def test_conv_forward_and_backward_closed_forms(groups):
    n, cin, cout, h, w, kh, kw = 4, 16, 32, 10, 12, 3, 3
    weight = _t("w", (cout, cin // groups, kh, kw), "weight")
    out = _t("y", (n, cout, h, w), "output")
    op, ts = _op("aten::conv2d", [_t("x", (n, cin, h, w)), weight, _t("b", (cout,), "bias")], [out])
    fwd = 2 * n * cout * h * w * (cin // groups) * kh * kw
    assert op_cost(op, ts).flops == fwd and op_cost(op, ts).op_class == "conv"
    op, ts = _op("autograd::engine::evaluate_function: ConvolutionBackward0",
                 [_t("g", (n, cout, h, w), "grad_output"), _t("x", (n, cin, h, w)), weight],
                 [_t("gx", (n, cin, h, w), "output"), _t("gw", weight.shape, "output"), _t("gb", (cout,), "output")],
                 "backward")
    assert op_cost(op, ts).flops == 2 * fwd
    # The first layer's backward writes no input gradient (an undefined, 0-byte output): one product.
    op, ts = _op("autograd::engine::evaluate_function: ConvolutionBackward0",
                 [_t("g", (n, cout, h, w), "grad_output"), _t("x", (n, cin, h, w)), weight],
                 [Tensor("none", 0, 0, 0, "weight", "", ()), _t("gw", weight.shape, "output")], "backward")
    assert op_cost(op, ts).flops == fwd


def test_attention_forward_and_backward():
    b, s, d, h = 2, 128, 64, 4
    q, k, v = (_t(x, (b, s, d)) for x in "qkv")
    op, ts = _op("aten::scaled_dot_product_attention", [q, k, v], [_t("o", (b, h, s, d // h), "output")])
    c = op_cost(op, ts)
    assert c.flops == 4 * b * s * s * d and c.op_class == "attention"
    op, ts = _op("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionBackward0",
                 [_t("g", (b, s, d), "grad_output"), q, k, v], [_t("gq", (b, s, d), "output")], "backward")
    assert op_cost(op, ts).flops == 2.5 * 4 * b * s * s * d


def test_bytes_bound_kinds_and_in_place_ops():
    x = _t("x", (8, 1024))
    op, ts = _op("aten::relu_", [x], [x])
    c = op_cost(op, ts)
    assert c.op_class == "elementwise" and c.bytes == 2 * x.bytes  # read and written back
    op, ts = _op("aten::batch_norm", [x, _t("w", (1024,), "weight")], [_t("y", (8, 1024), "output")])
    c = op_cost(op, ts)
    assert c.bytes_read == 2 * x.bytes + 4 * 1024  # statistics pass, then normalise
    assert c.blocks is None  # (N, C): cuDNN's per-activation mode, no one-block-per-channel limit
    op, ts = _op("aten::_foreach_mul_", [_t("p1", (10, 10)), _t("p2", (5,))], [], "optimizer")
    c = op_cost(op, ts)
    assert c.op_class == "optimizer" and c.bytes_written == 4 * 105 and c.bytes_read == 4 * 105
    op, ts = _op("aten::_foreach_addcmul_", [_t("a1", (10,)), _t("a2", (5,)), _t("b1", (10,)), _t("b2", (5,)),
                                              _t("c1", (10,)), _t("c2", (5,))], [], "optimizer")
    assert op_cost(op, ts).bytes_written == 4 * 15  # three lists read, the first written


def test_unknown_ops_are_costed_by_bytes_and_flagged():
    op, ts = _op("aten::some_new_op", [_t("x", (100,))], [_t("y", (50,), "output")])
    c = op_cost(op, ts)
    assert not c.known and c.op_class == "unknown" and c.flops == 0 and c.bytes == 600


@pytest.mark.parametrize("name", ["gpt-cpu-bs8", "gpt-h16-cpu-bs8", "resnet18-cpu-bs16"])
def test_every_op_of_the_sample_traces_is_known_and_costed(name):
    trace = load_trace(SAMPLES / name)
    costs = trace_op_costs(trace)
    assert len(costs) == len(trace.ops)
    assert all(c.known for c in costs), [op.name for op, c in zip(trace.ops, costs) if not c.known]
    for op, c in zip(trace.ops, costs):
        if c.op_class in ("matmul", "conv", "attention"):
            assert c.flops > 0, op.name
        assert c.bytes >= 0 and c.flops >= 0


def test_the_original_traces_backward_gemm_rows_come_from_the_forward_op(vgg13_dir):
    trace = load_trace(vgg13_dir, batch_size=128)
    costs = trace_op_costs(trace)
    by_id = {op.op_id: c for op, c in zip(trace.ops, costs)}
    assert by_id[51].flops == 4 * 128 * 4096 * 25088  # AddmmBackward0 of the first classifier layer
    assert by_id[28].flops == 2 * 128 * 4096 * 25088


def test_training_batch_norm_forward_reads_x_twice_with_one_block_per_channel():
    n, c, h, w = 4, 64, 14, 14
    x = _t("x", (n, c, h, w), "output")
    params = [_t(k, (c,), k) for k in ("weight", "bias", "running_mean", "running_var")]
    op, ts = _op("aten::batch_norm", [x, *params], [_t("y", (n, c, h, w), "output")])
    cost = op_cost(op, ts)
    assert cost.bytes_read == 2 * x.bytes + 4 * 4 * c and cost.bytes_written == x.bytes
    assert cost.blocks == c and cost.flops == 5 * x.numel and cost.op_class == "norm"


def test_training_batch_norm_backward_reads_x_and_dy_twice_and_writes_dx():
    n, c, h, w = 4, 64, 14, 14
    x, dy = _t("x", (n, c, h, w), "output"), _t("dy", (n, c, h, w), "grad_output")
    params = [_t(k, (c,), k) for k in ("weight", "running_mean", "running_var", "save_mean", "save_var")]
    reserve = Tensor("r", 0, 0, 1, "reservespace", "", (0,))
    op, ts = _op("autograd::engine::evaluate_function: CudnnBatchNormBackward0", [x, dy, *params, reserve],
                 [_t("dx", (n, c, h, w), "grad_output"), _t("gw", (c,), "output"), _t("gb", (c,), "output")],
                 "backward")
    cost = op_cost(op, ts)
    assert cost.bytes_read == 4 * x.bytes + 5 * 4 * c  # two sums over x and dy, then both again
    assert cost.bytes_written == x.bytes + 2 * 4 * c and cost.blocks == c and cost.flops == 8 * x.numel
