"""Megatron-LM's pipeline placement (``--partition layers``, and ``auto`` for a model card's trace):
each (virtual) stage runs L / (pp × V) consecutive transformer layers, the embedding runs on the
first stage, the final norm, head and loss on the last."""

from __future__ import annotations

import pytest

import triosim.graph.pipeline.builder as pp
import triosim.graph.pipeline.stages as ps
from triosim import build_platform
from triosim.errors import ConfigError
from triosim.graph.pipeline.partition import count_starts
from triosim.graph.pipeline.schedules import FORWARD
from triosim.graph.strategy import Strategy
from triosim.trace.layers import forward_layers
from triosim.trace.load import load_trace
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

LAYERS = 8


def plan(trace, partition: str, gpus: int, virtual: int = 1):
    schedule = "interleaved" if virtual > 1 else "1f1b"
    strategy = Strategy(case=4, micro_batch_size=1, partition=partition, schedule=schedule, virtual_stages=virtual)
    return pp.plan_stages(trace, build_platform(gpus), strategy, [0.5, 0.5])


def check_megatron_placement(trace, p) -> None:
    """Equal consecutive layers per stage; the embedding first, the head and loss last."""
    layers = forward_layers(trace)
    n = p.num_stages
    per = len(layers) // n
    for k, unit in enumerate(layers):
        assert {p.stage[i] for i in unit} == {k // per}, f"layer {k}"
    first_layer, last_layer = layers[0][0], layers[-1][-1]
    forward = [i for i, phase in enumerate(p.phase) if phase == FORWARD]
    before = [i for i in forward if i < first_layer]
    after = [i for i in forward if i > last_layer]
    assert before and all(p.stage[i] == 0 for i in before)  # the embedding
    assert after and all(p.stage[i] == n - 1 for i in after)  # the final norm, the head, the loss


@pytest.mark.parametrize("gpus, virtual", [(2, 1), (4, 1), (8, 1), (2, 2), (2, 4)])
def test_equal_layers_per_stage(card_trace, gpus, virtual):
    p = plan(card_trace, "layers", gpus, virtual)
    assert p.partition == "layers" and p.num_stages == gpus * virtual
    check_megatron_placement(card_trace, p)


def test_auto_is_layers_for_a_card_and_optimal_otherwise(card_trace, tmp_path):
    assert plan(card_trace, "auto", 4).partition == "layers"
    # 8 layers do not split over 7 stages, nor 9 or 10 (the embedding and/or the loss counted as layers)
    assert plan(card_trace, "auto", 7).partition == "optimal"
    mlp = load_trace(write_synthetic_trace(tmp_path / "mlp", SyntheticModel(layers=6, batch_size=2, width=32, seed=1)),
                     batch_size=2)
    assert plan(mlp, "auto", 2).partition == "optimal"  # not a model card's trace


def test_layers_that_do_not_split_are_refused(card_trace):
    with pytest.raises(ConfigError, match="8 layers do not split equally over 3 pipeline stages"):
        plan(card_trace, "layers", 3)


def test_catches_a_planted_bug(card_trace, monkeypatch):
    """Equal op counts instead of equal layers (the embedding and head ops shift the cuts)."""
    monkeypatch.setattr(ps, "layer_starts", lambda trace, fops, n, layers=None: count_starts(len(fops), n))
    with pytest.raises(AssertionError):
        check_megatron_placement(card_trace, plan(card_trace, "layers", 4))
