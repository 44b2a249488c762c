"""The mixture-of-experts cards: total and active parameters from their shapes against the
published counts (≤ 2 %), the closed forms of an MoE layer's parameters, and bad MoE fields
refused in one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from triosim.errors import ConfigError
from triosim.safe_yaml import parse_yaml_text
from triosim.trace.card_variants import MOE_KEYS, MoeSpec
from triosim.trace.model_card import ModelCard, packaged_dir, parse_card, shipped_cards

MOE_CARDS = ("mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b")


def check_published_counts(name: str) -> None:
    card = shipped_cards()[name]
    assert card.moe is not None
    assert abs(card.parameter_count() / card.published_params - 1) <= 0.02
    assert abs(card.active_parameter_count() / card.published_active_params - 1) <= 0.02


@pytest.mark.parametrize("name", MOE_CARDS)
def test_total_and_active_parameters_match_the_published_counts(name: str) -> None:
    check_published_counts(name)


def test_count_check_catches_active_counted_with_every_expert(monkeypatch) -> None:
    """Planted bug: every routed expert counted as active (Mixtral 8x7B: 46.7B, not 12.9B)."""
    monkeypatch.setattr(ModelCard, "active_parameter_count", ModelCard.parameter_count)
    with pytest.raises(AssertionError):
        check_published_counts("mixtral-8x7b")


def test_count_check_catches_the_shared_expert_left_out(monkeypatch) -> None:
    """Planted bug: the shared expert not counted (DeepSeek-V3's active count 7 % low)."""
    from triosim.trace import model_card
    real = model_card.moe_mlp_params
    monkeypatch.setattr(model_card, "moe_mlp_params", lambda h, moe, act, bias, experts=None: real(
        h, replace(moe, shared_experts=0), act, bias, experts))
    with pytest.raises(AssertionError):
        check_published_counts("deepseek-v3")


def test_count_check_catches_head_dim_taken_as_hidden_over_heads() -> None:
    """Planted bug: Qwen3 235B's 128-wide heads taken as hidden / heads = 64 (the total 1.4 %
    low, within 2 %, but the active count 15 % low: the active check catches it)."""
    card = shipped_cards()["qwen3-235b-a22b"]
    wrong = replace(card, head_dim_given=None)
    assert abs(wrong.active_parameter_count() / card.published_active_params - 1) > 0.02


def test_every_moe_number_has_a_source() -> None:
    for name in MOE_CARDS:
        card = shipped_cards()[name]
        defaults = MoeSpec(1, 1, 1)  # a key at its default may go without a source
        given = [f"moe.{k}" for k in MOE_KEYS if getattr(card.moe, k) != getattr(defaults, k)]
        given += [f"mla.{k}" for k in ("q_lora_rank", "kv_lora_rank", "rope_head_dim", "v_head_dim") if card.mla]
        given += ["published_active_params"] + (["head_dim"] if card.head_dim_given else [])
        assert not [k for k in given if k not in card.sources], name


def test_moe_layer_closed_form() -> None:
    """Qwen3 30B-A3B: a layer = 2 norms + attention (q 32·128, kv 4·128) + router + 128 SwiGLU experts."""
    c = shipped_cards()["qwen3-30b-a3b"]
    h, e, f = 2048, 128, 768
    attention = h * 4096 * 2 + 2 * h * 512
    assert c.layer_parameters(0) == 2 * h + attention + h * e + e * 3 * h * f
    assert c.layer_parameters(0, 8) == 2 * h + attention + h * e + 8 * 3 * h * f


def test_deepseek_dense_layers_mla_and_mtp() -> None:
    c = shipped_cards()["deepseek-v3"]
    assert [c.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert c.moe_layers == 58 and not c.uniform_layers
    h = 7168
    mla = (h * 1536 + 1536 + 1536 * 128 * 192 + h * 576 + 512 + 512 * 128 * 256 + 128 * 128 * h)
    assert c.layer_parameters(0) == 2 * h + mla + 3 * h * 18432
    # README_WEIGHTS.md of deepseek-ai/DeepSeek-V3: the MTP module has 11.5B parameters of its own
    assert abs(c.mtp_parameter_count() / 11.5e9 - 1) < 0.02


def test_gpt_oss_alternates_sliding_and_full_attention() -> None:
    c = shipped_cards()["gpt-oss-120b"]
    assert c.sliding_window is not None and c.sliding_window.window == 128
    assert [c.sliding_window.is_sliding(i) for i in range(4)] == [True, False, True, False]


GOOD = (packaged_dir() / "qwen3-30b-a3b.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize("old,new,message", [
    ("  top_k: 8\n", "  top_k: 200\n", "moe.top_k: 200 is more than the 128 experts"),
    ("  experts: 128\n", "  expert: 128\n", "moe: unknown key 'expert'"),
    ("  top_k: 8\n", "", "moe: missing key 'top_k'"),
    ("  router: softmax\n", "  router: relu\n", "moe.router: must be one of softmax, sigmoid"),
    ("  aux_loss: 0.001\n", "  aux_loss: .nan\n", "moe.aux_loss: must be a number from 0 to 100"),
    ("  every: 1\n", "  every: 1\n  first_dense: 48\n", "moe.first_dense: 48 leaves no MoE layer of the 48"),
    ("head_dim: 128\n", "head_dim: 0\n", "head_dim: must be a whole number from 1"),
])
def test_bad_moe_fields_are_one_line(old: str, new: str, message: str) -> None:
    assert old in GOOD
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_card("card.yaml", parse_yaml_text(GOOD.replace(old, new, 1), "card.yaml"))
