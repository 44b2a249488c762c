"""plan's estimate of ``--moe-shared-expert-overlap`` against the task DAG: a 6-layer DeepSeek-V3
(3 dense layers, then MoE layers of 256 experts top 8 with one shared expert) on 16 GPUs in two
nodes of 8, expert groups inside a node and across both, 1F1B over two stages, full
recomputation; and in fp32, where the shared expert's compute outlasts the exchange (in bf16 the
exchange is the longer). With the overlap a dispatch starts right after its permutation, beside
the shared expert, whose compute runs slower by the SMs the exchange holds.

Each candidate is DAG-timed with and without the flag. The estimate must be within 5 % of the
DAG either way, and the time the overlap saves must be the DAG's within 5 % of it (the saving is
a small part of the step: a planted bug in it would hide inside the 5 % of the whole). Two
planted bugs in the term (the dispatch left behind the shared expert; the SMs it holds ignored)
must be caught."""

from __future__ import annotations

import importlib

import pytest

from triosim.plan import Candidate
from triosim.plan.report import dag_seconds

from .test_estimate_vs_dag import fresh_errors, time_groups

expert_time = importlib.import_module("triosim.plan.expert_time")

DEEPSEEK = ["--model", "deepseek-v3", "--num-layers", "5", "--seq-len", "4096", "--gpu", "h100-sxm",
            "--topology", "nvlink-cluster", "--gpus-per-node", "8", "--gpus", "16", "--global-batch", "16"]
C = Candidate
# (tp, pp, dp, micro-batch, schedule, V, ZeRO, recompute, sequence parallel, ep=)
SAMPLE = [
    C(1, 1, 16, 1, "1f1b", 1, 1, "none", ep=8),  # inside a node
    C(1, 1, 16, 1, "1f1b", 1, 1, "none", ep=16),  # across both nodes
    C(1, 2, 8, 2, "1f1b", 1, 2, "none", ep=8),
    C(1, 2, 8, 1, "1f1b", 1, 1, "none", ep=4),
    C(1, 1, 16, 1, "1f1b", 1, 0, "full", ep=2),
]
# fp32: no tensor cores, the shared expert's GEMMs outlast the exchange beside them
FP32 = [C(1, 1, 16, 1, "1f1b", 1, 1, "none", ep=2), C(1, 2, 8, 2, "1f1b", 1, 2, "none", ep=4)]


@pytest.fixture(scope="module")
def timed():
    """The sample DAG-timed without and with the overlap (each DAG runs once)."""
    fp32 = [*DEEPSEEK, "--dtype", "fp32"]
    return time_groups(((DEEPSEEK, SAMPLE), (fp32, FP32), ([*DEEPSEEK, "--moe-shared-expert-overlap"], SAMPLE),
                        ([*fp32, "--moe-shared-expert-overlap"], FP32)))


def comparison(timed) -> list[str]:
    """Lines for every candidate whose estimate is off the DAG's (5 %), or whose saving from the
    overlap is off the DAG's saving (5 % of it)."""
    half = len(timed) // 2
    plain, overlapped = timed[:half], timed[half:]
    bad = []
    for (c, est_plain, _), (_, est_over, _), row_plain, row_over in zip(
            fresh_errors(plain), fresh_errors(overlapped), rows(plain), rows(overlapped)):
        dag_plain, dag_over = dag_seconds(row_plain), dag_seconds(row_over)
        saved_dag = dag_plain - dag_over
        saved_est = (1 + est_plain) * dag_plain - (1 + est_over) * dag_over
        if abs(est_over) > 0.05 or abs(est_plain) > 0.05 or abs(saved_est - saved_dag) > 0.05 * abs(saved_dag):
            bad.append(f"{c.mesh}: estimate {est_plain:+.2%} / {est_over:+.2%} of the DAG; saved "
                       f"{saved_est * 1e3:.3f} ms, the DAG {saved_dag * 1e3:.3f} ms")
    return bad


def rows(groups) -> list:
    return [row for _, group in groups for row in group]


def test_the_overlap_saves_what_the_dag_saves(timed) -> None:
    assert comparison(timed) == []


def test_the_overlap_saves_time_in_the_dag(timed) -> None:
    """The sample is one where the term matters: the DAG is faster with the overlap on each."""
    half = len(timed) // 2
    for a, b in zip(rows(timed[:half]), rows(timed[half:])):
        assert dag_seconds(b) < dag_seconds(a) * 0.999, a.candidate.mesh


def _behind(original):
    def planted(exchange, beside, speed):  # the dispatch waits for the shared expert after all
        return exchange
    return planted


def _full_speed(original):
    def planted(exchange, beside, speed):  # the shared expert keeps every SM beside the exchange
        return original(exchange, beside, 1.0)
    return planted


@pytest.mark.parametrize("plant", [_behind, _full_speed], ids=["dispatch behind the shared expert", "SMs ignored"])
def test_a_planted_bug_in_the_overlap_is_caught(timed, monkeypatch, plant) -> None:
    monkeypatch.setattr(expert_time, "exposed_beside", plant(expert_time.exposed_beside))
    assert comparison(timed)
