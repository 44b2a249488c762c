"""FP8 training's scaling recipe as a searched axis (``--dtype fp8`` without ``--fp8-recipe``):
every candidate is also estimated with each other recipe the GPU runs, each with its own sizes,
cast kernels and stage times, exactly as a plan pinned to that recipe estimates it. Planted,
each must be caught: the recipe's profile left as the run's, and the recipes sharing one memo of
stage times (whose keys do not name the recipe)."""

from __future__ import annotations

import csv
import importlib

import pytest
from cli_capture import run

from triosim.cli.console import build_parser
from triosim.cli.plan import plan_inputs
from triosim.plan import PipelineTimer, estimate

fp8_recipes = importlib.import_module("triosim.plan.fp8_recipes")
estimate_module = importlib.import_module("triosim.plan.estimate")

LLAMA = ["--model", "llama3-8b", "--num-layers", "4", "--seq-len", "4096", "--gpu", "h100-sxm", "--topology",
         "nvlink-cluster", "--gpus", "8", "--global-batch", "16", "--cp", "1", "--dtype", "fp8"]


def inputs(*extra: str):
    return plan_inputs(build_parser().parse_args(["plan", *LLAMA, *extra]))


@pytest.fixture(scope="module")
def searched():
    """The searched plan's inputs and, per other recipe, the inputs of a plan pinned to it."""
    plan = inputs()
    return plan, {r: inputs("--fp8-recipe", r) for r in ("delayed", "blockwise")}


def mismatches(plan, pinned) -> list[str]:
    """Candidates whose estimate in the searched plan (one timer for all recipes) differs from the
    pinned plan's, as lines."""
    timer = PipelineTimer(plan.profile.platform)
    mine = {c: estimate(c, plan.profile, plan.settings, timer) for c in plan.candidates}
    out = []
    for recipe, other in pinned.items():
        own = PipelineTimer(other.profile.platform)
        for c in other.candidates:
            want = estimate(c, other.profile, other.settings, own)
            got = mine[c.__class__(**{**c.__dict__, "fp8_recipe": recipe})]
            if (got.time_s, got.peak_bytes) != (want.time_s, want.peak_bytes):
                out.append(f"{recipe} {c.mesh}: {got.time_s:.6f} s {got.peak_bytes} B, pinned "
                           f"{want.time_s:.6f} s {want.peak_bytes} B")
    return out


def test_every_candidate_is_tried_with_every_other_recipe(searched) -> None:
    plan, pinned = searched
    recipes = [c.fp8_recipe for c in plan.candidates]
    assert set(recipes) == {None, "delayed", "blockwise"}  # the run's own: current scaling on an H100
    assert recipes.count("delayed") == len(pinned["delayed"].candidates)
    assert recipes.count("blockwise") == recipes.count(None) == len(pinned["blockwise"].candidates)


def test_a_recipes_estimate_is_the_pinned_plans(searched) -> None:
    plan, pinned = searched
    assert mismatches(plan, pinned) == []


def test_the_runs_recipe_left_in_the_profile_is_caught(searched, monkeypatch) -> None:
    plan, pinned = searched
    monkeypatch.setattr(estimate_module, "recipe_profile", lambda profile, recipe: profile)
    assert mismatches(plan, pinned)


def test_one_memo_for_every_recipe_is_caught(searched, monkeypatch) -> None:
    plan, pinned = searched
    monkeypatch.setattr(PipelineTimer, "apart", lambda self, key: self)
    assert mismatches(plan, pinned)


def test_delayed_scaling_re_runs_no_norms() -> None:
    refused = fp8_recipes.refused_modules("delayed")
    assert refused == {"layernorm", "moe_act"} and not fp8_recipes.refused_modules("current")
    plan = inputs("--recompute-modules", "core_attn,layernorm")
    assert {c.fp8_recipe for c in plan.candidates} == {None, "blockwise"}
    variants = importlib.import_module("triosim.plan.variants")
    c = next(c for c in inputs().candidates if c.recompute == "selective")
    assert [v.recompute_modules for v in variants.module_variants(c, lambda v: True, refused)] == [
        ("core_attn", "mlp")]


def test_a_pinned_recipe_and_bf16_search_none() -> None:
    assert {c.fp8_recipe for c in inputs("--fp8-recipe", "current").candidates} == {None}
    bf16 = plan_inputs(build_parser().parse_args(["plan", *LLAMA[:-2]]))
    assert {c.fp8_recipe for c in bf16.candidates} == {None}


def test_mxfp8_is_tried_on_blackwell_but_not_with_fp8_param_gather() -> None:
    b200 = [x if x != "h100-sxm" else "b200" for x in LLAMA]
    plan = plan_inputs(build_parser().parse_args(["plan", *b200]))
    assert {c.fp8_recipe for c in plan.candidates} == {None, "delayed", "current", "blockwise"}  # mxfp8 is the run's
    gather = plan_inputs(build_parser().parse_args(["plan", *b200, "--fp8-recipe", "current", "--fp8-param-gather"]))
    assert {c.fp8_recipe for c in gather.candidates} == {None}


def test_the_csv_and_the_run_line_name_the_recipe(tmp_path) -> None:
    out = tmp_path / "plan.csv"
    code, stdout, stderr = run(["plan", *LLAMA, "--top", "2", "--overlaps", "off", "--out", str(out)])
    assert code == 0, stderr
    rows = list(csv.DictReader(out.open()))
    assert {x["fp8_recipe"] for x in rows} == {"", "delayed", "blockwise"}
    for x in rows:
        assert ("--fp8-recipe" in x["command"]) == bool(x["fp8_recipe"]) or not x["command"]
    assert "fp8-delayed" in stdout or "fp8-blockwise" in stdout
