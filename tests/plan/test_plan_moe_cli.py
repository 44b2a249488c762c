"""``triosim plan`` with expert parallelism and pipeline layouts on the command line: ``--ep`` and
``--etp`` searched on an MoE card and pinned when given, refused on a dense model (``run``'s own
line), the layout flags taken as pins, Megatron-Core's account-for splits searched where the
layers do not divide, and the CSV's ep, etp and layout columns and run lines."""

from __future__ import annotations

import csv

import pytest
from cli_capture import run

MOE = ["--model", "qwen3-30b-a3b", "--num-layers", "3", "--seq-len", "1024", "--gpu", "h100-sxm",
       "--topology", "nvlink-cluster", "--gpus", "8", "--global-batch", "8"]
DENSE = ["--model", "llama3-8b", "--num-layers", "2", "--seq-len", "1024", "--gpu", "h100-sxm",
         "--topology", "nvlink-cluster", "--gpus", "8", "--global-batch", "8"]


def _plan(tmp_path, *argv: str) -> list[dict]:
    out = tmp_path / "plan.csv"
    code, _, err = run(["plan", *argv, "--out", str(out), "-q"])
    assert code == 0, err
    return list(csv.DictReader(out.open()))


def test_ep_and_etp_are_searched_on_an_moe_card(tmp_path) -> None:
    rows = _plan(tmp_path, *MOE, "--pp", "1", "--top", "0")
    pairs = {(int(r["ep"]), int(r["etp"]), int(r["tp"]), int(r["dp"])) for r in rows}
    # every ep dividing the 128 experts and, times etp (1 or tp), the tp · dp GPUs of the stage
    assert {(ep, etp) for ep, etp, _, _ in pairs} == {(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2),
                                                      (1, 4), (2, 4), (1, 8)}
    assert all(etp in (1, tp) and (tp * dp) % (ep * etp) == 0 for ep, etp, tp, dp in pairs)
    # FSDP of experts split over tp, ep or etp is not modelled: ZeRO-3 only where none is
    assert all(r["ep"] == r["etp"] == r["tp"] == "1" for r in rows if r["zero"] == "3")
    ep8 = next(r for r in rows if r["ep"] == "8")
    assert "--ep 8" in ep8["command"] and "--etp" not in ep8["command"]


def test_a_pinned_ep_is_every_candidates(tmp_path) -> None:
    rows = _plan(tmp_path, *MOE, "--ep", "8", "--top", "1")
    assert rows and {r["ep"] for r in rows} == {"8"}
    assert all(int(r["tp"]) * int(r["dp"]) % 8 == 0 for r in rows)
    best = rows[0]
    assert best["status"] == "dag" and " --ep 8 " in best["command"] + " "


def test_a_dense_model_keeps_ep_1(tmp_path) -> None:
    rows = _plan(tmp_path, *DENSE, "--tp", "1", "--top", "0")
    assert {(r["ep"], r["etp"]) for r in rows} == {("1", "1")}


@pytest.mark.parametrize("argv,words", [
    ([*DENSE, "--ep", "8"], "--ep 8: the model has no mixture-of-experts layer (no grouped expert GEMM)"),
    ([*DENSE, "--etp", "2"], "--etp 2: the model has no mixture-of-experts layer"),
    ([*MOE, "--ep", "3"], "--ep 3 must divide the 128 routed experts of the model"),
    ([*MOE, "--ep", "0"], "--ep must be a positive integer, got 0"),
    ([*MOE, "--account-for-loss-in-pipeline-split", "--decoder-first-pipeline-num-layers", "1"],
     "cannot be combined with"),
])
def test_refusals_are_one_line(argv, words) -> None:
    code, _, err = run(["plan", *argv])
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_the_dense_refusal_is_runs_own_line() -> None:
    _, _, plan_err = run(["plan", *DENSE, "--ep", "8"])
    _, _, run_err = run(["run", *DENSE[:-4], "--dp", "8", "--ep", "8", "--global-batch", "8"])
    assert plan_err.strip() == run_err.strip()


def test_account_for_splits_are_searched_where_the_layers_do_not_divide(tmp_path) -> None:
    rows = _plan(tmp_path, *MOE, "--tp", "1", "--top", "0")
    layouts = {(r["pp"], r["schedule"], r["virtual_stages"], r["layout"]) for r in rows}
    # 3 layers: no equal split over 2 or 4 ranks; the embedding or the loss counted as a layer makes 4
    assert {x for x in layouts if x[0] != "1"} == {
        ("2", "1f1b", "1", "E+1"), ("2", "1f1b", "1", "L+1"), ("4", "1f1b", "1", "E+1"), ("4", "1f1b", "1", "L+1"),
        ("2", "interleaved", "2", "E+1"), ("2", "interleaved", "2", "L+1")}
    assert {x[3] for x in layouts if x[0] == "1"} == {""}
    e1 = next(r for r in rows if r["layout"] == "E+1")
    assert e1["command"].endswith("--account-for-embedding-in-pipeline-split")


def test_a_layout_flag_is_a_pin(tmp_path) -> None:
    rows = _plan(tmp_path, *MOE, "--tp", "1", "--account-for-loss-in-pipeline-split", "--top", "1")
    assert rows and {r["layout"] for r in rows} == {"L+1"}
    assert {r["pp"] for r in rows} == {"1", "2", "4"}  # 3 + 1 layers over 1, 2 or 4 ranks
    assert rows[0]["status"] == "dag" and "--account-for-loss-in-pipeline-split" in rows[0]["command"]


def test_a_layout_string_pins_the_stages(tmp_path) -> None:
    rows = _plan(tmp_path, *MOE, "--tp", "1", "--pipeline-model-parallel-layout", "Et|ttL", "--top", "1")
    assert rows and {(r["pp"], r["schedule"], r["layout"]) for r in rows} == {("2", "1f1b", "Et|ttL")}
    assert rows[0]["status"] == "dag" and "--pipeline-model-parallel-layout 'Et|ttL'" in rows[0]["command"]


def test_a_layout_string_of_four_stages_is_pp_4_or_pp_2_interleaved(tmp_path) -> None:
    rows = _plan(tmp_path, *MOE, "--tp", "1", "--pipeline-model-parallel-layout", "E|t|t|tL", "--top", "0")
    assert {(r["pp"], r["schedule"], r["virtual_stages"]) for r in rows} == {("4", "1f1b", "1"),
                                                                             ("2", "interleaved", "2")}


def test_offload_is_not_searched_beside_token_exchanges(tmp_path) -> None:
    """The estimate's host copies do not run beside the exchanges as the DAG's do (+2.7 … +5.7 %
    above it): a pinned offload keeps ep and etp 1, and --ep with it is refused."""
    rows = _plan(tmp_path, *MOE, "--tp", "1", "--pp", "2", "--offload-activations", "1", "--top", "0")
    assert rows and {(r["ep"], r["etp"]) for r in rows} == {("1", "1")}
    code, _, err = run(["plan", *MOE, "--ep", "2", "--offload-activations", "1"])
    assert code == 2 and "--offload-activations with --ep/--etp" in err and len(err.strip().splitlines()) == 1
    from triosim.plan.candidates import Candidate
    from triosim.plan.variants import may_offload

    assert may_offload(Candidate(2, 2, 4, 1)) and not may_offload(Candidate(2, 2, 4, 1, ep=2))
    assert not may_offload(Candidate(2, 2, 4, 1, etp=2))


def test_expert_and_tensor_parallelism_come_with_sequence_parallelism(tmp_path) -> None:
    """Megatron-Core refuses --ep above 1 with --tp above 1 without sequence parallelism (and so
    does run): plan never offers it."""
    rows = _plan(tmp_path, *MOE, "--pp", "1", "--top", "0")
    assert any(r["ep"] != "1" and r["tp"] != "1" for r in rows)
    assert all(r["sequence_parallel"] in ("True", "true", "1", "on")
               for r in rows if r["ep"] != "1" and r["tp"] != "1")


def test_the_combined_schedule_is_searched_as_megatron_runs_it(tmp_path) -> None:
    """--moe-a2a-overlap pins Megatron-Core's combined 1F1B on every candidate: ep above 1, no full
    recomputation (block recomputation of N layers included) and, over pipeline ranks, the
    interleaved schedule; the best is DAG-timed with the flag on its run line."""
    rows = _plan(tmp_path, *MOE, "--moe-a2a-overlap", "--delay-wgrad-compute", "--top", "2")
    assert rows and all(int(r["ep"]) > 1 and r["recompute"] != "full" for r in rows)
    assert all(r["schedule"] == "interleaved" for r in rows if r["pp"] != "1")
    assert {r["pp"] for r in rows} >= {"1", "2"}
    best = rows[0]
    assert best["status"] == "dag" and "--moe-a2a-overlap" in best["command"] and "--delay-wgrad-compute" in best["command"]
    assert abs(float(best["estimate_ms"]) / float(best["dag_ms"]) - 1) <= 0.05


def test_the_token_dispatcher_is_searched_among_the_fastest(tmp_path) -> None:
    """Without --moe-token-dispatcher the plan tries flex and allgather beside the run's own
    alltoall on its fastest expert-parallel candidates (their run lines name it); given, the
    dispatcher is a pin."""
    rows = _plan(tmp_path, *MOE, "--pp", "1", "--top", "0")
    tried = {r["dispatcher"] for r in rows if r["dispatcher"]}
    assert tried == {"flex", "allgather"}
    assert all(f"--moe-token-dispatcher {r['dispatcher']}" in r["command"] and r["ep"] != "1" and r["etp"] == "1"
               for r in rows if r["dispatcher"])
    pinned = _plan(tmp_path, *MOE, "--pp", "1", "--top", "0", "--moe-token-dispatcher", "alltoall")
    assert not any(r["dispatcher"] for r in pinned)


def test_a_dispatcher_variant_is_estimated_as_that_dispatchers_run() -> None:
    """A candidate with another dispatcher is estimated on its own expert-rank profile: the same
    figures as the plain candidate in a plan whose run uses that dispatcher."""
    from dataclasses import replace

    from triosim.cli.console import build_parser
    from triosim.cli.plan import plan_inputs
    from triosim.plan import Candidate, PipelineTimer, estimate

    c = Candidate(1, 1, 8, 1, "1f1b", 1, 1, "none", ep=4)  # (at ep 8 = top-k both send 7 rows a token)
    own = plan_inputs(build_parser().parse_args(["plan", *MOE]))
    other = plan_inputs(build_parser().parse_args(["plan", *MOE, "--moe-token-dispatcher", "allgather"]))
    times = {}
    for d, inputs in (("allgather", other), ("flex", None)):
        variant = estimate(replace(c, dispatcher=d), own.profile, own.settings, PipelineTimer(own.profile.platform))
        if inputs is None:
            inputs = plan_inputs(build_parser().parse_args(["plan", *MOE, "--moe-token-dispatcher", d]))
        plain = estimate(c, inputs.profile, inputs.settings, PipelineTimer(inputs.profile.platform))
        assert (variant.time_s, variant.peak_bytes) == (plain.time_s, plain.peak_bytes)
        times[d] = variant.time_s
    alltoall = estimate(c, own.profile, own.settings, PipelineTimer(own.profile.platform))
    assert alltoall.time_s != times["allgather"]  # (flex is alltoall inside one node)
