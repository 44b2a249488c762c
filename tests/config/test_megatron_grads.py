"""The gradient dtype of an fp16 run, as Megatron-LM derives it (:mod:`triosim.config.megatron_grads`):
``--fp16`` accumulates and reduces gradients in fp16 unless ``--accumulate-allreduce-grads-in-fp32``
is typed, in a pasted line, under the Megatron names and under triosim's own ``--dtype fp16``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_capture import run

from triosim.config.megatron_args import translate_argv
from triosim.trace.precision import default_grad_reduce_dtype

CARD = ["--model", "llama3-8b", "--num-layers", "4", "--gpu", "h100-sxm", "--dp", "2"]
SWITCH = "--accumulate-allreduce-grads-in-fp32"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRIOSIM_CACHE_DIR", str(tmp_path / "cache"))


def result(argv: list[str]) -> dict:
    code, out, err = run(["run", *CARD, *argv, "--json", "-"])
    assert code == 0, err
    return json.loads(out)


def grads(r: dict) -> tuple[str, int, int]:
    """The gradient-reduce dtype, the first GPU's gradient buffer and its data-parallel payload."""
    hybrid = r["hybrid"]
    return (r["precision"]["grad_reduce_dtype"], hybrid["memory"][0]["gradients_bytes"],
            hybrid["collectives_dp0_tp0"]["dp"]["payload_bytes"])


def test_a_pasted_fp16_line_reduces_in_fp16_and_in_fp32_with_the_switch() -> None:
    dtype16, buffer16, wire16 = grads(result(["--megatron-args", "--fp16"]))
    dtype32, buffer32, wire32 = grads(result(["--megatron-args", f"--fp16 {SWITCH}"]))
    assert (dtype16, dtype32) == ("fp16", "fp32")
    assert buffer32 == 2 * buffer16 and wire32 == 2 * wire16 > 0


def test_triosims_own_fp16_default_is_megatrons_and_shown_as_a_default() -> None:
    native = result(["--dtype", "fp16"])
    assert grads(native) == grads(result(["--megatron-args", "--fp16"]))
    assert {"flag": "--grad-reduce-dtype", "value": "fp16",
            "why": f"--dtype fp16, as Megatron-LM's --fp16 without {SWITCH}"} in native["defaults"]
    # the configuration block keeps the flag as given, so a rerun derives the same default
    assert native["config"]["grad-reduce-dtype"] == "auto"
    assert "--grad-reduce-dtype" in native["config"]["defaults_applied"]
    code, out, _ = run(["run", *CARD, "--dtype", "fp16"])
    assert code == 0 and "training in fp16, gradients reduced in fp16" in out
    assert "--grad-reduce-dtype fp16 (--dtype fp16" in out  # among Megatron's defaults
    typed = result(["--dtype", "fp16", "--grad-reduce-dtype", "fp32"])
    assert grads(typed) == grads(result(["--megatron-args", f"--fp16 {SWITCH}"]))
    assert all(d["flag"] != "--grad-reduce-dtype" for d in typed.get("defaults", []))


def test_other_dtypes_keep_fp32_gradients_and_record_no_default() -> None:
    assert [default_grad_reduce_dtype(d) for d in ("fp16", "bf16", "fp32")] == ["fp16", "fp32", "fp32"]
    bf16 = result(["--dtype", "bf16"])
    assert bf16["precision"]["grad_reduce_dtype"] == "fp32"
    assert all(d["flag"] != "--grad-reduce-dtype" for d in bf16.get("defaults", []))
    assert "grad-reduce-dtype" not in bf16["config"]


def test_the_switch_under_megatron_names_outside_a_pasted_line() -> None:
    argv = translate_argv(["run", "--fp16", SWITCH]).argv
    assert argv == ["run", "--dtype", "fp16", "--grad-reduce-dtype", "fp32"]
    assert translate_argv(["run", SWITCH, "--fp16"]).argv == argv  # the dtype may come after it


@pytest.mark.parametrize("line", ["--bf16 " + SWITCH, SWITCH, "--fp8-format hybrid --bf16 " + SWITCH])
def test_the_switch_changes_nothing_where_megatron_reduces_in_fp32_anyway(line: str) -> None:
    translation = translate_argv(["run", "--megatron-args", line])
    assert "--grad-reduce-dtype" not in translation.argv and SWITCH in translation.no_effect


def test_the_switch_against_a_16_bit_gradient_dtype_is_one_line() -> None:
    code, _, err = run(["run", *CARD, "--megatron-args", f"--fp16 {SWITCH}", "--grad-reduce-dtype", "fp16", "-q"])
    assert code == 2 and err.count("\n") == 1 and SWITCH in err, err


def test_a_rerun_from_the_configuration_block_derives_the_same_default(tmp_path: Path) -> None:
    first = tmp_path / "first.json"
    assert run(["run", *CARD, "--dtype", "fp16", "--json", str(first), "-q"])[0] == 0
    code, out, err = run(["run", "--config", str(first), "--json", "-"])
    assert code == 0, err
    assert out == first.read_text()
