"""Recomputation's detail flags against their granularity, as Megatron-Core checks them: a detail
given with another granularity is one line and exit 2, even when it holds the default value."""

from __future__ import annotations

import pytest

from .cli_capture import run

RUN = ["run", "--model", "llama3-8b", "--num-layers", "2", "--seq-len", "1024", "--gpu", "h100", "--pp", "2",
       "--global-batch", "2", "-q"]


@pytest.mark.parametrize("flags, needle", [
    # Megatron-Core: "recompute_num_layers must be None" / "recompute method is not yet supported"
    # under selective; the values equal to the strategy's defaults slipped through
    (["--recompute", "selective", "--recompute-num-layers", "1"], "need --recompute full"),
    (["--recompute", "selective", "--recompute-method", "uniform"], "need --recompute full"),
    (["--recompute", "full", "--recompute-modules", "core_attn"], "--recompute-modules needs --recompute selective"),
    # a typed --recompute none turned into full recomputation
    (["--recompute", "none", "--recompute-num-layers", "1"], "--recompute-num-layers with --recompute none"),
    (["--recompute", "none", "--recompute-modules", "core_attn"], "--recompute-modules with --recompute none"),
    (["--megatron-args", "--recompute-granularity selective --recompute-num-layers 1"], "need --recompute full"),
])
def test_a_detail_of_another_granularity_is_one_line(flags, needle):
    code, out, err = run([*RUN, *flags])
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_alone_a_detail_still_implies_its_granularity():
    code, alone, _ = run([*RUN, "--recompute-num-layers", "1"])
    assert code == 0
    code, full, _ = run([*RUN, "--recompute", "full", "--recompute-method", "block", "--recompute-num-layers", "1"])
    assert code == 0 and alone == full


def test_megatron_modules_under_full_granularity_are_noted_not_refused():
    """Megatron-Core reads --recompute-modules under selective only (core_attn is its default)."""
    line = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 --recompute-modules core_attn"
    code, pasted, err = run([*RUN, "--megatron-args", line])
    assert code == 0 and "--recompute-modules" in err
    code, native, _ = run([*RUN, "--recompute", "full"])
    assert code == 0 and pasted == native


def test_plan_pins_the_layer_count_as_run_reads_it(tmp_path):
    """`run --recompute-num-layers N` is block recomputation of N layers a chunk; plan pinned it
    as uniform groups of N (every layer re-run), and its commands said so."""
    import csv

    out = tmp_path / "plan.csv"
    code, _, err = run(["plan", "--model", "llama3-8b", "--num-layers", "4", "--seq-len", "1024", "--gpu", "h100",
                        "--gpus", "2", "--global-batch", "2", "-q", "--recompute-num-layers", "1", "--out", str(out)])
    assert code == 0, err
    rows = list(csv.DictReader(out.open()))
    assert rows and {(r["recompute"], r["recompute_method"], r["recompute_num_layers"]) for r in rows} == {
        ("full", "block", "1")}
