"""The plan's estimate against the task DAG on partial recomputation (Megatron-Core's
``recompute_method`` block or uniform with ``recompute_num_layers``, and ``recompute_modules``):
a 4-layer Llama 3 8B and a 4-layer GPT-3 175B on 8 GPUs, 1F1B and interleaved, ZeRO 0-3,
sequence parallelism on and off, each DAG-timed once. Peak memory and time within 5 %. Each
term of the setting (the chunks block and uniform count their layers in, the method, the layer
count, the modules) is then broken on purpose and the comparison must catch it; and the plan,
where a candidate without recomputation misses the memory by little, finds the block setting
that fits and beats full recomputation."""

from __future__ import annotations

import csv
import importlib
from dataclasses import replace

import pytest
from cli_capture import run

from triosim.graph.recompute_spec import RecomputeSpec
from triosim.plan import Candidate

from .test_estimate_vs_dag import GPT3, LLAMA, errors, time_groups

profile_module = importlib.import_module("triosim.plan.profile")
C = Candidate


def block(c: Candidate, n: int, method: str = "block") -> Candidate:
    return replace(c, recompute="full", recompute_method=method, recompute_num_layers=n)


def modules(c: Candidate, *names: str) -> Candidate:
    return replace(c, recompute="selective", recompute_modules=names)


# (tp, pp, dp, micro-batch, schedule, V, ZeRO, ..., sequence parallel)
SAMPLE = [
    block(C(1, 2, 4, 1), 1),
    block(C(2, 2, 2, 1, "1f1b", 1, 2, "none", True), 1),
    block(C(1, 1, 8, 2, "1f1b", 1, 1), 2),
    block(C(2, 2, 2, 1, "interleaved", 2, 1), 1),
    block(C(1, 1, 8, 1, "1f1b", 1, 3), 3),
    block(C(2, 2, 2, 1, "1f1b", 1, 0), 2, "uniform"),
    block(C(1, 1, 8, 1, "1f1b", 1, 2), 2, "uniform"),
    modules(C(1, 1, 8, 1), "core_attn", "mlp"),
    modules(C(2, 2, 2, 2, "interleaved", 2, 2, "none", True), "core_attn", "layernorm", "mlp"),
    modules(C(1, 2, 4, 1, "1f1b", 1, 3), "mlp"),
    modules(C(4, 2, 1, 1), "layernorm"),
]


@pytest.fixture(scope="module")
def timed() -> list[tuple[object, list]]:
    return time_groups(((LLAMA, SAMPLE), (GPT3, SAMPLE)))


def test_estimate_equals_the_dag_on_partial_recomputation(timed) -> None:
    assert errors(timed) == []


def test_the_sample_has_every_setting() -> None:
    specs = {c.recompute_spec for c in SAMPLE}
    assert {s.method for s in specs if s.granularity == "full"} == {"block", "uniform"}
    assert {s.num_layers for s in specs if s.granularity == "full"} >= {1, 2, 3}
    assert {m for s in specs if s.granularity == "selective" for m in s.modules} == {"core_attn", "mlp", "layernorm"}
    assert {c.schedule for c in SAMPLE} == {"1f1b", "interleaved"} and {c.zero for c in SAMPLE} == {0, 1, 2, 3}


def _planted_for_recompute(monkeypatch, change) -> None:
    """ModelProfile.for_recompute given ``change(spec, cuts)`` instead of (spec, cuts)."""
    original = profile_module.ModelProfile.for_recompute

    def planted(self, mode, cuts=frozenset()):
        spec = profile_module.as_spec(mode)
        return original(self, *change(spec, frozenset(cuts)))

    monkeypatch.setattr(profile_module.ModelProfile, "for_recompute", planted)


PLANTED = {
    # block's first N layers counted over the whole model, not in each chunk
    "chunks ignored": lambda spec, cuts: (spec, frozenset()),
    # block taken for uniform (every layer re-run, in groups of N)
    "method ignored": lambda spec, cuts: (replace(spec, method="uniform"), cuts),
    # the layer count taken as 1
    "layer count ignored": lambda spec, cuts: (replace(spec, num_layers=1), cuts),
    # only the attention core re-run, whatever the modules
    "modules ignored": lambda spec, cuts: (replace(spec, modules=("core_attn",)), cuts),
}


@pytest.mark.parametrize("term", list(PLANTED))
def test_a_planted_bug_in_each_term_is_caught(timed, monkeypatch, term) -> None:
    _planted_for_recompute(monkeypatch, PLANTED[term])
    for inputs, _ in timed:  # the children built with the bug must not outlive it
        inputs.profile._children.clear()
    try:
        assert errors(timed), f"{term} went unnoticed"
    finally:
        monkeypatch.undo()
        for inputs, _ in timed:
            inputs.profile._children.clear()


TIGHT = ["--model", "llama3-8b", "--num-layers", "4", "--seq-len", "4096", "--gpu", "h100-sxm", "--topology",
         "nvlink-cluster", "--gpus", "8", "--global-batch", "16", "--tp", "1", "--pp", "1", "--cp", "1",
         "-capacity", "33.4", "--top", "3"]


def test_the_plan_finds_block_recomputation_where_nothing_lighter_fits(tmp_path) -> None:
    # 11.3 GB a GPU: without recomputation (12.1 GB) nothing fits, full recomputation does
    # (300.6 ms), block recomputation of 2 of the 4 layers too and is faster (287.5 ms, DAG-timed)
    # (without the data-parallel overlaps, which hide ZeRO-3's transfers whatever is re-run)
    out = tmp_path / "plan.csv"
    code, stdout, stderr = run(["plan", *TIGHT, "--overlaps", "off", "--out", str(out)])
    assert code == 0, stderr
    rows = list(csv.DictReader(out.open()))
    best = rows[0]
    assert (best["recompute"], best["recompute_method"], best["recompute_num_layers"]) == ("full", "block", "2")
    assert best["status"] == "dag" and "--recompute-method block --recompute-num-layers 2" in best["command"]
    full = min(float(x["dag_ms"] or x["estimate_ms"]) for x in rows if x["recompute"] == "full"
               and x["recompute_method"] == "uniform" and x["status"] in ("dag", "estimated"))
    assert float(best["dag_ms"]) < full
    assert " refinements" in stdout and "full (block, 2 layers a chunk)" in stdout


def test_a_pinned_setting_is_every_candidates(tmp_path) -> None:
    out = tmp_path / "plan.csv"
    code, stdout, stderr = run(["plan", *TIGHT[:-1], "0", "--recompute-modules", "core_attn,mlp", "--out", str(out)])
    assert code == 0, stderr
    rows = list(csv.DictReader(out.open()))
    assert {(x["recompute"], x["recompute_modules"]) for x in rows} == {("selective", "core_attn+mlp")}
    assert "refinements" not in stdout
    code, stdout, stderr = run(["plan", *TIGHT[:-1], "0", "--recompute-num-layers", "1", "--recompute-method",
                                "block", "--out", str(out)])
    assert code == 0, stderr
    rows = list(csv.DictReader(out.open()))
    assert {(x["recompute"], x["recompute_method"], x["recompute_num_layers"]) for x in rows} == {
        ("full", "block", "1")}
    assert rows[0]["command"].count("--recompute-method") == 1  # the candidate's own flag, not repeated


@pytest.mark.parametrize("flags,words", [
    (["--recompute-method", "block"], "--recompute-method pins a setting only with --recompute-num-layers"),
    (["--recompute-num-layers", "1", "--recompute-modules", "mlp"], "exclude each other"),
    (["--recompute-modules", "moe"], "--recompute-modules moe"),
])
def test_refusals_are_one_line(flags, words) -> None:
    code, _, stderr = run(["plan", *TIGHT, *flags])
    assert code == 2 and words in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_spec_key_names_the_chunks_only_where_they_matter() -> None:
    key = importlib.import_module("triosim.plan.variants").rewrite_key
    assert key(RecomputeSpec("selective")) == "selective" and key(RecomputeSpec("full"), frozenset({3})) == "full"
    assert key(RecomputeSpec("full", "block", 1), frozenset({3})) != key(RecomputeSpec("full", "block", 1))
    assert key(RecomputeSpec("selective", modules=("mlp", "core_attn")), frozenset({3})) == key(
        RecomputeSpec("selective", modules=("core_attn", "mlp")))


def test_block_is_tried_only_where_it_can_fit_and_stay_below_the_limit() -> None:
    from types import SimpleNamespace

    from triosim.plan.variants import block_may_help, smallest_fitting

    c = C(1, 2, 4, 1)  # 8 layers over 2 stages: 4 a chunk

    def row(t: float, fits: bool = True):
        return SimpleNamespace(candidate=c, estimate=SimpleNamespace(time_s=t), feasible=fits)

    parent = row(1.0, False)
    assert block_may_help(parent, row(1.4), 8, 1.1)  # one layer a chunk: at least 1.0 + 0.5 · 0.4 / 4 = 1.05
    assert not block_may_help(parent, row(1.4), 8, 1.04)
    assert not block_may_help(parent, row(1.4, fits=False), 8, 9.0)  # full recomputation does not fit: none does
    # the largest N first; nothing more when it does not fit; else halving to the smallest that fits
    assert [v.recompute_num_layers for v in smallest_fitting(c, 8, block, lambda v: False)] == [3]
    fits_from_2 = smallest_fitting(c, 8, block, lambda v: v.recompute_num_layers >= 2)
    assert [v.recompute_num_layers for v in fits_from_2] == [3, 1, 2]
