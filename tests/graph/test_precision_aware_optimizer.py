"""Megatron-Core's precision-aware optimizer (``--use-precision-aware-optimizer`` with
``--exp-avg-dtype``, ``--exp-avg-sq-dtype``, ``--main-params-dtype``, ``--main-grads-dtype``):
the optimizer state's bytes per parameter in the simulated memory equal the closed form, the
optimizer step moves the bytes its kernel does, and what Megatron-Core refuses is one line."""

from __future__ import annotations

import csv

import pytest

import triosim.trace.precision as tp
from triosim import simulate
from triosim.config import configure
from triosim.trace.precision import (
    OptimizerDtypes,
    TrainingPrecision,
    bytes_per_parameter,
    optimizer_step_bytes,
)

from ..cli_capture import run

BF16_MOMENTS = OptimizerDtypes(True, exp_avg="bf16", exp_avg_sq="bf16")


@pytest.mark.parametrize("optimizer, grads, want", [
    (OptimizerDtypes(), "fp32", 18),  # Megatron's table: bf16 weights, fp32 gradients
    (OptimizerDtypes(True), "fp32", 2 + 4 + 2 + 8),  # the fp32 master kept as its 16-bit remainder
    (BF16_MOMENTS, "fp32", 2 + 4 + 2 + 4),
    (BF16_MOMENTS, "bf16", 2 + 2 + 4 + 2 + 4),  # the optimizer still makes the gradient's fp32 copy
    (OptimizerDtypes(True, "bf16", "fp32", "bf16", "bf16"), "bf16", 2 + 2 + 2 + 4),  # ... not with bf16 main grads
    (OptimizerDtypes(True, "fp32", "fp16", "fp8", "bf16"), "fp32", 2 + 4 + 2 + 1 + 2),
])
def test_bytes_per_parameter(optimizer, grads, want):
    assert bytes_per_parameter(TrainingPrecision("bf16", grads, optimizer=optimizer)) == want


def test_fp16_weights_keep_a_whole_fp32_master():
    """The remainders hold only under bf16: an fp16 run keeps the fp32 master weight."""
    assert TrainingPrecision("fp16", optimizer=BF16_MOMENTS).master_weight_bytes == 4
    assert TrainingPrecision("fp16", optimizer=OptimizerDtypes(True, main_params="fp16")).master_weight_bytes == 2


def test_the_step_moves_what_fused_adam_moves():
    """bf16 weights and gradients, bf16 main gradients and moments: read the norm's gradient (2),
    the master remainder and the weight (2 + 2), the gradient (2) and both moments (4); write
    remainder, moments, weight and the zeroed gradient (2 + 4 + 2 + 2)."""
    p = TrainingPrecision("bf16", "bf16", optimizer=OptimizerDtypes(True, "bf16", "fp32", "bf16", "bf16"))
    step = optimizer_step_bytes(p)
    assert (step.read, step.written) == (12, 10)
    default = optimizer_step_bytes(TrainingPrecision("bf16"))
    assert (default.read, default.written) == (24, 18)  # 42 bytes, Megatron's step as before


def _stage(tmp_path, monkeypatch, **flags):
    monkeypatch.setenv("TRIOSIM_CACHE_DIR", str(tmp_path))
    result = simulate(*configure({"model": "gpt-neo-1.3b", "gpu": "a100-80gb", "tp": 1, "num-layers": 2,
                                  "seq-len": 128, "global-batch": 1, "micro-batch-size": 1, "zero": 1, **flags}))
    return result.graph.meta["hybrid"]["memory"][0], result


def test_the_simulated_optimizer_state_is_the_closed_form(tmp_path, monkeypatch):
    """A card's two layers: 12 bytes of optimizer state a parameter by default, 2 + 4 = 6 with
    bf16 moments and the master kept as remainders, 2 + 1 + 2 with an fp16 master and fp8/bf16
    moments; weights and gradients as before."""
    base, _ = _stage(tmp_path, monkeypatch)
    params = base["weights_bytes"] / 2
    assert base["optimizer_bytes"] / params == pytest.approx(12, abs=1e-6)
    aware, result = _stage(tmp_path, monkeypatch, **{"use-precision-aware-optimizer": True, "exp-avg-dtype": "bf16",
                                                     "exp-avg-sq-dtype": "bf16"})
    assert aware["optimizer_bytes"] / params == pytest.approx(6, abs=1e-6)
    assert (aware["weights_bytes"], aware["gradients_bytes"]) == (base["weights_bytes"], base["gradients_bytes"])
    assert result.graph.meta["precision"]["optimizer"] == {
        "precision_aware": True, "main_grads_dtype": "fp32", "main_params_dtype": "fp32", "exp_avg_dtype": "bf16",
        "exp_avg_sq_dtype": "bf16", "master_weight_bytes": 2, "moment_bytes": 4}
    mixed, _ = _stage(tmp_path, monkeypatch, **{"use-precision-aware-optimizer": True, "main-params-dtype": "fp16",
                                                "exp-avg-dtype": "fp8", "exp-avg-sq-dtype": "bf16"})
    assert mixed["optimizer_bytes"] / params == pytest.approx(5, abs=1e-6)


def test_the_memory_check_catches_a_planted_bug(tmp_path, monkeypatch):
    """Planted: the moments kept in fp32 whatever their flags say."""
    monkeypatch.setattr(tp.OptimizerDtypes, "moment_bytes", property(lambda self: 8))
    with pytest.raises(AssertionError):
        test_the_simulated_optimizer_state_is_the_closed_form(tmp_path, monkeypatch)


CARD = ["run", "--model", "gpt-neo-1.3b", "--num-layers", "2", "--seq-len", "128", "--gpu", "a100-80gb",
        "--global-batch", "1", "--dp", "1", "--zero", "1", "-q"]


@pytest.mark.parametrize("argv, needle", [
    (["--exp-avg-dtype", "bf16"], "--exp-avg-dtype bf16 needs --use-precision-aware-optimizer"),
    (["--main-grads-dtype", "bf16"], "--main-grads-dtype bf16 needs --use-precision-aware-optimizer"),
    (["--use-precision-aware-optimizer", "--dtype", "fp32"], "needs a 16-bit training dtype"),
    (["--use-precision-aware-optimizer", "--main-params-dtype", "bf16"], "invalid choice: 'bf16'"),
    # Megatron-Core: "--use-precision-aware-optimizer only supported with distributed optimizer"
    (["--use-precision-aware-optimizer", "--zero", "0"], "needs the distributed optimizer (--zero 1 or more)"),
])
def test_refusals_are_one_line(argv, needle):
    code, out, err = run([*CARD, *argv])
    assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_megatron_names_pass_through(tmp_path):
    native = run([*CARD, "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"])
    pasted = run([*CARD, "--megatron-args", "--use-precision-aware-optimizer --exp-avg-dtype bf16 "
                  "--exp-avg-sq-dtype bf16"])
    assert native[0] == 0 and native[1] == pasted[1]


def test_plan_searches_it_only_with_the_distributed_optimizer(tmp_path):
    """Megatron-Core runs the precision-aware optimizer only in the distributed optimizer: a plan
    given the switch never offers ZeRO 0, and its choice runs."""
    out = tmp_path / "plan.csv"
    code, _, err = run(["plan", "--model", "gpt-neo-1.3b", "--num-layers", "2", "--seq-len", "128", "--gpu",
                        "a100-80gb", "--gpus", "2", "--global-batch", "2", "--use-precision-aware-optimizer",
                        "--exp-avg-dtype", "bf16", "--top", "1", "--out", str(out), "-q"])
    assert code == 0, err
    rows = list(csv.DictReader(out.open()))
    assert rows and {r["zero"] for r in rows} <= {"1", "2", "3"} and rows[0]["status"] == "dag"
