"""Roofline op time and retargeting: lower bounds on every device and every sample op, the
identity on the source device, each property shown to catch a planted bug."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import triosim.compute.roofline as roofline
from triosim.compute.op_cost import OpCost, trace_op_costs
from triosim.compute.roofline import (
    Precision,
    math_dtype,
    moved_bytes,
    peak_flops,
    retarget_seconds,
    retarget_trace,
    roofline_seconds,
)
from triosim.errors import ConfigError
from triosim.hardware.device_db import get_device, shipped_devices
from triosim.trace.load import load_trace

SAMPLES = Path(__file__).resolve().parents[2] / "sample_trace"
NAMES = ("gpt-cpu-bs8", "gpt-h16-cpu-bs8", "resnet18-cpu-bs16")


@cache
def sample(name: str):
    trace = load_trace(SAMPLES / name)
    return trace, tuple(trace_op_costs(trace))


def check_lower_bounds(precision: Precision | None = None) -> None:
    """Every op of every sample trace on every device: t ≥ FLOPs/peak and t ≥ bytes/HBM."""
    precision = precision or Precision()
    for dev in shipped_devices().values():
        if precision.dtype is not None and precision.dtype not in dev.matrix_flops:
            continue  # asked for a dtype this device lacks: an error, tested below
        for name in NAMES:
            for cost in sample(name)[1]:
                t = roofline.roofline_seconds(cost, dev, precision)
                assert t >= cost.flops / peak_flops(cost, dev, precision), (dev.name, cost)
                assert t >= moved_bytes(cost, precision) / dev.hbm_bytes_per_s, (dev.name, cost)


def test_roofline_time_is_at_least_flops_over_peak_and_bytes_over_hbm():
    check_lower_bounds()
    check_lower_bounds(Precision(dtype="bf16"))


def test_the_lower_bound_check_catches_a_planted_bug(monkeypatch):
    """Planted bug: the efficiency multiplies the peak by 1/eff (a speed-up) instead of eff."""

    def too_fast(cost, device, precision=None):
        precision = precision or Precision()
        dtype = math_dtype(cost, device, precision)
        peak = device.matrix_peak(dtype) if cost.on_matrix_units else device.vector_peak(dtype)
        eff_c = device.compute_curve(dtype).at(cost.flops)
        eff_m = device.memory_efficiency.at(cost.bytes)
        return max(cost.flops * eff_c / peak, cost.bytes * eff_m / device.hbm_bytes_per_s)

    monkeypatch.setattr(roofline, "roofline_seconds", too_fast)
    with pytest.raises(AssertionError):
        check_lower_bounds()


costs_strategy = st.builds(
    OpCost,
    flops=st.floats(0, 1e16), bytes_read=st.floats(0, 1e12), bytes_written=st.floats(0, 1e12),
    kind=st.just("x"), op_class=st.sampled_from(["matmul", "conv", "attention", "norm", "elementwise", "unknown"]),
    dtype=st.sampled_from(["fp32", "bf16"]),
)
pairs = st.sampled_from(sorted(shipped_devices()))


def check_identity(measured: float, cost: OpCost, name: str) -> None:
    dev = get_device(name)
    assert roofline.retarget_seconds(measured, cost, dev, dev) == measured


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 10, allow_nan=False), costs_strategy, pairs)
def test_retarget_to_the_source_device_is_the_identity(measured, cost, name):
    check_identity(measured, cost, name)


def test_the_identity_check_catches_a_planted_bug(monkeypatch):
    """Planted bug: retarget adds the launch floor again on top of the measured time."""
    monkeypatch.setattr(roofline, "retarget_seconds",
                        lambda m, c, s, t, p=None: m + t.launch_floor_s)
    with pytest.raises(AssertionError):
        test_retarget_to_the_source_device_is_the_identity()


def test_retarget_of_a_whole_trace_to_its_source_is_bit_for_bit():
    trace, costs = sample("resnet18-cpu-bs16")
    h100 = get_device("h100-sxm")
    assert retarget_trace(trace, h100, h100, costs=costs) == [op.duration_s for op in trace.ops]
    moved = retarget_trace(trace, h100, get_device("a100-80gb"), costs=costs)
    assert all(m > o for m, o in zip(moved, (op.duration_s for op in trace.ops)))


def test_linear_time_is_the_closed_form_roofline():
    dev = get_device("h100-sxm")
    cost = OpCost(2e12, 1e9, 1e9, "matmul", "matmul", "bf16")
    want = max(2e12 / (989.4e12 * dev.compute_curve("bf16").at(2e12)),
               2e9 / (3350e9 * dev.memory_efficiency.at(2e9))) + 1e-6
    assert roofline_seconds(cost, dev) == pytest.approx(want)


def test_fp32_convs_use_tf32_and_fp32_matmuls_do_not():
    h100, v100 = get_device("h100-sxm"), get_device("v100-32gb")
    conv = OpCost(1e9, 1, 1, "conv", "conv", "fp32")
    mm = OpCost(1e9, 1, 1, "matmul", "matmul", "fp32")
    assert math_dtype(conv, h100) == "tf32" and math_dtype(mm, h100) == "fp32"
    assert math_dtype(conv, v100) == "fp32"  # no TF32 on Volta
    assert math_dtype(mm, h100, Precision(tf32_matmul=True)) == "tf32"
    assert math_dtype(mm, h100, Precision(dtype="bf16")) == "bf16"
    assert moved_bytes(mm, Precision(dtype="bf16")) == 1.0  # 2 fp32 bytes moved as bf16


def test_a_dtype_the_device_lacks_is_one_line():
    with pytest.raises(ConfigError, match=r"v100-32gb.*matrix_tflops\.fp8.*no fp8 peak"):
        roofline_seconds(OpCost(1e9, 1, 1, "matmul", "matmul", "fp8"), get_device("v100"))
    with pytest.raises(ConfigError, match="--dtype must be one of"):
        Precision(dtype="int4")


def test_retarget_sanity_on_the_h100_vgg13_trace(vgg13_dir):
    trace = load_trace(vgg13_dir, batch_size=128)
    costs = trace_op_costs(trace)
    h100 = get_device("h100-sxm")
    base = trace.total_time_s
    a100 = sum(retarget_trace(trace, h100, get_device("a100-80gb"), costs=costs)) / base
    b200 = sum(retarget_trace(trace, h100, get_device("b200"), costs=costs)) / base
    assert 1.5 <= a100 <= 3.5 and b200 < 1
    assert retarget_seconds(1.0, costs[0], h100, h100) == 1.0


def test_a_one_block_per_channel_kernel_is_bounded_by_what_its_blocks_read():
    """Batch norm over 64 channels: at most 64 SMs stream, each at the single-block rate."""
    dev = get_device("h200")
    cost = OpCost(5e8, 2e9, 1e9, "norm", "norm", "fp32", blocks=64)
    want = 2e9 / (64 * dev.block_read_bytes_per_s) + dev.launch_floor_s
    assert roofline_seconds(cost, dev) == pytest.approx(want)
    many = OpCost(5e8, 2e9, 1e9, "norm", "norm", "fp32", blocks=4096)  # more blocks than SMs: all SMs
    assert roofline_seconds(many, dev) == pytest.approx(max(
        2e9 / (dev.sm_count * dev.block_read_bytes_per_s),
        3e9 / (dev.hbm_bytes_per_s * dev.memory_efficiency.at(3e9))) + dev.launch_floor_s)
    assert roofline_seconds(OpCost(5e8, 2e9, 1e9, "norm", "norm", "fp32"), dev) < roofline_seconds(cost, dev)


def test_no_overlap_adds_math_and_memory_time_and_vector_ops_use_the_vector_curve():
    a100 = get_device("a100-80gb")
    gemm = OpCost(77.31e9, 88.1e6, 6.3e6, "matmul", "matmul", "bf16")
    want = 77.31e9 / (312e12 * 0.869) + 94.4e6 / (2039e9 * 0.75) + 1.5e-6  # capped at the measured MAMF
    assert roofline_seconds(gemm, a100) == pytest.approx(want)
    softmax = OpCost(0.25e9, 100.7e6, 100.7e6, "norm", "norm", "fp16")
    assert roofline_seconds(softmax, a100) == pytest.approx(0.25e9 / (78e12 * 0.1) + 201.4e6 / (2039e9 * 0.9) + 1.5e-6)


def test_a_2_byte_vector_op_runs_in_the_named_16_bit_type():
    """A trace's 2-byte elements cannot say bf16 or fp16: --dtype fp16 runs them at A100's fp16
    vector rate (78 TFLOP/s), not bf16's (39); fp32 elementwise ops stay fp32 under autocast."""
    a100 = get_device("a100-80gb")
    gelu = OpCost(4e9, 1, 1, "elementwise", "elementwise", "bf16")
    assert math_dtype(gelu, a100, Precision("fp16")) == "fp16" and math_dtype(gelu, a100) == "bf16"
    assert peak_flops(gelu, a100, Precision("fp16")) == 78e12 and peak_flops(gelu, a100, Precision("bf16")) == 39e12
    assert math_dtype(OpCost(4e9, 1, 1, "elementwise", "elementwise", "fp32"), a100, Precision("fp16")) == "fp32"
