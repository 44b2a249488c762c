"""The op-time model (triosim.compute.op_time): measured times at the traced batch, the kernel
floor, batch-independent ops, the least-squares fit over traces at several batch sizes, the
flags, and the batch-512 prediction of the original's vgg13 data (skipped without ../shared)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from triosim import build_platform, load_trace, scale_trace, simulate
from triosim.cli.console import main
from triosim.compute.op_time import (
    attach_op_time_model,
    batch_independent_ops,
    fit_model,
    linear_floor_model,
    linear_model,
    op_seconds,
)
from triosim.errors import ConfigError, TraceError
from triosim.graph.strategy import Strategy
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference"


def _trace(tmp_path: Path, batch: int = 8):
    return load_trace(write_synthetic_trace(tmp_path / "mlp", SyntheticModel(layers=3, batch_size=batch, seed=4)),
                      batch_size=batch)


def _scale_times(src: Path, dst: Path, factor: float) -> Path:
    """A copy of a trace directory with every op time multiplied by ``factor``."""
    shutil.copytree(src, dst)
    rows = list(csv.reader((dst / "trace.csv").open()))
    for row in rows[1:]:
        row[4] = str(float(row[4]) * factor)
        row[5] = str(float(row[5]) * factor)
    with (dst / "trace.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return dst


def test_the_traced_batch_keeps_the_measured_time(tmp_path):
    trace = _trace(tmp_path)
    for model in (linear_model(trace), linear_floor_model(trace, 50.0)):
        assert [model.seconds(i, 8) for i in range(len(trace.ops))] == [op.duration_s for op in trace.ops]
    scaled = scale_trace(attach_op_time_model(trace), 8)
    assert [op.duration_s for op in scaled.ops] == [op.duration_s for op in trace.ops]


def test_linear_floor_fixes_optimizer_ops_and_floors_small_kernels(tmp_path):
    trace = _trace(tmp_path)
    fixed = batch_independent_ops(trace)
    assert [f for f, op in zip(fixed, trace.ops) if op.stage == "optimizer"] == [True] * 3
    assert not any(f for f, op in zip(fixed, trace.ops) if op.name == "aten::linear")
    model = linear_floor_model(trace, floor_us=20.0)
    for i, op in enumerate(trace.ops):
        if fixed[i]:
            assert model.seconds(i, 1) == model.seconds(i, 64) == op.duration_s
        else:
            assert model.seconds(i, 64) == pytest.approx(op.duration_s * 8)
            assert model.seconds(i, 1) == pytest.approx(max(min(20e-6, op.duration_s), op.duration_s / 8))
    # The old model: everything linear, no floor.
    lin = linear_model(trace)
    assert all(lin.seconds(i, 1) == pytest.approx(op.duration_s / 8) for i, op in enumerate(trace.ops))


def test_fit_recovers_a_and_c_from_traces_at_other_batches(tmp_path):
    base = write_synthetic_trace(tmp_path / "mlp", SyntheticModel(layers=3, batch_size=8, seed=4))
    # The same model at batch 16 and 32, each op taking 1.5× and 2.5× its batch-8 time: a
    # straight line t(b) = t8·(0.5 + b/16) per op.
    _scale_times(base, base / "batch-16", 1.5)
    _scale_times(base, base / "batch-32", 2.5)
    trace = attach_op_time_model(load_trace(base, batch_size=8))
    model = trace.op_time
    assert model.name == "fit" and model.batches == (8, 16, 32)
    for i, op in enumerate(trace.ops):
        t8 = op.duration_s
        assert model.seconds(i, 64) == pytest.approx(t8 * (0.5 + 64 / 16), rel=1e-3)
        assert model.seconds(i, 2) == pytest.approx(max(min(2e-6, t8), t8 * (0.5 + 2 / 16)), rel=1e-3)
        assert op_seconds(trace, i, 8) == t8
    # linear-floor can still be chosen on the same directory.
    assert attach_op_time_model(load_trace(base, batch_size=8), "linear-floor").op_time.name == "linear-floor"


def test_fit_refuses_traces_of_another_model(tmp_path):
    base = write_synthetic_trace(tmp_path / "mlp", SyntheticModel(layers=3, batch_size=8, seed=4))
    write_synthetic_trace(base / "batch-16", SyntheticModel(layers=4, batch_size=16, seed=4))
    with pytest.raises(TraceError, match=r"batch-16.*trace\.csv.*same model"):
        attach_op_time_model(load_trace(base, batch_size=8))


def test_fit_without_other_batches_and_bad_values_are_config_errors(tmp_path):
    trace = _trace(tmp_path)
    with pytest.raises(ConfigError, match="batch-<N>"):
        attach_op_time_model(trace, "fit")
    with pytest.raises(ConfigError, match="--op-time-model"):
        attach_op_time_model(trace, "quadratic")
    with pytest.raises(ConfigError, match="--kernel-floor-us"):
        attach_op_time_model(trace, "auto", -1.0)


def test_pipeline_micro_batches_use_the_model(tmp_path):
    trace = attach_op_time_model(_trace(tmp_path), "linear-floor", 30.0)
    res = simulate(trace, build_platform(2), Strategy(case=4, micro_batch_size=1, partition="count"))
    g = res.graph
    for t, kind in enumerate(g.kind):
        a = g.attrs[t] or {}
        if kind == "compute" and "microbatch" in a:
            assert g.duration[t] == pytest.approx(trace.op_time.seconds(a["op"], 1))
            assert g.duration[t] >= min(30e-6, trace.ops[a["op"]].duration_s) - 1e-15


def test_cli_flags_and_summary(tmp_path, capsys):
    d = write_synthetic_trace(tmp_path / "mlp", SyntheticModel(layers=3, batch_size=8, seed=4))
    common = ["run", "-trace-dir", str(d), "-case", "0", "-batch-size-sim", "2", "--quiet"]
    assert main([*common, "--op-time-model", "linear"]) == 0
    linear = float(capsys.readouterr().out)
    assert main([*common, "--kernel-floor-us", "100"]) == 0
    floored = float(capsys.readouterr().out)
    assert floored > linear
    assert main([*common, "--op-time-model", "fit"]) == 2
    assert "batch-<N>" in capsys.readouterr().err
    assert main(["run", "-trace-dir", str(d), "-case", "4", "-GPUnumber", "2", "-micro-batch-size", "4"]) == 0
    assert "at least 2 µs" in capsys.readouterr().out


# ----------------------------------------------------------------------------- reference data


def vgg13_at(tmp_path: Path):
    pair = REFERENCE / "tracer_data"
    sample = REFERENCE / "sample_trace" / "trace2-h100-bs128" / "vgg13"
    if not (pair / "graph_vgg13-iter41.json").is_file() or not (sample / "trace.csv").is_file():
        pytest.skip("reference data (../shared/reference) not available")
    out = tmp_path / "vgg13-bs512"
    assert main(["trace", "convert", "--graph", str(pair / "graph_vgg13-iter41.json"), "--profiler",
                 str(pair / "profiler_vgg13-iter41.json"), "--out", str(out), "--quiet"]) == 0
    return load_trace(sample, batch_size=128), load_trace(out, batch_size=512)


@pytest.mark.reference
def test_batch_512_prediction_of_the_original_vgg13(tmp_path):
    """From the batch-128 sample trace, predict the batch-512 kernel times of the same model
    (the original's tracer data): linear +8.6 %, linear-floor +5.5 % in total."""
    bs128, bs512 = vgg13_at(tmp_path)
    assert [op.name for op in bs128.ops] == [op.name for op in bs512.ops]
    measured = sum(op.duration_s for op in bs512.ops)
    linear = sum(linear_model(bs128).seconds(i, 512) for i in range(len(bs128.ops)))
    floor = sum(linear_floor_model(bs128).seconds(i, 512) for i in range(len(bs128.ops)))
    assert measured * 1e3 == pytest.approx(346.344, abs=1e-3)
    assert linear * 1e3 == pytest.approx(376.152, abs=1e-3)
    assert floor * 1e3 == pytest.approx(365.445, abs=1e-3)
    assert abs(floor / measured - 1) < abs(linear / measured - 1)
    # With both traces the fit goes through both points, except where the time shrinks with the
    # batch (a few optimizer ops, by noise): c ≥ 0 makes those flat at the mean.
    fitted = fit_model(bs128, [bs512])
    for i, (small, big) in enumerate(zip(bs128.ops, bs512.ops)):
        want = big.duration_s if big.duration_s >= small.duration_s else (small.duration_s + big.duration_s) / 2
        assert fitted.seconds(i, 512) == pytest.approx(max(fitted.floor[i], want), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", ["gpt-cpu-bs8", "resnet18-cpu-bs16", "synthetic"])
def test_batch_independent_ops_on_the_coded_buffers_match_the_per_op_rule(tmp_path, name):
    """The column-by-column computation equals the rule written op by op: an optimizer op, or one
    whose buffers are all batch-free scalars."""
    from triosim.compute.op_time import batch_dependent

    trace = _trace(tmp_path) if name == "synthetic" else load_trace(Path(__file__).parents[1] / "sample_trace" / name)
    scalars = {k for k, t in trace.tensors.items() if t.numel <= 1 and not batch_dependent(trace, k)}
    want = tuple(op.stage == "optimizer" or (scalars.issuperset(r) and scalars.issuperset(w))
                 for op, r, w in zip(trace.ops, trace.reads, trace.writes))
    assert batch_independent_ops(trace) == want
    assert any(want) and not all(want)
