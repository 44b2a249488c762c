"""``--cp N`` and ``--cp-comm-type`` from the command line: the world size and the derived dp,
the rank placement, what the summary and the JSON result say, and the one-line refusals."""

from __future__ import annotations

import csv
import json

import pytest
from cli_capture import run as run_argv

from triosim.graph.rank_map import RankMap

CARD = ["--model", "llama3-8b", "--num-layers", "2", "--gpu", "h100-sxm", "--seq-len", "2048"]



def run(*argv: str) -> tuple[int, str, str]:
    return run_argv(list(argv))


def test_rank_placement_puts_cp_after_tp() -> None:
    """tp innermost, then cp (a cp ring of TP rank 0 is every tp-th GPU), then the order given."""
    ranks = RankMap(dp=2, tp=2, pp=2, order=("tp", "pp", "dp"), cp=2)
    assert ranks.size == 16 and ranks.data == 4
    assert ranks.tp_group(0, 0) == (0, 1)
    assert ranks.cp_group(0, 0, 0) == (0, 2) and ranks.cp_group(3, 1, 1) == (13, 15)
    assert ranks.stage_gpus(0, 0) == (0, 4)
    assert ranks.dp_group(0, 0) == (0, 2, 8, 10)  # the gradient group: dp × cp
    assert all(ranks.rank(*ranks.coords(g)) == g for g in range(16))
    named = RankMap(dp=2, tp=2, pp=1, order=("cp", "tp", "pp", "dp"), cp=2)
    assert named.cp_group(0, 0, 0) == (0, 1) and named.tp_group(0, 0) == (0, 2)


def test_json_knows_the_cp_degree_and_the_exchange() -> None:
    code, out, err = run("run", *CARD, "--tp", "2", "--cp", "2", "--dp", "2", "--json", "-")
    assert code == 0, err
    d = json.loads(out)
    assert d["gpus"] == 8 and d["parallel"]["cp"] == 2 and d["parallel"]["cp_comm_type"] == "p2p"
    assert d["parallel"]["rank_order"] == "tp,cp,pp,dp"
    context = d["hybrid"]["context_parallel"]
    assert context["cp"] == 2 and context["comm_type"] == "p2p" and context["attention_ops"] == 4
    assert context["exchange_bytes_per_layer"]["backward"] == 2 * context["exchange_bytes_per_layer"]["forward"]
    assert "exposed_cp_ms" in d["breakdown"]["mean"]
    assert d["throughput"]["global_batch"] == 2  # the cp ranks share each sample: global = dp × batch


def test_summary_shows_the_exposed_exchange_and_the_mesh() -> None:
    """At a short sequence over the nodes' network the ring is slower than its partial
    attentions: the breakdown line names the exposed CP time."""
    code, out, err = run("run", *CARD, "--tp", "8", "--cp", "2", "--seq-len", "512")
    assert code == 0, err
    assert "hybrid tp8×cp2" in out and "× cp 2 = 16 GPUs" in out
    assert "exposed CP" in out and "context parallel: cp 2 (p2p)" in out


def test_gpu_number_derives_dp_over_tp_pp_cp() -> None:
    code, out, err = run("run", *CARD, "-GPUnumber", "16", "--tp", "2", "--cp", "2", "--json", "-")
    assert code == 0, err
    d = json.loads(out)
    assert (d["parallel"]["dp"], d["parallel"]["cp"], d["gpus"]) == (4, 2, 16)
    assert any(x["flag"] == "--dp" and "cp 2" in x["why"] for x in d["defaults"])


@pytest.mark.parametrize("argv,message", [
    (["--dp", "1", "--tp", "2", "--cp", "2", "-GPUnumber", "8"],
     "--dp 1 × --tp 2 × --pp 1 × --cp 2 = 4 GPUs, but -GPUnumber is 8"),
    (["-GPUnumber", "12", "--tp", "2", "--cp", "4"], "-GPUnumber 12 is not a multiple of --tp 2 × --pp 1 × --cp 4"),
    (["--cp", "0"], "--cp must be a positive integer, got 0"),
    (["--cp", "2", "--cp-comm-type", "a2a+p2p"], "--cp-comm-type a2a+p2p (hierarchical context parallelism) is not "
                                                 "modelled"),
    (["--tp", "8", "--cp", "2", "--cp-comm-type", "a2a"], "each tensor-parallel rank holds 4 heads and 1 key/value "
                                                          "heads: not multiples of --cp 2"),
    (["--cp", "4", "--seq-len", "2052"], "--cp 4 cuts each sequence into 8 chunks (causal load balancing): the "
                                         "sequence of 2052 tokens is not a multiple of 8"),
])
def test_refusals_are_one_line(argv: list[str], message: str) -> None:
    code, out, err = run("run", *CARD, *argv)
    assert code == 2 and err.count("\n") == 1, err
    assert message in err


def test_unfused_attention_is_refused_in_one_line() -> None:
    code, _, err = run("run", "--model", "gpt-neo-1.3b", "--num-layers", "2", "--gpu", "h100-sxm", "--seq-len", "512",
                       "--cp", "2")
    assert code == 2 and err.count("\n") == 1, err
    assert "--cp 2 needs fused attention ops" in err


def test_plan_pins_cp_and_searches_it(tmp_path) -> None:
    csv_path = tmp_path / "plan.csv"
    code, out, err = run("plan", *CARD, "--gpus", "8", "--global-batch", "8", "--cp", "2", "--top", "0",
                         "--out", str(csv_path), "-q")
    assert code == 0, err
    assert "--cp 2" in out  # with -q, the best configuration's run line
    rows = list(csv.DictReader(csv_path.open()))
    assert rows and {r["cp"] for r in rows} == {"2"}
    assert all(int(r["dp"]) * int(r["tp"]) * int(r["pp"]) * 2 == 8 for r in rows)
    # searched: 2,048 tokens cut into 4 chunks of 512 is below the searched floor, so cp stays 1 unless pinned
    code, out, err = run("plan", *CARD, "--gpus", "8", "--global-batch", "8", "--top", "0", "-q")
    assert code == 0 and "--cp" not in out, err
    code, out, err = run("plan", *[x if x != "2048" else "8192" for x in CARD], "--gpus", "8", "--global-batch", "8",
                         "--top", "1", "--show", "50")
    assert code == 0, err
    assert "×cp2×" in out and "×cp4×" in out and "×cp8×" not in out  # 8,192 tokens: chunks of 1,024 or more


@pytest.mark.parametrize("extra,message", [
    (["--cp", "3"], "--cp 3 cuts each sequence into 6 chunks (causal load balancing): the sequence of 2048 tokens"),
    (["--cp", "2", "--cp-comm-type", "a2a"], "plan searches context parallelism as ring attention"),
])
def test_plan_refuses_cp_it_cannot_estimate_in_one_line(extra: list[str], message: str) -> None:
    code, _, err = run("plan", *CARD, "--gpus", "24", "--global-batch", "24", *extra)
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_plan_refuses_cp_without_fused_attention_in_one_line() -> None:
    code, _, err = run("plan", "--model", "gpt-neo-1.3b", "--num-layers", "2", "--gpu", "h100-sxm", "--seq-len", "512",
                       "--gpus", "8", "--global-batch", "8", "--cp", "2")
    assert code == 2 and err.count("\n") == 1 and "--cp 2 needs fused attention ops" in err, err


def test_zero_over_the_context_ranks_is_not_noted_as_unused() -> None:
    """ZeRO shards over dp × cp: at --dp 1 --cp 4 it changes the step, and the note said
    '--zero 1 not used'."""
    base = [*CARD, "--gpus", "4", "--cp", "4", "--global-batch", "2", "-q"]
    code, plain, _ = run("run", *base)
    assert code == 0
    code, sharded, err = run("run", *base, "--zero", "1")
    assert code == 0 and "not used" not in err and sharded != plain
    code, _, err = run("run", *CARD, "--gpus", "4", "--tp", "4", "--global-batch", "2", "-q", "--zero", "1")
    assert code == 0 and "--zero 1 not used" in err  # nothing to shard: still noted


def test_an_exchange_without_context_parallelism_is_noted_unused() -> None:
    base = [*CARD, "--gpus", "2", "--dp", "2", "--global-batch", "2", "-q"]
    code, plain, _ = run("run", *base)
    assert code == 0
    code, out, err = run("run", *base, "--cp-comm-type", "a2a")
    assert code == 0 and out == plain and "--cp-comm-type a2a not used" in err
