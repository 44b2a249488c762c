"""Trace loading, validation, derived facts and batch scaling."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from triosim.compute.scale import scale_trace
from triosim.errors import ConfigError, TraceError
from triosim.trace import load_trace, read_trace_info
from triosim.trace.model import parse_id_list
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace


def test_reference_vgg13_facts(vgg13_dir):
    t = load_trace(vgg13_dir, batch_size=128)
    assert len(t.ops) == 77
    assert [len(t.stage_ops(s)) for s in ("forward", "backward", "optimizer")] == [35, 35, 7]
    assert t.total_time_s * 1e3 == pytest.approx(94.038, abs=1e-9)
    assert t.parameter_bytes == 532_191_392
    assert sum(t.tensors[p].numel for p in t.parameters) == 133_047_848
    assert sum(op.tpflag for op in t.ops) == 26


def test_reference_resnet50_facts(resnet50_dir):
    t = load_trace(resnet50_dir, batch_size=128)
    assert len(t.ops) == 396
    assert t.total_time_s * 1e3 == pytest.approx(70.723, abs=1e-9)
    assert t.parameter_bytes == 102_228_128


def test_views_are_aliased_to_their_producer(vgg13_dir):
    t = load_trace(vgg13_dir)
    # linear consumes flatten's output 205, a view of adaptive_avg_pool2d's output 199.
    assert t.base("205") == "199"
    assert "205" not in t.external and t.producer["199"] < min(t.consumers["199"])
    # AccumulateGrad's gradient 757 is conv1's weight gradient 746.
    assert t.base("757") == "746"


def test_backward_ops_pair_with_their_forward(vgg13_dir):
    t = load_trace(vgg13_dir)
    conv_bwd = [op for op in t.ops if op.name.endswith("ConvolutionBackward0")]
    for op in conv_bwd:
        partner = t.forward_partner[op.index]
        assert partner is not None and t.ops[partner].name == "aten::conv2d"
    # The last conv backward belongs to the first conv.
    assert t.forward_partner[conv_bwd[-1].index] == 0


def test_parse_id_list():
    assert parse_id_list("[4; 6; 8]") == ("4", "6", "8")
    assert parse_id_list("[]") == ()
    assert parse_id_list("['4'; '6']") == ("4", "6")
    with pytest.raises(ValueError):
        parse_id_list("4; 6")


def test_synthetic_round_trip(tmp_path):
    d = write_synthetic_trace(tmp_path / "m", SyntheticModel(layers=3, batch_size=4, seed=2))
    assert read_trace_info(d)["batch_size"] == 4
    t = load_trace(d, batch_size=4)
    assert len(t.ops) == 3 + 1 + 1 + 3 + 3
    assert len(t.parameters) == 6
    # Every read is produced earlier or comes from outside the step.
    for i in range(len(t.ops)):
        for b in t.reads[i]:
            assert b in t.external or t.producer[b] < i


def test_scaling_keeps_parameters_and_scales_activations(synthetic_dir):
    t = load_trace(synthetic_dir, batch_size=8)
    from triosim.compute.op_time import attach_op_time_model

    # The old, linear op-time model halves every op; the default keeps optimizer ops as they are.
    assert scale_trace(attach_op_time_model(t, "linear"), 4).total_time_s == pytest.approx(t.total_time_s / 2)
    half = scale_trace(t, 4)
    for a, b in zip(t.ops, half.ops):
        assert b.duration_s == pytest.approx(a.duration_s if a.stage == "optimizer" else a.duration_s / 2)
    assert half.parameter_bytes == t.parameter_bytes
    x = t.external[0]  # the input batch
    assert half.tensors[x].bytes == t.tensors[x].bytes // 2
    compat = scale_trace(t, 4, reference_compat=True)
    assert compat.parameter_bytes < t.parameter_bytes  # the original halves parameters too


def test_reference_compat_scaling_matches_original_truncation(vgg13_dir):
    t = load_trace(vgg13_dir)
    s = scale_trace(t, 64, reference_compat=True)
    assert s.total_time_s * 1e3 == pytest.approx(47.019)
    assert s.tensors["6"].bytes == int(float(t.tensors["6"].bytes) / 2.0)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, count))


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: shutil.rmtree(d), "trace directory does not exist"),
        (lambda d: (d / "tensor.csv").unlink(), "tensor.csv: file not found"),
        (lambda d: _edit(d / "trace.csv", "Operator_cudatimenooverlap", "Opcudatime2"),
         "trace.csv:1: missing column 'Operator_cudatimenooverlap'"),
        (lambda d: _edit(d / "trace.csv", ",aten::linear,[1; 2; 3],[4],", ",aten::linear,[1; 2; 977],[4],"),
         "trace.csv:2: Operator_input: references tensor 977, which tensor.csv does not define"),
        (lambda d: _edit(d / "trace.csv", "forward,", "sideways,"), "trace.csv:2: stage: unknown stage 'sideways'"),
        (lambda d: (d / "trace.csv").write_text((d / "trace.csv").read_text().splitlines()[0] + "\n"),
         "trace.csv: the trace has no operators"),
        (lambda d: (d / "trace.csv").write_text(""), "trace.csv: file is empty"),
        (lambda d: _edit(d / "tensor.csv", ",4,input,", ",four,input,"),
         "tensor.csv:2: TensorEachByte: not a number: 'four'"),
        (lambda d: _edit(d / "tensor.csv", ",4,weight,", ",-4,weight,"), "tensor.csv:3: TensorEachByte: must be >= 0"),
    ],
)
def test_bad_input_names_file_row_and_field(tmp_path, mutate, expected):
    d = write_synthetic_trace(tmp_path / "m", SyntheticModel(layers=2, batch_size=4))
    mutate(d)
    with pytest.raises(TraceError) as err:
        load_trace(d, batch_size=4)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_times_are_rejected(tmp_path):
    d = write_synthetic_trace(tmp_path / "m", SyntheticModel(layers=2, batch_size=4))
    rows = (d / "trace.csv").read_text().splitlines()
    fields = rows[1].split(",")
    for bad, msg in (("-5", "must be a finite number >= 0"), ("abc", "unparsable time 'abc'")):
        f = list(fields)
        f[-7] = bad  # Operator_cudatime ... counted from the end to skip list columns' commas
        (d / "trace.csv").write_text("\n".join([rows[0], ",".join(f), *rows[2:]]) + "\n")
        with pytest.raises(TraceError, match=msg):
            load_trace(d, batch_size=4)


def test_bad_batch_sizes():
    with pytest.raises(ConfigError):
        load_trace(".", batch_size=0)
