"""plan's estimate of ``--moe-a2a-overlap`` (Megatron-Core's combined 1F1B) and
``--delay-wgrad-compute`` against the task DAG: a 4-layer Qwen3 30B-A3B on 16 GPUs in two nodes
of 8, expert groups inside a node and across both, one stage (each backward with the next
forward) and interleaved over two ranks (each steady-state forward with the backward after it,
the last stage's with its own backward), tp 1 and 2, no and selective recomputation.

Each candidate is DAG-timed once per flag set; the estimate must be within 5 % of the DAG. Each
term of the estimate is then broken on purpose and the comparison must catch it: the pairs run
one after the other, the last stage's backward beside its own forward, the token exchanges of a
pair not sharing their links, and the delayed weight gradients run in place."""

from __future__ import annotations

import importlib

import pytest

from triosim.plan import Candidate

from .test_estimate_vs_dag import fresh_errors, time_groups

estimate_module = importlib.import_module("triosim.plan.estimate")
combined_time = importlib.import_module("triosim.plan.combined_time")
pipeline_time = importlib.import_module("triosim.plan.pipeline_time")

QWEN = ["--model", "qwen3-30b-a3b", "--num-layers", "4", "--seq-len", "4096", "--gpu", "h100-sxm",
        "--topology", "nvlink-cluster", "--gpus-per-node", "8", "--gpus", "16", "--global-batch", "32"]
C = Candidate
# (tp, pp, dp, micro-batch, schedule, V, ZeRO, recompute, sequence parallel, ep=)
SAMPLE = [
    C(1, 2, 8, 1, "interleaved", 2, 1, "none", ep=8),  # expert groups inside a node
    C(1, 1, 16, 1, "1f1b", 1, 1, "none", ep=16),  # across both nodes
    C(2, 2, 4, 1, "interleaved", 2, 1, "selective", True, ep=8),
    C(1, 2, 8, 1, "interleaved", 2, 2, "none", ep=4),
    C(2, 1, 8, 1, "1f1b", 1, 0, "none", True, ep=16),
    C(1, 2, 8, 1, "interleaved", 2, 1, "selective", ep=8),
]


@pytest.fixture(scope="module")
def timed():
    """The sample DAG-timed under both flag sets (each DAG runs once)."""
    return time_groups((([*QWEN, "--moe-a2a-overlap"], SAMPLE),
                        ([*QWEN, "--moe-a2a-overlap", "--delay-wgrad-compute"], SAMPLE)))


# One candidate's own bound: one stage under TP 2 with sequence parallelism, where the DAG hides
# more of the token exchanges than the estimate's one-compute-at-a-time pairs (docs/plan.md, "Where
# the estimate is exact"): +5.8 % since the router weights are applied in the experts' activation,
# +3.2 % before, with the same estimate.
OWN_BOUND = {"dp8×tp2×pp1×ep16 1f1b none": 0.07}


def errors(timed) -> list[str]:
    out = []
    for c, t, _ in fresh_errors(timed):
        name = f"{c.mesh} {c.schedule} {c.recompute}"
        if abs(t) > OWN_BOUND.get(name, 0.05):
            out.append(f"{name}: time {t:+.2%}")
    return out


def test_the_estimate_follows_the_combined_schedule(timed) -> None:
    assert errors(timed) == []


def test_the_sample_has_every_kind() -> None:
    assert {c.pp for c in SAMPLE} == {1, 2} and {c.tp for c in SAMPLE} == {1, 2}
    assert {c.ep * c.tp <= 8 for c in SAMPLE} == {True, False}  # an expert group inside a node and across both
    assert {c.recompute for c in SAMPLE} == {"none", "selective"}


def _one_after_the_other(original):
    def planted(*args, **kwargs):  # the pairs' blocks run as without the flag
        F, B, _ = original(*args, **kwargs)
        return F, B, None
    return planted


def _beside_its_own_forward(original):
    def planted(*args, **kwargs):  # the last stage's backward starts beside its own forward
        prog = original(*args, **kwargs)
        levels = tuple(type(lv)(**{**lv.__dict__, "chained": lv.chained & False}) for lv in prog.levels)
        return type(prog)(**{**prog.__dict__, "levels": levels})
    return planted


def _links_not_shared(original):
    def planted(chains, speed_of):  # two token exchanges at once each at full speed
        marked = [[(c, x, False) for c, x, _ in chain] for chain in chains]
        return original(marked, speed_of)
    return planted


def _wgrad_in_place(original):
    def planted(ops, compute, comm, exchange, delay_wgrad):  # --delay-wgrad-compute ignored
        return original(ops, compute, comm, exchange, False)
    return planted


PLANTED = [
    (estimate_module, "_combined", _one_after_the_other, "the pairs"),
    (pipeline_time, "compile_combined", _beside_its_own_forward, "the last stage's own backward"),
    (estimate_module, "run_chains", _links_not_shared, "the exchanges sharing links"),
    (combined_time, "block_chain", _wgrad_in_place, "the delayed weight gradients"),
]


@pytest.mark.parametrize("module,attr,plant,term", PLANTED, ids=[p[-1] for p in PLANTED])
def test_a_planted_bug_in_each_term_is_caught(timed, monkeypatch, module, attr, plant, term) -> None:
    monkeypatch.setattr(module, attr, plant(getattr(module, attr)))
    assert errors(timed), f"a bug in {term} went unnoticed"
