"""Sequence parallelism's split of the tokens over the tensor-parallel ranks: Megatron-Core's
``scatter_to_sequence_parallel_region`` asserts that each context rank's tokens divide by tp, so a
card run whose sequence does not is refused in one line (it ran on fractional tokens)."""

from __future__ import annotations

import pytest

from .cli_capture import run

RUN = ["run", "--model", "llama3-8b", "--num-layers", "1", "--gpu", "h100", "--global-batch", "1", "-q"]


@pytest.mark.parametrize("flags, needle", [
    (["--gpus", "4", "--tp", "4", "--seq-len", "1026"], "the sequence's 1,026 tokens over --tp 4"),
    (["--gpus", "8", "--tp", "4", "--cp", "2", "--seq-len", "1028"],
     "each of the --cp 2 context ranks' 514 tokens over --tp 4: not a multiple (Megatron-Core requires it; use a "
     "--seq-len that is a multiple of 8)"),
])
def test_tokens_that_do_not_split_over_tp_are_refused(flags, needle):
    code, out, err = run([*RUN, "--sequence-parallel", *flags])
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err


def test_the_same_sequence_without_sequence_parallelism_runs():
    code, _, err = run([*RUN, "--gpus", "4", "--tp", "4", "--seq-len", "1026"])
    assert code == 0, err
    code, _, err = run([*RUN, "--sequence-parallel", "--gpus", "4", "--tp", "4", "--seq-len", "1028"])
    assert code == 0, err


OSS = ["--model", "gpt-oss-120b", "--num-layers", "2", "--gpu", "h100", "--seq-len", "2048", "--global-batch", "2"]


def test_ring_attention_refuses_sliding_window_layers():
    """Transformer Engine's p2p context parallelism asserts no sliding window: gpt-oss-120b's
    sliding layers ran as ring attention; a2a and allgather run them."""
    code, out, err = run(["run", *OSS, "--gpus", "2", "--cp", "2", "-q"])
    assert code == 2 and out == "" and err.count("\n") == 1 and "use --cp-comm-type a2a or allgather" in err, err
    code, _, err = run(["run", *OSS, "--gpus", "2", "--cp", "2", "--cp-comm-type", "a2a", "-q"])
    assert code == 0, err


def test_plan_pins_no_ring_on_sliding_window_layers():
    code, _, err = run(["plan", *OSS, "--gpus", "2", "--cp", "2", "-q"])
    assert code == 2 and err.count("\n") == 1 and "sliding-window attention layers do not run as ring" in err, err


def test_plan_searches_no_ring_on_sliding_window_layers(tmp_path):
    """At 4,096 tokens cp 2 cuts chunks of 1,024: the plan searched it on gpt-oss-120b."""
    import csv

    out = tmp_path / "p.csv"
    code, _, err = run(["plan", *OSS, "--seq-len", "4096", "--gpus", "2", "-q", "--out", str(out)])
    assert code == 0, err
    rows = list(csv.DictReader(out.open()))
    assert rows and {r["cp"] for r in rows} == {"1"}
