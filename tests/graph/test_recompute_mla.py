"""``--recompute-modules mla_up_proj`` (Megatron-Core's recomputation of multi-head latent
attention's up projections): closed forms of what a layer stops keeping and what it re-runs."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from triosim.errors import ConfigError
from triosim.graph.recompute import recompute
from triosim.graph.recompute_spec import RecomputeSpec
from triosim.trace.card_variants import MlaSpec
from triosim.trace.load import load_trace
from triosim.trace.model_card import get_card
from triosim.trace.synthetic_card import CardTraceSpec, write_card_trace

from .test_recompute_partial import kept

B, S, H, HEADS, D, R, V = 2, 32, 64, 4, 16, 8, 12


def _trace(card):
    d = write_card_trace(Path(tempfile.mkdtemp()) / "t", CardTraceSpec(card, B, 2, 2))
    return load_trace(d, batch_size=B)


def test_mla_up_proj_drops_queries_keys_and_values() -> None:
    """Each layer stops keeping the attention core's inputs: the rotated queries and the joined
    keys (H·(d + r) each) and the values' half of the kv up projection's output (H·(d + v) wide,
    the buffer the value view reads), 16-bit: 2·b·s·H·(2(d + r) + d + v) bytes; it re-runs the two
    up projections, the two rotary products and the key join (5 ops), in the two layers and in
    the MTP layer (whose input norm reads a linear, the MTP projection, of no norm: not a latent).
    The normed latents, the projections' inputs, stay kept."""
    card = replace(get_card("deepseek-v3"), layers=2, hidden=H, heads=HEADS, kv_heads=HEADS, head_dim_given=D,
                   ffn=96, vocab=100, seq_len=S, moe=None,
                   mla=MlaSpec(q_lora_rank=24, kv_lora_rank=20, rope_head_dim=R, v_head_dim=V))
    trace = _trace(card)
    base = kept(trace, RecomputeSpec("none"))
    spec = RecomputeSpec("selective", modules=("mla_up_proj",))
    drop = 2 * B * S * HEADS * (2 * (D + R) + D + V)
    assert [a - b for a, b in zip(base, kept(trace, spec))] == [drop] * 2
    assert card.mtp_layers == 1 and len(recompute(trace, spec).rerun_ops) == 5 * 3


def test_mla_up_proj_needs_latent_attention() -> None:
    """A model without MLA (Qwen3: its query/key norms read linear outputs, as MLA's latent norms
    do, but no linear follows them) is refused in one line."""
    card = replace(get_card("qwen3-30b-a3b"), layers=2, hidden=H, heads=4, kv_heads=2, head_dim_given=16, ffn=96,
                   vocab=100, seq_len=S, moe=None)
    with pytest.raises(ConfigError, match="needs multi-head latent attention"):
        recompute(_trace(card), RecomputeSpec("selective", modules=("mla_up_proj",)))


def test_core_attention_recompute_on_latent_attention_says_it_is_not_modelled() -> None:
    """Megatron-Core's default selective module (core_attn) and mlp on an MLA model: not modelled,
    and the one line says so and what to use, not that the trace has no attention."""
    card = replace(get_card("deepseek-v3"), layers=2, hidden=H, heads=HEADS, kv_heads=HEADS, head_dim_given=D,
                   ffn=96, vocab=100, seq_len=S, moe=None,
                   mla=MlaSpec(q_lora_rank=24, kv_lora_rank=20, rope_head_dim=R, v_head_dim=V))
    trace = _trace(card)
    for modules in (("core_attn",), ("mlp",)):
        with pytest.raises(ConfigError, match=f"--recompute-modules {modules[0]}.* is not modelled with multi-head "
                                              "latent attention.*mla_up_proj"):
            recompute(trace, RecomputeSpec("selective", modules=modules))
