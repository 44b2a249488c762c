"""Mixed precision (``--dtype bf16|fp16|fp32``, ``--grad-reduce-dtype``) against closed forms:
Megatron's bytes per parameter (18 without, 6 + 12/N with the distributed optimizer, 16 in fp32),
the gradient reduction's traffic in its dtype, and ZeRO-2 saving (N−1)/N of the gradients at the
peak (they are a buffer that exists for the whole iteration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from triosim.config import configure
from triosim.errors import ConfigError
from triosim.graph import composition
from triosim.graph.data.precision import with_training_precision
from triosim.graph.strategy import Strategy
from triosim.hardware.presets import build_platform
from triosim.trace.load import load_trace
from triosim.trace.precision import TrainingPrecision, bytes_per_parameter, elements
from triosim.trace.synthetic_transformer import SyntheticTransformer, write_synthetic_transformer

N = 4


@pytest.fixture(scope="module")
def gpt3_layer(tmp_path_factory) -> Path:
    """One decoder layer of GPT-3 175B's shapes (hidden 12,288, 96 heads, FFN 4h), a short
    sequence so the activations stay small: about 1.8 billion parameters on the stage."""
    model = SyntheticTransformer(layers=1, batch_size=1, seq_len=8, hidden=12288, heads=96, vocab=64)
    return write_synthetic_transformer(tmp_path_factory.mktemp("gpt3") / "layer", model)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    model = SyntheticTransformer(layers=2, batch_size=4, seq_len=16, hidden=64, heads=4, vocab=128)
    return write_synthetic_transformer(tmp_path_factory.mktemp("small") / "gpt", model)


def _hybrid(path: Path, **flags) -> dict:
    trace, platform, strategy = configure(trace_dir=str(path), **flags)
    g = composition.build(trace, platform, strategy)
    return {"trace": trace, "memory": g.meta["hybrid"]["memory"][0], "meta": g.meta["hybrid"]}


def _held(m: dict) -> int:
    return m["weights_bytes"] + m["gradients_bytes"] + m["optimizer_bytes"]


def _parameters(trace) -> int:
    return sum(elements(trace.tensors[p]) for p in trace.parameters)


def test_bf16_is_18_bytes_per_parameter_on_a_gpt3_layer(gpt3_layer):
    got = _hybrid(gpt3_layer, dp=1, dtype="bf16")
    params = _parameters(got["trace"])
    assert params > 1.8e9
    assert _held(got["memory"]) / params == pytest.approx(18.0, abs=1e-6)
    assert _held(got["memory"]) / params == bytes_per_parameter(TrainingPrecision("bf16"))
    assert got["memory"]["weights_bytes"] == 2 * params and got["memory"]["gradients_bytes"] == 4 * params


def test_distributed_optimizer_is_6_plus_12_over_n(gpt3_layer):
    got = _hybrid(gpt3_layer, dp=N, zero=1, dtype="bf16")
    params = _parameters(got["trace"])
    assert _held(got["memory"]) / params == pytest.approx(6 + 12 / N, abs=1e-6)


def test_fp32_is_16_bytes_per_parameter(gpt3_layer):
    got = _hybrid(gpt3_layer, dp=1, dtype="fp32")
    assert _held(got["memory"]) / _parameters(got["trace"]) == pytest.approx(16.0, abs=1e-6)


def test_16_bit_gradients_are_megatrons_20_and_4_plus_16_over_n(gpt3_layer):
    """Megatron's 20 and 4 + 16/N bytes per parameter with 16-bit gradients, at the optimizer
    step: the fp32 copy of the gradients (4, or 4/N sharded) exists from the step on only
    (``main_param.grad = model_grad.float()``, dropped by the next ``zero_grad``), so the
    iteration holds 16 and 4 + 12/N throughout and the step adds the copy (this layer's
    activations are gone by then: the peak is the step's)."""
    for zero, dp, want in ((0, 1, 20.0), (1, N, 4 + 16 / N)):
        got = _hybrid(gpt3_layer, dp=dp, zero=zero, dtype="bf16", grad_reduce_dtype="bf16")
        params = _parameters(got["trace"])
        assert got["memory"]["peak_bytes"] / params == pytest.approx(want, abs=1e-6)
        assert _held(got["memory"]) / params == pytest.approx(want - 4 / dp, abs=1e-6)
        assert bytes_per_parameter(TrainingPrecision("bf16", "bf16"), zero, dp) == want


def test_tensor_parallel_shards_the_state_matched_by_elements(small):
    """Under TP each rank holds its shard of weights, fp32 gradients and state: still 18 B per
    parameter it holds (the state found by element count, not bytes, as a bf16 weight and its
    fp32 moments differ in bytes)."""
    got = _hybrid(small, tp=2, dtype="bf16")
    held_params = got["memory"]["weights_bytes"] / 2
    assert held_params < _parameters(got["trace"])  # some parameters are sharded
    assert _held(got["memory"]) / held_params == pytest.approx(18.0, rel=1e-3)


def test_gradient_reduction_traffic_doubles_from_bf16_to_fp32(small):
    traffic = {}
    for reduce in ("bf16", "fp32"):
        got = _hybrid(small, dp=N, dtype="bf16", grad_reduce_dtype=reduce)
        traffic[reduce] = got["meta"]["collectives_dp0_tp0"]["dp"]["payload_bytes"]
    assert traffic["fp32"] == 2 * traffic["bf16"]
    assert traffic["bf16"] == 2 * _parameters(got["trace"])


def test_zero2_saves_n_minus_1_over_n_of_the_gradients_at_the_peak(small):
    """B1: the gradient buffer exists for the whole iteration, so sharding it lowers the peak by
    exactly what it takes off the gradients, whichever step the peak falls on."""
    z1 = _hybrid(small, dp=N, zero=1, dtype="bf16")["memory"]
    z2 = _hybrid(small, dp=N, zero=2, dtype="bf16")["memory"]
    grads = z1["gradients_bytes"]
    assert grads > 0
    assert z1["peak_bytes"] - z2["peak_bytes"] == grads - z2["gradients_bytes"]
    assert grads - z2["gradients_bytes"] == pytest.approx(grads * (N - 1) / N, rel=1e-3)
    assert z1["activations_peak_bytes"] == z2["activations_peak_bytes"]


def test_activations_halve_and_integers_keep_their_size(small):
    traced = load_trace(small)
    resized = with_training_precision(traced, TrainingPrecision("bf16"))
    for tid, t in traced.tensors.items():
        r = resized.tensors[tid]
        if t.each_byte == 8:  # token indices, targets
            assert r.bytes == t.bytes
        elif tid not in traced.batch_invariant:
            assert r.bytes == t.bytes // 2


def test_auto_keeps_the_traced_sizes(small):
    trace = configure(trace_dir=str(small), dp=2)[0]
    assert trace.precision is None and not trace.preallocated
    assert with_training_precision(trace, None) is trace


def test_grad_reduce_dtype_needs_a_training_dtype(small):
    with pytest.raises(ConfigError, match="--grad-reduce-dtype bf16 needs a training dtype"):
        configure(trace_dir=str(small), dp=2, grad_reduce_dtype="bf16")


def test_single_gpu_and_presets_hold_the_gradient_buffer_from_the_start(small):
    """Case 0 (its own planner) and the composition agree on the peak under a training dtype."""
    from triosim.graph.single import build as build_single

    trace = with_training_precision(load_trace(small), TrainingPrecision("bf16"))
    one = build_single(trace, build_platform(num_gpus=1), Strategy())
    composed = composition.build(trace, build_platform(num_gpus=1), Strategy(dp=1))
    assert one.meta["memory"][0]["peak_bytes"] == composed.meta["memory"][0]["peak_bytes"]


def test_a_model_card_trains_at_18_bytes_per_parameter(tmp_path, monkeypatch) -> None:
    """A card's trace keeps Adam's moments in fp32 beside 16-bit weights: the master copy still
    lands on them (2 + 4 + 12 bytes per parameter)."""
    from triosim import simulate
    from triosim.config import configure

    monkeypatch.setenv("TRIOSIM_CACHE_DIR", str(tmp_path))
    result = simulate(*configure({"model": "gpt-neo-1.3b", "gpu": "a100-80gb", "tp": 1, "num-layers": 2,
                                  "seq-len": 128, "global-batch": 1, "micro-batch-size": 1}))
    stage = result.graph.meta["hybrid"]["memory"][0]
    params = stage["weights_bytes"] / 2
    assert stage["gradients_bytes"] / params == 4
    assert stage["optimizer_bytes"] / params == pytest.approx(12, abs=1e-6)


def test_one_gpu_holds_the_fp32_gradient_copy_only_at_the_step(tmp_path) -> None:
    """One GPU, activations above 4 bytes a parameter (the peak is in the passes): 16-bit
    gradients save their buffer's 2 bytes a parameter at the peak, as the fp32 gradient copy the
    optimizer step makes is not held then (held throughout, they would cost 2 more, not 2 fewer)."""
    from triosim.simulation import simulate

    d = write_synthetic_transformer(tmp_path / "s", SyntheticTransformer(layers=2, batch_size=16, seq_len=64,
                                                                         hidden=64, heads=4, vocab=128))
    peaks = {}
    for grads in ("fp32", "bf16"):
        trace, platform, strategy = configure(trace_dir=str(d), dtype="bf16", grad_reduce_dtype=grads)
        peaks[grads] = simulate(trace, platform, strategy).graph.meta["memory"][0]["peak_bytes"]
        params = _parameters(trace)
    assert peaks["fp32"] - peaks["bf16"] == 2 * params
