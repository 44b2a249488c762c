"""plan counts a model card's decoder layers as the pipeline rules do: DeepSeek-V3's dense layers
before its repeated MoE layers are counted (Megatron's num_layers) and must fall on the first
stage, and its MTP layer goes with the loss; the splits plan searches are the ones run accepts."""

from __future__ import annotations

import pytest

import triosim.plan.candidates as cand
from triosim.config.build import configure
from triosim.graph.pipeline.layer_layout import LayerSplit
from triosim.graph.pipeline.stages import card_layer_extras, trace_layers
from triosim.plan.candidates import SearchSpace, layer_facts, layer_splits


@pytest.fixture(scope="module")
def deepseek7():
    """DeepSeek-V3 cut to 7 decoder layers: its 3 dense layers, then 4 MoE layers, and its MTP."""
    trace, _, _ = configure({"model": "deepseek-v3", "num-layers": 7, "gpu": "h100-sxm", "seq-len": 256,
                             "global-batch": 4, "micro-batch-size": 1, "dp": 1})
    return trace


def test_layer_facts_count_megatrons_decoder_layers(deepseek7):
    layers, unit, _ = layer_facts(deepseek7)
    assert (layers, unit) == (7, "transformer layers")
    assert (len(trace_layers(deepseek7)), card_layer_extras(deepseek7)) == (4, (3, 1))


def _space(leading: int) -> SearchSpace:
    return SearchSpace(gpus=2, global_batch=4, layers=7, heads=None, gpus_per_node=8, search_splits=True,
                       leading_layers=leading, mtp_layers=1)


def test_the_splits_searched_are_the_ones_run_accepts(deepseek7):
    """7 layers on 2 ranks: only with the embedding or the loss counted (8 = 4 + 4). Counting the
    loss gives the first stage 4 decoder layers (3 dense + 1 MoE); counting the embedding gives
    it the embedding and 3 (the dense ones). Both are what run builds, stage by stage."""
    splits = layer_splits(_space(3), 2, 1)
    assert set(splits) == {LayerSplit(False, True), LayerSplit(True, False)}
    for split in splits:
        flags = {"model": "deepseek-v3", "num-layers": 7, "gpu": "h100-sxm", "seq-len": 256, "global-batch": 4,
                 "micro-batch-size": 1, "pp": 2,
                 "account-for-embedding-in-pipeline-split": split.account_for_embedding,
                 "account-for-loss-in-pipeline-split": split.account_for_loss}
        configure(flags)  # run accepts it: no ConfigError
    assert cand._counts(_space(3), 2, 1, LayerSplit(False, True)) == (1, 3)


def test_a_split_leaving_the_dense_layers_off_the_first_stage_is_not_searched():
    """4 ranks × ... : with the embedding counted, 8 layers give the first stage 1 decoder layer
    (the embedding takes the other place), fewer than the 3 dense layers: not a candidate."""
    assert LayerSplit(True, False) not in layer_splits(_space(3), 4, 1)
    assert LayerSplit(True, False) in layer_splits(_space(0), 4, 1)  # without leading layers it cuts
