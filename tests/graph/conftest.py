"""Fixtures the graph tests share."""

from __future__ import annotations

from dataclasses import replace

import pytest

from triosim.trace.load import load_trace
from triosim.trace.model_card import get_card
from triosim.trace.synthetic_card import CardTraceSpec, write_card_trace

CARD_LAYERS = 8


def small_card_trace(tmp_path_factory, model: str):
    """A ``model``-structured card trace of ``CARD_LAYERS`` small layers (batch 2)."""
    card = replace(get_card(model), layers=CARD_LAYERS, hidden=64, heads=4, kv_heads=4, ffn=256, vocab=100,
                   seq_len=16)
    d = write_card_trace(tmp_path_factory.mktemp("card") / "t", CardTraceSpec(card, 2, 2, CARD_LAYERS))
    return load_trace(d, batch_size=2)


@pytest.fixture(scope="module")
def card_trace(tmp_path_factory):
    """A GPT-3-structured card trace of ``CARD_LAYERS`` small layers (batch 2)."""
    return small_card_trace(tmp_path_factory, "gpt3-175b")


@pytest.fixture(scope="module")
def llama_card_trace(tmp_path_factory):
    """A Llama-3-structured one (its embedding's backward reads only the token ids and a gradient)."""
    return small_card_trace(tmp_path_factory, "llama3-8b")
