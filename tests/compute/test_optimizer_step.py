"""The optimizer step under a training precision: Megatron-LM's kernels, byte by byte.

Closed forms: Megatron's fp16 step moves 50 bytes per parameter (unscale 8, norm 4, Adam 28, copy
to the 16-bit weights 6, zeroing the fp32 gradients 4), bf16 42 (no loss scaler), fp32 36. A
roofline-timed card trace's optimizer op then reads 28 and writes 22 bytes per parameter, and is
timed as the roofline of those bytes; a measured trace keeps its time.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import triosim.compute.optimizer_step as optimizer_step
from triosim.compute.op_time_source import time_on_device
from triosim.compute.roofline import Precision, roofline_seconds
from triosim.graph.data.precision import with_training_precision
from triosim.hardware.device_db import get_device
from triosim.trace.load import load_trace
from triosim.trace.model_card import get_card
from triosim.trace.precision import TrainingPrecision, elements, optimizer_step_bytes
from triosim.trace.synthetic_card import CardTraceSpec, write_card_trace


@pytest.mark.parametrize("dtype, grads, read, written", [
    ("fp16", "fp32", 28, 22),  # 4 unscale + 4 norm + 16 Adam + 4 copy | 4 unscale + 12 Adam + 2 copy + 4 zero
    ("bf16", "fp32", 24, 18),
    ("fp32", "fp32", 20, 16),
    ("bf16", "bf16", 26, 20),  # + the 16-bit gradient's fp32 copy (read 2, write 4); zeroing writes 2
])
def test_bytes_per_parameter_are_megatrons(dtype, grads, read, written):
    step = optimizer_step_bytes(TrainingPrecision(dtype, grads))
    assert (step.read, step.written) == (read, written)


def card_trace(tmp_path):
    card = replace(get_card("gpt3-175b"), layers=2, hidden=256, heads=8, kv_heads=8, ffn=1024, vocab=512, seq_len=64)
    d = write_card_trace(tmp_path / "card", CardTraceSpec(card, 2, 2, 2))
    return load_trace(d, batch_size=2)


def optimizer_seconds(trace) -> float:
    return sum(op.duration_s for op in trace.ops if op.stage == "optimizer")


def step_bytes(trace) -> tuple[float, float]:
    costs = trace.op_time.shapes.costs
    ops = optimizer_step.optimizer_ops(trace)
    return sum(costs[i].bytes_read for i in ops), sum(costs[i].bytes_written for i in ops)


def test_roofline_step_moves_megatrons_bytes(tmp_path):
    device = get_device("a100-80gb")
    timed, _ = time_on_device(card_trace(tmp_path), device, "roofline", dtype="fp16")
    params = sum(elements(timed.tensors[p]) for p in timed.parameters)
    assert sum(step_bytes(timed)) < 20 * params  # the traced op: 16-bit weights and gradients, fp32 moments
    fp16 = with_training_precision(timed, TrainingPrecision("fp16"))
    assert step_bytes(fp16) == pytest.approx((28 * params, 22 * params), rel=1e-12)
    bf16 = with_training_precision(timed, TrainingPrecision("bf16"))
    assert step_bytes(bf16) == pytest.approx((24 * params, 18 * params), rel=1e-12)
    # the op's time is the roofline of those bytes, and grows with them
    costs = fp16.op_time.shapes.costs
    for i in optimizer_step.optimizer_ops(fp16):
        assert fp16.ops[i].duration_s == roofline_seconds(costs[i], device, Precision("fp16"))
    assert optimizer_seconds(fp16) > optimizer_seconds(bf16) > optimizer_seconds(timed)
    # only the optimizer moves: every other op keeps its time
    others = [(a.duration_s, b.duration_s) for a, b in zip(timed.ops, fp16.ops) if a.stage != "optimizer"]
    assert all(x == y for x, y in others)
    # and the op-time model answers the same at the traced batch (the DAG asks it)
    model = fp16.op_time
    assert sum(model.seconds(i, fp16.batch_size) for i in optimizer_step.optimizer_ops(fp16)) == \
        pytest.approx(optimizer_seconds(fp16))


def test_measured_times_are_kept(tmp_path):
    device = get_device("a100-80gb")
    timed, _ = time_on_device(card_trace(tmp_path), device, "roofline", dtype="fp16")
    untimed = replace(timed, op_time=None)
    assert optimizer_seconds(with_training_precision(untimed, TrainingPrecision("fp16"))) == optimizer_seconds(timed)


def test_catches_a_planted_bug(tmp_path, monkeypatch):
    """A step that keeps the traced op's bytes (the bug this replaced) fails the closed form."""
    device = get_device("a100-80gb")
    timed, _ = time_on_device(card_trace(tmp_path), device, "roofline", dtype="fp16")
    params = sum(elements(timed.tensors[p]) for p in timed.parameters)
    monkeypatch.setattr(optimizer_step, "step_costs", lambda trace, shapes, step: shapes)
    planted = with_training_precision(timed, TrainingPrecision("fp16"))
    assert step_bytes(planted) != pytest.approx((28 * params, 22 * params), rel=1e-3)
