"""Hybrid flags on the command line: presets, the JSON ``parallel`` block, derived GPU count
and one-line errors (exit 2) for bad combinations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from triosim.cli.console import main

GPT = str(Path(__file__).resolve().parents[1] / "sample_trace" / "gpt-cpu-bs8")


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("hybrid, case", [
    (["--dp", "8", "--overlap-grad-reduce"], ["-case", "2", "-GPUnumber", "8"]),  # DDP: buckets beside backward
    (["--pp", "4", "-micro-batch-size", "2", "--pipeline-send", "overlapped"],  # the original's sends
     ["-case", "4", "-GPUnumber", "4", "-micro-batch-size", "2"]),
    (["--tp", "4", "--tp-style", "per-op"], ["-case", "3", "-GPUnumber", "4"]),
])
def test_flags_equal_case_presets(capsys, hybrid, case):
    # Under the original network model (exclusive links, one-way ring, no collective latency) a
    # representative's closed form is exactly what the case builders simulate; with max-min
    # sharing multi-hop direct transfers can stretch beyond the fluid closed form.
    old = ["--network", "exclusive", "--collective-algo", "one-way-ring", "--collective-latency-us", "0"]
    _, a, _ = run_cli(capsys, "run", "-trace-dir", GPT, *hybrid, *old, "-q")
    _, b, _ = run_cli(capsys, "run", "-trace-dir", GPT, *case, *old, "-q")
    assert a == b and a.strip()


def test_json_parallel_block_and_derived_gpus(capsys):
    code, out, _ = run_cli(capsys, "run", "-trace-dir", GPT, "--dp", "2", "--tp", "2", "--pp", "2", "--zero", "fsdp",
                           "-micro-batch-size", "4", "--schedule", "1f1b", "--representatives", "--topology", "switch",
                           "--json", "-")
    d = json.loads(out)
    assert code == 0 and d["gpus"] == 8
    assert d["parallel"] == {"dp": 2, "tp": 2, "pp": 2, "zero": 3, "sequence_parallel": False, "schedule": "1f1b",
                             "virtual_stages": 1, "tp_style": d["parallel"]["tp_style"], "rank_order": "tp,pp,dp",
                             "exact": False, "recompute": "none", "cp": 1, "tp_comm_overlap": False,
                             "overlap_grad_reduce": False, "overlap_param_gather": False, "pipeline_send": "blocking",
                             "pipeline_scatter_gather": False}
    assert d["hybrid"]["representatives"] is True and len(d["per_gpu"]) == 2
    code, out, _ = run_cli(capsys, "run", "-trace-dir", GPT, "--dp", "2", "--tp", "2", "--json", "-")
    d = json.loads(out)
    assert d["parallel"]["exact"] is None and d["hybrid"]["representatives"] is False and len(d["per_gpu"]) == 4
    code, out, _ = run_cli(capsys, "run", "-trace-dir", GPT, "-case", "2", "-GPUnumber", "4", "--json", "-")
    assert json.loads(out)["parallel"]["dp"] == 4


@pytest.mark.parametrize("argv, needle", [
    (["--dp", "3", "-GPUnumber", "8"], "-GPUnumber is 8"),
    (["--pp", "500"], "--pp 500"),
    (["--dp", "2", "--zero", "4"], "--zero"),
    (["--zero", "1"], "--zero needs"),
    (["--dp", "2", "--rank-order", "tp,dp"], "--rank-order"),
    (["--dp", "2", "--tp-style", "rows"], "--tp-style"),
    (["--dp", "0"], "--dp must be"),
    (["--dp", "2", "--reference-compat"], "--reference-compat"),
    (["--dp", "2", "--exact", "--representatives"], "exclude each other"),
    (["--pp", "2", "-micro-batch-size", "8", "--schedule", "interleaved", "--virtual-stages", "2"], "interleaved"),
    (["--dp", "2", "--virtual-stages", "2"], "--virtual-stages 2 needs --schedule interleaved"),
])
def test_bad_combinations_exit_2_with_one_line(capsys, argv, needle):
    code, out, err = run_cli(capsys, "run", "-trace-dir", GPT, *argv, "-q")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err
