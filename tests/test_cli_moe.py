"""Mixture-of-experts runs from the command line: the issue's command forms as written, the
expert groups, what the summary and JSON say, and the one-line refusals."""

from __future__ import annotations

import json

import pytest
from cli_capture import run as run_argv

from triosim.graph.expert.dispatch import edp_group, ep_group
from triosim.graph.rank_map import RankMap

CARD = ["--model", "qwen3-30b-a3b", "--num-layers", "2", "--gpu", "h100-sxm", "--seq-len", "512"]


def run(*argv: str) -> tuple[int, str, str]:
    return run_argv(list(argv))


def test_expert_groups_fold_over_tp_and_dp() -> None:
    """tp 2 × dp 4 on one stage, ep 4: expert groups are 4 consecutive flattened ranks (tp
    innermost), the expert-data-parallel groups the ranks 4 apart."""
    ranks = RankMap(dp=4, tp=2, pp=2, order=("tp", "dp", "pp"))
    assert ep_group(ranks, 4, 0, 0, 0) == (0, 1, 2, 3) and ep_group(ranks, 4, 3, 1, 1) == (12, 13, 14, 15)
    assert edp_group(ranks, 4, 0, 1, 0) == (1, 5) and edp_group(ranks, 4, 2, 0, 1) == (8, 12)


def test_the_gpt_oss_command_form_runs_as_written() -> None:
    code, out, err = run("run", "--model", "gpt-oss-120b", "--gpu", "h100-sxm", "--topology-file",
                         "topologies/dgx-h100-superpod.yaml", "--dp", "16", "--pp", "4", "--ep", "8",
                         "--global-batch", "512", "-micro-batch-size", "4", "--seq-len", "4096", "--dtype", "bf16", "-q")
    assert code == 0, err
    assert float(out.strip()) > 0


def test_summary_and_json_know_the_experts() -> None:
    code, out, err = run("run", *CARD, "--dp", "8", "--ep", "4", "--json", "-")
    assert code == 0, err
    d = json.loads(out)
    assert d["parallel"]["ep"] == 4 and d["parallel"]["moe_token_dispatcher"] == "alltoall"
    facts = d["hybrid"]["expert_parallel"]
    assert facts["ep"] == 4 and facts["edp"] == 2 and facts["local_experts"] == 32 and facts["top_k"] == 8
    assert facts["routed_bytes_per_layer"] == 512 * 8 * 2048 * 2
    assert "exposed_ep_ms" in json.dumps(d)
    code, out, err = run("run", *CARD, "--dp", "8", "--ep", "4")
    assert code == 0 and "expert parallel: ep 4 × edp 2" in out and "exposed EP" in out


def test_megatron_names_translate() -> None:
    native = run("run", *CARD, "--dp", "8", "--ep", "4", "--moe-token-dispatcher", "allgather", "-q")
    alias = run("run", *CARD, "--dp", "8", "--megatron-args",
                "--expert-model-parallel-size 4 --moe-token-dispatcher-type allgather", "-q")
    assert native[0] == 0 and native == alias
    native = run("run", *CARD, "--dp", "8", "--ep", "4", "--etp", "2", "-q")
    alias = run("run", *CARD, "--dp", "8", "--megatron-args",
                "--expert-model-parallel-size 4 --expert-tensor-parallel-size 2 --moe-token-dispatcher-type alltoall",
                "-q")
    assert native[0] == 0 and native == alias


def test_a_pasted_moe_line_runs_megatron_lms_defaults() -> None:
    """Megatron-LM sets --expert-tensor-parallel-size to the tensor-parallel size when a line does
    not give it, and dispatches by all-gather without --moe-token-dispatcher-type; triosim's own
    defaults are etp 1 and alltoall (Megatron-Bridge's recipes give both). All-gather with expert
    tensor parallelism is not modelled: refused in one line that names the way out."""
    line = "--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 4"
    mesh = ["--dp", "4", "--tp", "2", "--sequence-parallel", "--ep", "4"]
    pasted = run("run", *CARD, "--dp", "4", "--megatron-args", line + " --moe-token-dispatcher-type alltoall", "-q")
    native = run("run", *CARD, *mesh, "--etp", "2", "-q")
    assert pasted[0] == 0 and pasted[1] == native[1]
    assert pasted[1] != run("run", *CARD, *mesh, "-q")[1]
    code, _, err = run("run", *CARD, "--dp", "4", "--megatron-args", line, "-q")
    assert code == 2 and "default token dispatcher, allgather, with expert tensor parallelism 2" in err
    assert len(err.strip().splitlines()) == 1
    given = run("run", *CARD, "--dp", "4", "--megatron-args", line + " --expert-tensor-parallel-size 1", "-q")
    assert given[0] == 0 and given[1] == run("run", *CARD, *mesh, "--moe-token-dispatcher", "allgather", "-q")[1]


@pytest.mark.parametrize("argv,message", [
    (["--dp", "8", "--ep", "3"], "--ep 3 must divide the 128 routed experts"),
    (["--dp", "8", "--ep", "16"], "--ep 16 must divide the tp x cp x dp = 8 GPUs"),
    (["--dp", "8", "--ep", "4", "--moe-imbalance", "0.5"], "--moe-imbalance must be a number from 1"),
    (["--dp", "8", "--ep", "4", "--moe-token-dispatcher", "deepep"], "invalid choice"),
    (["--ep", "4"], "--ep needs the degrees of a hybrid run"),
    (["--dp", "8", "--ep", "4", "--zero", "3"], "--zero 3 (FSDP) with a mixture-of-experts model"),
    (["--dp", "8", "--ep", "4", "--etp", "4"], "--ep 4 x --etp 4 must divide the tp x cp x dp = 8 GPUs"),
    (["--dp", "8", "--ep", "4", "--etp", "2", "--moe-token-dispatcher", "flex"], "--etp 2 with --moe-token-dispatcher"),
    # Megatron-Core's ModelParallelConfig: expert and tensor parallelism together need sequence parallelism
    (["--dp", "4", "--tp", "2", "--ep", "4"], "--ep 4 with --tp 2 needs --sequence-parallel"),
])
def test_refusals_are_one_line(argv: list[str], message: str) -> None:
    code, out, err = run("run", *CARD, *argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_a_dense_model_has_no_experts_to_split() -> None:
    code, out, err = run("run", "--model", "llama3-8b", "--num-layers", "2", "--gpu", "h100-sxm", "--seq-len", "512",
                         "--dp", "8", "--ep", "2")
    assert code == 2 and "no mixture-of-experts layer" in err


def _experts(*megatron: str) -> dict:
    code, out, err = run("run", *CARD, "--dp", "8", "--megatron-args", " ".join(megatron), "--json", "-")
    assert code == 0, err
    return json.loads(out)["hybrid"]["expert_parallel"]


def test_megatron_moe_architecture_arguments_are_card_fields() -> None:
    facts = _experts("--num-experts 64 --moe-router-topk 4 --expert-model-parallel-size 8 --moe-grouped-gemm")
    assert (facts["experts"], facts["top_k"], facts["local_experts"]) == (64, 4, 8)
    assert facts["routed_bytes_per_layer"] == 512 * 4 * 2048 * 2


def test_an_architecture_argument_keeps_the_cards_experts_and_head_width() -> None:
    """Planted bug caught: a card rebuilt from Megatron arguments losing its moe and head_dim
    fields (the experts gone: a dense 6,144-wide MLP and hidden / heads = 64-wide heads)."""
    facts = _experts("--swiglu --expert-model-parallel-size 4")
    assert (facts["experts"], facts["top_k"]) == (128, 8)
    code, out, err = run("run", *CARD, "--megatron-args", "--swiglu", "--json", "-")
    plain = run("run", *CARD, "--json", "-")
    assert code == 0 and json.loads(out)["makespan_ms"] == json.loads(plain[1])["makespan_ms"]


def test_sweep_takes_ep_as_an_axis(tmp_path) -> None:
    """--ep 1,4 sweeps two configurations, each with its ep."""
    out_file = tmp_path / "ep.csv"
    code, out, err = run("sweep", *CARD, "--dp", "8", "--ep", "1,4", "--global-batch", "8", "--out", str(out_file))
    assert code == 0, err
    import csv
    rows = list(csv.DictReader(out_file.open()))
    assert sorted(r["ep"] for r in rows) == ["1", "4"] and all(r["status"] == "ok" for r in rows)
    ep1, ep4 = sorted(rows, key=lambda r: r["ep"])
    assert int(ep4["max_peak_memory_bytes"]) < int(ep1["max_peak_memory_bytes"])  # experts / 4


def test_shared_expert_overlap_needs_an_all_to_all_dispatcher() -> None:
    """Megatron-Core refuses moe_shared_expert_overlap with the allgather dispatcher on a model
    with shared experts (TransformerConfig: "only works with alltoall or flex token dispatcher")."""
    card = ["--model", "deepseek-v3", "--num-layers", "4", "--gpu", "h100-sxm", "--seq-len", "512", "--dp", "2",
            "--ep", "2", "--moe-shared-expert-overlap", "--moe-token-dispatcher", "allgather", "-q"]
    code, out, err = run("run", *card)
    assert code == 2 and err.count("\n") == 1, err
    assert "--moe-shared-expert-overlap needs --moe-token-dispatcher alltoall or flex" in err
