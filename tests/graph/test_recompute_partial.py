"""Recomputation by layer and by module, as Megatron-Core's settings: closed forms.

- Per module set, the bytes a layer keeps into backward are Korthikanti et al. 2022's terms for a
  16-bit GPT layer (standard attention, dropout, GELU, LayerNorm): 34sbh + 5as²b, + 16sb of the
  norms' fp32 statistics. core_attn drops the 5as²b of scores, mask and dropout output; mlp the
  GELU's input and output (16sbh); layernorm the two norm outputs (4sbh) and their statistics.
- full, block N: exactly the first N layers of each model chunk re-run (one forward of each);
  uniform N: every layer re-run, one layer input kept per group of N layers.
Each closed form is checked to catch a planted bug.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from cli_capture import run

import triosim.graph.recompute_units as units
from triosim.errors import ConfigError
from triosim.graph import build_graph
from triosim.graph.recompute import activations_into_backward_bytes, recompute
from triosim.graph.recompute_spec import RecomputeSpec
from triosim.graph.strategy import Strategy
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.trace.layers import find_layers
from triosim.trace.load import load_trace
from triosim.trace.model_card import get_card
from triosim.trace.synthetic_card import CardTraceSpec, write_card_trace

B, S, H, A = 2, 32, 64, 8
SBH = S * B * H


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    """Four 16-bit GPT-3-structured layers at test sizes (FFN 4h, standard attention, dropout)."""
    card = replace(get_card("gpt3-175b"), layers=4, hidden=H, heads=A, kv_heads=A, ffn=4 * H, vocab=100, seq_len=S)
    d = write_card_trace(tmp_path_factory.mktemp("gpt") / "t", CardTraceSpec(card, B, 2, 4))
    return load_trace(d, batch_size=B)


def kept(trace, spec: RecomputeSpec) -> list[int]:
    """Per layer: bytes its forward keeps into backward under ``spec``."""
    layout = find_layers(trace)
    rec = recompute(trace, spec)
    if rec is None:
        return activations_into_backward_bytes(trace, layout.forward)
    return activations_into_backward_bytes(rec.trace, [[rec.new_index[j] for j in f] for f in layout.forward])


def korthikanti(modules: tuple[str, ...]) -> int:
    """Per-layer bytes kept, Korthikanti's terms minus what each recomputed module drops."""
    sbh, scores, stats = 34 * SBH, 5 * A * S * S * B, 16 * S * B
    if "core_attn" in modules:
        scores = 0
    if "mlp" in modules:
        sbh -= 16 * SBH  # GELU input and output, 4h wide, 2 bytes each
    if "layernorm" in modules:
        sbh -= 4 * SBH  # the two norm outputs (the linears' inputs)
        stats = 0
    return sbh + scores + stats


MODULE_SETS = [(), ("core_attn",), ("mlp",), ("layernorm",), ("core_attn", "mlp"), ("mlp", "layernorm"),
               ("core_attn", "mlp", "layernorm")]


def spec_of(modules: tuple[str, ...]) -> RecomputeSpec:
    return RecomputeSpec("selective", modules=modules) if modules else RecomputeSpec("none")


@pytest.mark.parametrize("modules", MODULE_SETS)
def test_module_sets_keep_korthikanti_bytes(gpt, modules) -> None:
    assert kept(gpt, spec_of(modules)) == [korthikanti(modules)] * 4


def test_module_closed_form_catches_a_norm_rerun_that_misses_the_mlp(gpt, monkeypatch) -> None:
    """Bug: the norm re-run is placed at its own reader, after the MLP re-run that reads it (the
    MLP re-run then reads the stored norm output, which the forward must keep)."""
    monkeypatch.setattr(units, "_readers_first", lambda trace, found: found)
    assert kept(gpt, spec_of(("mlp", "layernorm"))) != [korthikanti(("mlp", "layernorm"))] * 4


def _makespan(trace, **recompute_flags) -> float:
    g = build_graph(trace, build_platform(num_gpus=1), Strategy(pp=1, **recompute_flags))
    return schedule(g).makespan


def _forward_s(trace, layers) -> float:
    layout = find_layers(trace)
    return sum(trace.ops[i].duration_s for k in layers for i in layout.forward[k])


def test_block_reruns_the_first_layers_once(gpt) -> None:
    base = _makespan(gpt)
    for n in (1, 3):
        got = _makespan(gpt, recompute="full", recompute_method="block", recompute_num_layers=n)
        assert got - base == pytest.approx(_forward_s(gpt, range(n)), rel=1e-9)
    per = kept(gpt, RecomputeSpec("full", "block", 1))
    assert per == [2 * SBH] + [korthikanti(())] * 3  # the first layer keeps only its input


def test_block_closed_form_catches_the_last_layers_rerun(gpt, monkeypatch) -> None:
    """Bug: block re-runs the chunk's last N layers instead of its first."""
    real = units._full_units

    def last_layers(t, lay, spec, cuts):
        every = real(t, lay, replace(spec, method="uniform", num_layers=1), cuts)
        return every[-spec.num_layers:]

    monkeypatch.setattr(units, "_full_units", last_layers)
    assert kept(gpt, RecomputeSpec("full", "block", 1)) != [2 * SBH] + [korthikanti(())] * 3


def test_uniform_groups_keep_one_input_per_group(gpt) -> None:
    full = _makespan(gpt, recompute="full")
    grouped = _makespan(gpt, recompute="full", recompute_num_layers=2)
    assert grouped == pytest.approx(full, rel=1e-12)  # every layer re-run either way
    assert sum(kept(gpt, RecomputeSpec("full", "uniform", 2))) == 2 * (2 * SBH)  # 4 layers, 2 groups
    assert sum(kept(gpt, RecomputeSpec("full", "uniform", 4))) == 2 * SBH


def test_uniform_closed_form_catches_groups_of_one(gpt, monkeypatch) -> None:
    """Bug: uniform ignores the group size (a checkpoint per layer)."""
    real = units._full_units
    monkeypatch.setattr(units, "_full_units", lambda t, lay, spec, cuts: real(t, lay, replace(spec, num_layers=1),
                                                                               cuts))
    assert sum(kept(gpt, RecomputeSpec("full", "uniform", 2))) != 2 * (2 * SBH)


def test_block_counts_layers_per_model_chunk() -> None:
    """pp 2 × 2 virtual stages of 8 layers: 2 layers a chunk; block 1 re-runs one layer in each
    of the 4 chunks, uniform 2 every layer in 4 groups."""
    common = ["run", "--model", "llama3-8b", "--num-layers", "8", "--seq-len", "256", "--gpu", "h100-sxm", "--pp", "2",
              "--schedule", "interleaved", "--virtual-stages", "2", "--global-batch", "4", "--json", "-"]
    code, out, err = run([*common, "--recompute-num-layers", "1"])
    assert code == 0, err
    facts = json.loads(out)["hybrid"]["recompute"]
    assert (facts["granularity"], facts["method"], facts["num_layers"], facts["units"]) == ("full", "block", 1, 4)
    code, out, err = run([*common, "--recompute", "full", "--recompute-method", "uniform", "--recompute-num-layers",
                          "2"])
    assert code == 0, err
    assert json.loads(out)["hybrid"]["recompute"]["units"] == 4


@pytest.mark.parametrize("spec,message", [
    (dict(granularity="full", method="ring"), "--recompute-method must be uniform or block"),
    (dict(granularity="full", num_layers=0), "--recompute-num-layers must be a positive integer"),
    (dict(granularity="selective", modules=("attn",)), "unknown module 'attn'"),
    (dict(granularity="selective", modules=("moe",)), "recomputing that module is not modelled"),
    (dict(granularity="selective", modules=()), "needs at least one module"),
])
def test_bad_settings_are_one_line(spec, message) -> None:
    with pytest.raises(ConfigError, match=message):
        RecomputeSpec(**spec)


@pytest.mark.parametrize("flags,message", [
    (["--recompute", "selective", "--recompute-num-layers", "2"], "need --recompute full"),
    (["--recompute", "full", "--recompute-modules", "mlp"], "needs --recompute selective"),
    (["--recompute-modules", "mlp,bogus"], "unknown module 'bogus'"),
])
def test_cli_refusals(flags, message) -> None:
    code, _, err = run(["run", "--model", "llama3-8b", "--num-layers", "2", "--gpu", "h100-sxm", "--tp", "2", *flags])
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_cli_names_the_default_method() -> None:
    code, out, err = run(["run", "--model", "llama3-8b", "--num-layers", "2", "--seq-len", "256", "--gpu", "h100-sxm",
                          "--pp", "2", "--global-batch", "4", "--recompute-num-layers", "1", "--json", "-"])
    assert code == 0, err
    flags = {d["flag"]: d["value"] for d in json.loads(out)["defaults"]}
    assert flags["--recompute"] == "full" and flags["--recompute-method"] == "block"


def test_moe_act_drops_the_expert_activation() -> None:
    """moe_act: each MoE layer keeps T·k·f bf16 values fewer (the expert SwiGLU's output, one row
    per token and chosen expert), and re-runs that one op per layer."""
    import tempfile
    from pathlib import Path

    from triosim.trace.card_variants import MoeSpec

    e, k, f = 8, 2, 48
    card = replace(get_card("qwen3-30b-a3b"), layers=2, hidden=H, heads=4, kv_heads=2, head_dim_given=32, ffn=176,
                   vocab=100, seq_len=S, moe=MoeSpec(experts=e, top_k=k, expert_ffn=f))
    d = write_card_trace(Path(tempfile.mkdtemp()) / "t", CardTraceSpec(card, B, 2, 2))
    trace = load_trace(d, batch_size=B)
    base = kept(trace, RecomputeSpec("none"))
    spec = RecomputeSpec("selective", modules=("moe_act",))
    assert [a - b for a, b in zip(base, kept(trace, spec))] == [S * B * k * f * 2] * 2
    assert len(recompute(trace, spec).rerun_ops) == 2
    with pytest.raises(ConfigError, match="needs mixture-of-experts layers"):
        recompute(load_trace(write_card_trace(Path(tempfile.mkdtemp()) / "d", CardTraceSpec(
            replace(card, moe=None), B, 2, 2)), batch_size=B), spec)
