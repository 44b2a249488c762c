"""A tensor-parallel share timed at its size on one rank (graph/tensor/split_time.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from triosim.compute.roofline import roofline_seconds
from triosim.config import configure
from triosim.graph.tensor import split_time
from triosim.graph.tensor.plans import tensor_plan

GPT = Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-h16-cpu-bs8"
CARD = {"model": "gpt-neo-1.3b", "gpu": "a100-80gb", "num-layers": 2, "seq-len": 512, "micro-batch-size": 2,
        "dtype": "fp16"}


@pytest.fixture(scope="module")
def card(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TRIOSIM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    trace, _, _ = configure(CARD)
    yield trace
    mp.undo()


def _first_column_linear(trace, plan):
    return min(plan.blocks[0].column)


@pytest.mark.parametrize("sp", [False, True])
def test_a_column_linear_costs_its_share_reading_the_whole_input(card, sp):
    """Closed form: FLOPs/t, the whole input (gathered under SP), weight/t and output/t."""
    t = 4
    plan = tensor_plan(card, t, "megatron", sp)
    i = _first_column_linear(card, plan)
    model = card.op_time
    cost = model.shapes.costs[i]
    x, w = card.reads[i][0], card.reads[i][1]  # input, weight (then the bias)
    read = card.bytes_of(x) + sum(card.bytes_of(k) for k in card.reads[i][1:]) / t
    written = sum(card.bytes_of(k) for k in card.writes[i]) / t
    assert card.bytes_of(w) > 0 and cost.bytes_read == sum(card.bytes_of(k) for k in card.reads[i])
    share = cost.__class__(cost.flops / t, read, written, cost.kind, cost.op_class, cost.dtype, cost.known, cost.gemm)
    want = roofline_seconds(share, model.device, model.precision) / roofline_seconds(cost, model.device, model.precision)
    assert plan.time_scale[i] == pytest.approx(want, rel=1e-12)
    # a share runs lower on the GEMM curve and still reads the whole input: more than 1/t of the op
    assert plan.time_scale[i] > 1 / t


def test_elementwise_shares_scale_their_bytes_and_measured_traces_keep_one_over_t(card):
    t = 4
    plan = tensor_plan(card, t, "megatron", True)
    model = card.op_time
    for i, s in enumerate(plan.time_scale):
        cost = model.shapes.costs[i]
        if s == 1.0 or cost.on_matrix_units or card.ops[i].stage == "optimizer":
            continue
        part = cost.__class__(cost.flops / t, cost.bytes_read / t, cost.bytes_written / t, cost.kind, cost.op_class,
                              cost.dtype)
        assert s == pytest.approx(roofline_seconds(part, model.device, model.precision)
                                  / roofline_seconds(cost, model.device, model.precision), rel=1e-12)
    # no device model behind the times: the trace's own times divided by t, as before
    assert split_time.split_time_scale(replace(card, op_time=None), plan.time_scale, plan.shard_divisor) == \
        plan.time_scale
    measured, _, _ = configure({"trace-dir": str(GPT)})
    kept = tensor_plan(measured, t, "megatron", True).time_scale
    assert {s for s, op in zip(kept, measured.ops) if op.stage != "optimizer"} == {1.0, 1 / t}


def _check_column(trace, plan, t):
    i = _first_column_linear(trace, plan)
    model = trace.op_time
    cost = model.shapes.costs[i]
    read = trace.bytes_of(trace.reads[i][0]) + sum(trace.bytes_of(k) for k in trace.reads[i][1:]) / t
    written = sum(trace.bytes_of(k) for k in trace.writes[i]) / t
    share = cost.__class__(cost.flops / t, read, written, cost.kind, cost.op_class, cost.dtype, cost.known, cost.gemm)
    want = roofline_seconds(share, model.device, model.precision) / roofline_seconds(cost, model.device, model.precision)
    assert plan.time_scale[i] == pytest.approx(want, rel=1e-12)


def test_the_share_check_catches_a_planted_bug(card, monkeypatch):
    """Planted bug: under SP the gathered block input divided like the weights (each rank
    reading only its sequence shard into the column linears)."""
    import triosim.graph.tensor.plans as plans

    t = 4
    _check_column(card, tensor_plan(card, t, "megatron", True), t)
    monkeypatch.setattr(plans, "block_edges", lambda blocks: frozenset())
    with pytest.raises(AssertionError):
        _check_column(card, tensor_plan(card, t, "megatron", True), t)
