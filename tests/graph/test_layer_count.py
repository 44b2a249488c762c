"""The pipeline-depth check counts layers: transformer layers, else layers with weights, else
forward ops; a ``--pp`` above the count exits 2 with one line naming it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from triosim.cli.console import main
from triosim.errors import ConfigError
from triosim.graph.layer_count import LayerCount, check_pipeline_depth, count_layers
from triosim.trace import load_trace
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace
from triosim.trace.synthetic_transformer import (
    SyntheticTransformer,
    write_synthetic_transformer,
)

GPT = str(Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-cpu-bs8")


@pytest.mark.parametrize("layers", [1, 3])
def test_transformer_layers_are_the_attention_blocks(tmp_path, layers):
    path = write_synthetic_transformer(tmp_path / "t", SyntheticTransformer(layers=layers))
    assert count_layers(load_trace(path, batch_size=2)) == LayerCount(layers, "transformer layers")


def test_gpt_sample_has_four_transformer_layers():
    assert count_layers(load_trace(GPT, batch_size=8)) == LayerCount(4, "transformer layers")


def test_mlp_counts_its_linears(tmp_path):
    trace = load_trace(write_synthetic_trace(tmp_path / "m", SyntheticModel(layers=5)), batch_size=8)
    got = count_layers(trace)
    assert got.unit == "layers with weights"
    # one linear per layer reads a 2-D weight (biases are 1-D and do not count)
    linears = sum(1 for op in trace.ops if op.stage == "forward" and any(
        k in trace.parameters and len(trace.tensors[k].shape or ()) == 2 for k in trace.reads[op.index]))
    assert got.count == linears == 5


def test_no_parameters_falls_back_to_forward_ops(tmp_path):
    trace = load_trace(write_synthetic_trace(tmp_path / "m", SyntheticModel(layers=3)), batch_size=8)
    bare = replace(trace, parameters=())
    forward = sum(1 for op in trace.ops if op.stage == "forward")
    assert count_layers(bare) == LayerCount(forward, "forward ops")


def test_check_refuses_one_stage_more_than_layers(tmp_path):
    trace = load_trace(write_synthetic_transformer(tmp_path / "t", SyntheticTransformer(layers=3)), batch_size=2)
    check_pipeline_depth(trace, 3)
    with pytest.raises(ConfigError, match=r"^--pp 4 is more than the model's 3 transformer layers"):
        check_pipeline_depth(trace, 4)


def test_cli_names_the_repeated_layer_count(capsys):
    code = main(["run", "-trace-dir", GPT, "--num-layers", "12", "--pp", "13", "-q"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--pp 13 is more than the model's 12 transformer layers" in err
