"""ZeRO-3's parameter gathers beside the interleaved schedule's pipeline transfers, estimate
against DAG: with tp 8 a node holds one TP group, so the next stage and the other data ranks
are in other nodes and the transfers (the whole activation per TP rank without sequence
parallelism) and the gathers cross the same NIC. An 8-layer Llama 3 70B on 32 H100s of the
SuperPOD file: the time within 5 % of the DAG; leaving the sharing out is caught (the estimate
then 12-22 % under the DAG). With tp 4 a transfer to the next node leaves through a node peer's
NIC, where that peer's gathers run: leaving the peer out is caught too."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from triosim.plan import Candidate

from .test_estimate_vs_dag import fresh_errors, time_groups

zero3_pipeline = importlib.import_module("triosim.plan.zero3_pipeline")
pipeline_sends = importlib.import_module("triosim.plan.pipeline_sends")

SUPERPOD = str(Path(__file__).resolve().parents[2] / "topologies" / "dgx-h100-superpod.yaml")
ARGS = ["--model", "llama3-70b", "--num-layers", "8", "--gpu", "h100-sxm", "--topology-file", SUPERPOD,
        "--gpus", "32", "--global-batch", "16"]
C = Candidate
# (tp, pp, dp, micro-batch, schedule, V, ZeRO, recompute, sequence parallel, cp)
SAMPLE = [
    C(8, 2, 1, 1, "interleaved", 4, 3, "none", False, 2),  # the data ranks are the context ranks
    C(8, 2, 2, 1, "interleaved", 4, 3, "none", False, 1),
    C(4, 2, 2, 1, "interleaved", 4, 3, "none", False, 2),
    # tp 4: stages 1 and 2 in other nodes, and the rail-optimized fabric takes stage 1's
    # transfer through its node peer's NIC, where stage 0's gathers run (PXN)
    C(4, 4, 2, 1, "interleaved", 2, 3, "none", False, 1),
    C(2, 4, 2, 1, "interleaved", 2, 3, "none", False, 2),
]
THROUGH_A_PEER = SAMPLE[3]


@pytest.fixture(scope="module")
def timed():
    return time_groups([(ARGS, SAMPLE)])


def test_gathers_beside_the_transfers_are_the_dags(timed) -> None:
    bad = [(c, t) for c, t, _m in fresh_errors(timed) if abs(t) > 0.05]
    assert bad == []


def test_the_sharing_left_out_is_caught(timed, monkeypatch) -> None:
    monkeypatch.setattr(zero3_pipeline, "gathers_beside_sends", lambda *args: None)
    assert any(t < -0.05 for _c, t, _m in fresh_errors(timed))


def test_a_route_through_a_third_gpu_left_out_is_caught(timed, monkeypatch) -> None:
    # counting only the sending and the receiving stage's work beside a transfer misses the
    # node peer whose NIC it leaves through: the estimate then 2 points lower
    def error() -> float:
        (t,) = [t for c, t, _m in fresh_errors(timed) if c == THROUGH_A_PEER]
        return t

    right = error()
    touches = pipeline_sends._touches

    def ends_only(c, timer, links_of):
        both = touches(c, timer, links_of)
        if both is None:
            return None
        out, into = (x.copy() for x in both)
        for j in range(1, c.pp * c.virtual):
            peers = np.ones(c.pp, dtype=bool)
            peers[[(j - 1) % c.pp, j % c.pp]] = False
            out[:, peers, j] = into[:, peers, j] = False
        return out, into

    monkeypatch.setattr(pipeline_sends, "_touches", ends_only)
    assert error() < right - 0.015
