"""The plan's estimate against the task DAG with ``--overlap-grad-reduce``: a 16-layer GPT-3 175B
on 128 H100s in 16 nodes, the interleaved schedule (V 2) and 1F1B, each DAG-timed once. A model
chunk's gradient buckets are reduced as its own last backward block completes them, the last
layers' chunk first, one bucket after another in the order they become ready; the estimate is
within 1 % of the DAG's time. Following only the rank's last block (every other chunk's buckets
ready when it starts), or reducing the buckets in gradient order whatever their readiness, is
planted and must be caught (+2.5 … +6.3 % before)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from triosim.cli.console import build_parser
from triosim.cli.plan import plan_inputs
from triosim.plan import Candidate, PipelineTimer, estimate
from triosim.plan.report import dag_seconds
from triosim.plan.search import Row, dag_time

estimate_module = importlib.import_module("triosim.plan.estimate")

TOPOLOGY = Path(__file__).resolve().parents[2] / "topologies" / "dgx-h100-superpod.yaml"
ARGS = ["plan", "--model", "gpt3-175b", "--num-layers", "16", "--gpu", "h100-sxm", "--topology-file", str(TOPOLOGY),
        "--gpus", "128", "--global-batch", "128", "--overlap-grad-reduce"]
SAMPLE = [Candidate(4, 4, 8, 1, "interleaved", 2, 1, "selective", True),
          Candidate(4, 8, 4, 1, "interleaved", 2, 1, "selective", True),
          Candidate(4, 4, 8, 1, "1f1b", 1, 1, "selective", True)]
BOUND = 0.01


@pytest.fixture(scope="module")
def timed():
    """The sample's DAG outcomes (the DAG runs once)."""
    inputs = plan_inputs(build_parser().parse_args(ARGS))
    rows = [Row(c) for c in SAMPLE]
    dag_time(rows, inputs.base, 128)
    return inputs, rows


def errors(timed) -> list[str]:
    """Every candidate whose estimate is off the DAG's time by more than BOUND, as lines."""
    inputs, rows = timed
    out = []
    for row in rows:
        e = estimate(row.candidate, inputs.profile, inputs.settings, PipelineTimer(inputs.profile.platform))
        err = e.time_s / dag_seconds(row) - 1
        if abs(err) > BOUND:
            out.append(f"{row.candidate.mesh} {row.candidate.schedule_label}: {err:+.2%}")
    return out


def test_buckets_reduced_as_their_chunk_completes_them(timed) -> None:
    assert errors(timed) == []


def test_every_chunk_ready_only_when_the_last_block_starts_is_caught(timed, monkeypatch) -> None:
    original = estimate_module._dp_synced_all
    monkeypatch.setattr(estimate_module, "_dp_synced_all",
                        lambda *args, stage_ends=None: original(*args[:10]))
    assert any("interleaved" in line for line in errors(timed))


def test_buckets_in_gradient_order_is_caught(timed, monkeypatch) -> None:
    monkeypatch.setattr(estimate_module, "_in_ready_order", lambda ready, cost: (ready, cost))
    assert any("interleaved" in line for line in errors(timed))
