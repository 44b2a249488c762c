"""Model FLOPs: Megatron's closed form, Narayanan et al.'s with recomputation, and the op-cost
count of a trace's forward, against each other, against hand decompositions and against the
published counts of torchvision's models.

Planted bugs each test catches (shown when the feature was added): ``12`` → ``16`` in
:func:`megatron_gpt_flops` (the head term of the recomputation count); backward ops counted in
:func:`forward_matrix_flops`; attention left out of it; ``PASSES_PER_ITERATION`` 4.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from triosim.compute.model_flops import (
    forward_matrix_flops,
    megatron_gpt_flops,
    model_flops_per_sample,
    narayanan_gpt_flops,
)
from triosim.trace.load import load_trace
from triosim.trace.repeat import load_repeated

SAMPLES = Path(__file__).resolve().parents[2] / "sample_trace"


def _by_hand(b: int, s: int, n: int, h: int, v: int, forwards_per_layer: int = 3) -> float:
    """One layer's forward: QKV 6·b·s·h², attention output 2·b·s·h², MLP 2 × 8·b·s·h²
    (4h wide), QKᵀ and attention·V 2 × 2·b·s²·h; the LM head 2·b·s·h·V. A training step runs
    each layer ``forwards_per_layer`` forward-equivalents (3; 4 under full recomputation) and
    the head 3."""
    layer = 6 * b * s * h * h + 2 * b * s * h * h + 16 * b * s * h * h + 4 * b * s * s * h
    head = 2 * b * s * h * v
    return float(forwards_per_layer * n * layer + 3 * head)


def test_gpt3_175b_at_batch_1536_is_the_closed_form():
    # GPT-3 175B as Narayanan et al. 2021 (Table 1) train it: 96 layers, hidden 12288,
    # vocabulary 51200, sequence 2048, global batch 1536.
    flops = megatron_gpt_flops(1536, 2048, 96, 12288, 51200)
    assert flops == pytest.approx(_by_hand(1536, 2048, 96, 12288, 51200), rel=1e-12)
    assert flops == pytest.approx(3.3862e18, rel=1e-4)


def test_narayanan_count_is_one_more_forward_per_layer():
    """Full recomputation runs every layer's forward once more; the head is not recomputed."""
    args = (1536, 2048, 96, 12288, 51200)
    assert narayanan_gpt_flops(*args) == pytest.approx(_by_hand(*args, forwards_per_layer=4), rel=1e-12)
    one_forward_of_layers = 96 * (24 * 1536 * 2048 * 12288**2 + 4 * 1536 * 2048**2 * 12288)
    assert narayanan_gpt_flops(*args) - megatron_gpt_flops(*args) == pytest.approx(one_forward_of_layers, rel=1e-9)


def test_gpt_sample_trace_counts_exactly_the_closed_form():
    # sample_trace/gpt-h200-bs8: 4 layers, d_model 256, vocabulary 4096, sequence 128, batch 8.
    trace = load_trace(SAMPLES / "gpt-h200-bs8")
    assert 3 * forward_matrix_flops(trace) == pytest.approx(megatron_gpt_flops(8, 128, 4, 256, 4096), rel=1e-12)
    assert model_flops_per_sample(trace, 8) == pytest.approx(megatron_gpt_flops(1, 128, 4, 256, 4096), rel=1e-12)


def test_repeated_layers_count_as_the_deeper_model():
    trace = load_repeated(SAMPLES / "gpt-cpu-bs8", 12, batch_size=8)
    assert model_flops_per_sample(trace, 8) == pytest.approx(megatron_gpt_flops(1, 128, 12, 256, 4096), rel=1e-12)


def test_gpt2_small_shapes_match_the_closed_form():
    # 12 layers, d_model 768, vocabulary 50257, sequence 1024 (its meta.json).
    trace = load_trace(SAMPLES / "gpt2-small-h200-bs8")
    assert model_flops_per_sample(trace, 8) == pytest.approx(megatron_gpt_flops(1, 1024, 12, 768, 50257), rel=1e-12)


@pytest.mark.parametrize("name, gmacs", [("resnet18-h200-bs16", 1.81), ("resnet50-h200-bs128", 4.09),
                                         ("vgg13-h200-bs128", 11.31)])
def test_cnn_forward_matches_torchvision_published_counts(name, gmacs):
    """torchvision's model documentation lists each classifier's "GFLOPS" at 224×224: multiply-adds
    of its convolutions and linear layers (ResNet-18 1.81, ResNet-50 4.09, VGG-13 11.31)."""
    trace = load_trace(SAMPLES / name)
    per_sample_macs = forward_matrix_flops(trace) / trace.batch_size / 2
    assert per_sample_macs / 1e9 == pytest.approx(gmacs, abs=0.005)


@pytest.mark.parametrize("fast", [True, False])  # tensors as columns (pyarrow) or as a dict (the checker)
def test_each_kind_of_op_costed_once_equals_every_op_costed(tmp_path, fast):
    """The count memoises per kind of op (name, shapes, categories, element counts); on a trace
    of random layer widths it equals costing every forward matrix op one by one."""
    from triosim.compute.op_cost import op_cost
    from triosim.compute.op_kinds import MATRIX_CLASSES, classify
    from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace
    from triosim.trace.tensor_table import TensorTable

    trace = load_trace(write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=40, batch_size=4, seed=3)),
                       fast=fast)
    assert isinstance(trace.tensors, TensorTable) == fast
    every = sum(op_cost(op, trace.tensors).flops for op in trace.ops
                if op.stage == "forward" and classify(op.name, op.stage)[1] in MATRIX_CLASSES)
    assert every > 0 and forward_matrix_flops(trace) == every


def test_shapes_batch_must_be_positive():
    trace = load_trace(SAMPLES / "gpt-h200-bs8")
    with pytest.raises(ValueError):
        model_flops_per_sample(trace, 0)
