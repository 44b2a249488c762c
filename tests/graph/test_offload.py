"""Activation offload to host memory (``--offload-activations``): closed forms.

- Bytes per offloaded layer: what the layer saves for its backward, its input included and its
  output (saved by the next layer) not: Korthikanti et al.'s per-layer terms for a 16-bit GPT
  layer, 34sbh + 5as²b + 16sb.
- Time on one GPU, one micro-batch: the copy of layer 0 overlaps layer 1's forward and its
  return layer 1's backward, so the step grows by exactly max(0, c − F₁) + max(0, c − B₁), c the
  copy's time over the host link.
- Host memory: each offloaded layer's bytes for every micro-batch a stage holds in flight.
Each is checked to catch a planted bug.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from cli_capture import run

import triosim.graph.offload as offload_module
from triosim.compute.op_time import op_seconds
from triosim.config import configure
from triosim.errors import ConfigError
from triosim.graph import build_graph
from triosim.graph.offload import OffloadSpec, offload
from triosim.schedule.list_scheduler import schedule
from triosim.trace.layers import find_layers
from triosim.trace.load import load_trace
from triosim.trace.model_card import get_card
from triosim.trace.synthetic_card import CardTraceSpec, write_card_trace

B, S, H, A = 2, 32, 64, 8
SBH = S * B * H
H100_HOST_LINK = 64e9  # the h100-sxm file's host_link_gbps


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    card = replace(get_card("gpt3-175b"), layers=4, hidden=H, heads=A, kv_heads=A, ffn=4 * H, vocab=100, seq_len=S)
    d = write_card_trace(tmp_path_factory.mktemp("gpt") / "t", CardTraceSpec(card, B, 2, 4))
    return load_trace(d, batch_size=B)


def test_bytes_per_layer(gpt) -> None:
    off = offload(gpt, OffloadSpec(layers=3))
    assert off.layers == (0, 1, 2)  # never the chunk's last layer
    assert off.bytes_per_layer() == [34 * SBH + 5 * A * S * S * B + 16 * S * B] * 3


def test_bytes_catch_a_layer_output_moved(gpt, monkeypatch) -> None:
    """Bug: the layer's output is moved too, though the next layer's backward reads it before
    the reload (a read of data not yet back)."""
    real = offload_module.offload

    def with_output(trace, spec, cuts=frozenset()):
        off = real(trace, spec, cuts)
        layout = find_layers(trace)
        extra = {k: trace.writes[max(layout.forward[k])] for k in off.layers}
        copies = {n: replace(c, buffers=(*c.buffers, *extra[c.layer])) if c.direction == "d2h" else c
                  for n, c in off.copies.items()}
        return replace(off, copies=copies)

    monkeypatch.setattr(offload_module, "offload", with_output)
    off = offload_module.offload(gpt, OffloadSpec(layers=3))
    assert off.bytes_per_layer() != [34 * SBH + 5 * A * S * S * B + 16 * S * B] * 3


def test_fraction_and_count_agree(gpt) -> None:
    assert offload(gpt, OffloadSpec(fraction=0.5)).layers == offload(gpt, OffloadSpec(layers=2)).layers == (0, 1)
    assert offload(gpt, OffloadSpec(fraction=1.0)).layers == (0, 1, 2)


@pytest.fixture(scope="module")
def llama():
    return configure(model="llama3-8b", num_layers=4, seq_len=2048, gpu="h100-sxm", pp=1, global_batch=1,
                     micro_batch_size=1)


def _step_growth(llama) -> tuple[float, float]:
    trace, platform, strategy = llama
    base = schedule(build_graph(trace, platform, strategy)).makespan
    g = build_graph(trace, platform, replace(strategy, offload_activations="1"))
    copy = g.meta["hybrid"]["offload"]["bytes_per_layer"][0] / H100_HOST_LINK
    layout = find_layers(trace)
    f1 = sum(op_seconds(trace, j, 1) for j in layout.forward[1])
    b1 = sum(op_seconds(trace, j, 1) for j in layout.backward[1])
    return schedule(g).makespan - base, max(0.0, copy - f1) + max(0.0, copy - b1)


def test_copies_overlap_the_next_layer(llama) -> None:
    got, want = _step_growth(llama)
    assert want > 0 and got == pytest.approx(want, rel=1e-9)


def test_overlap_closed_form_catches_a_late_reload(llama, monkeypatch) -> None:
    """Bug: the compute stream waits for the reload at once (no overlap with layer 1's backward)."""
    real = offload_module.offload

    def blocking(trace, spec, cuts=frozenset()):
        off = real(trace, spec, cuts)
        return replace(off, copies={n: replace(c, waiter=None) if c.direction == "h2d" else c
                                    for n, c in off.copies.items()})

    monkeypatch.setattr(offload_module, "offload", blocking)
    got, want = _step_growth(llama)
    assert got != pytest.approx(want, rel=1e-9)


def test_host_memory_holds_the_micro_batches_in_flight() -> None:
    """1F1B on 2 stages: stage 0 holds 2 micro-batches' activations at once, so its host peak is
    2 micro-batches × 2 offloaded layers (of its 4)."""
    code, out, err = run(["run", "--model", "llama3-8b", "--num-layers", "8", "--seq-len", "1024", "--gpu", "h100-sxm",
                          "--pp", "2", "--global-batch", "8", "--offload-activations", "2", "--json", "-"])
    assert code == 0, err
    import json

    facts = json.loads(out)["hybrid"]["offload"]
    assert facts["layers"] == [0, 1, 4, 5]
    assert facts["host_peak_bytes"] == 2 * 2 * facts["bytes_per_layer"][0]


@pytest.mark.parametrize("flags,message", [
    (["--offload-activations", "0"], "--offload-activations must be a number of layers"),
    (["--offload-activations", "two"], "--offload-activations must be a number of layers"),
    (["--offload-activations", "1", "--recompute", "full"], "Megatron-Core does not offload activations while"),
    # as many layers as the model has, or more, ran silently as fewer (Megatron-Core refuses them)
    (["--offload-activations", "4"], "the model has 4 transformer layers, and Megatron-Core offloads fewer"),
    (["--offload-activations", "100"], "give at most 3"),
])
def test_refusals(flags, message) -> None:
    code, _, err = run(["run", "--model", "llama3-8b", "--num-layers", "4", "--gpu", "h100-sxm", "--pp", "2", *flags])
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_refused_without_a_host_link() -> None:
    code, _, err = run(["run", "-trace-dir", "sample_trace/gpt-cpu-bs8", "--pp", "2", "--offload-activations", "1"])
    assert code == 2 and err.count("\n") == 1 and "host link" in err, err


def test_spec_parse() -> None:
    assert OffloadSpec.parse("3") == OffloadSpec(layers=3)
    assert OffloadSpec.parse("0.25") == OffloadSpec(fraction=0.25)
    with pytest.raises(ConfigError):
        OffloadSpec.parse("1.5")


def test_plan_refuses_the_pin_run_refuses() -> None:
    """plan --offload-activations 100 on 4 layers recommended a command run refuses."""
    code, _, err = run(["plan", "--model", "llama3-8b", "--num-layers", "4", "--gpu", "h100-sxm", "--gpus", "2",
                        "--global-batch", "2", "-q", "--offload-activations", "100"])
    assert code == 2 and err.count("\n") == 1 and "the model has 4 transformer layers" in err, err
