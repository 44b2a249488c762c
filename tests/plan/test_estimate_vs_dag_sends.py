"""The plan's estimate against the task DAG where whole tensors cross the pipeline (no sequence
parallelism) beside the TP collectives, on overlapped sends: each transfer slows the collectives
at its sending and at its receiving GPU, in the share of the time those GPUs work
(:func:`triosim.plan.pipeline_sends.beside_sends`)."""

from __future__ import annotations

import numpy as np
import pytest

from triosim.cli.console import build_parser
from triosim.cli.plan import plan_inputs
from triosim.plan import PipelineTimer, estimate, pipeline_sends
from triosim.plan.candidates import enumerate_candidates
from triosim.plan.report import dag_seconds
from triosim.plan.search import Row, dag_time

TWO_NODES = ["--gpu", "h100-sxm", "--topology", "nvlink-cluster", "--gpus-per-node", "8", "--gpus", "16"]
LLAMA_8B = ["--model", "llama3-8b", "--num-layers", "4", "--seq-len", "8192", *TWO_NODES, "--global-batch", "16"]
LLAMA_70B_FP8 = ["--model", "llama3-70b", "--num-layers", "4", "--seq-len", "4096", *TWO_NODES, "--global-batch",
                 "32", "--dtype", "fp8"]
# (plan flags, the candidate): a pipeline of 2 micro-batches, idle most of the time; one of 16
# micro-batches whose first and last chunks hold only the embedding and the loss
CASES = [
    (LLAMA_8B, dict(tp=4, pp=2, dp=2, micro_batch=4, schedule="interleaved", virtual=2, zero=0,
                    recompute="selective", sequence_parallel=False)),
    (LLAMA_70B_FP8, dict(tp=4, pp=2, dp=2, micro_batch=1, schedule="interleaved", virtual=3, zero=0,
                         recompute="selective", sequence_parallel=False, layout="E+1, L+1")),
]
BOUND = 0.05


def _pick(flags: list[str], want: dict):
    inputs = plan_inputs(build_parser().parse_args(["plan", *flags]))
    layout = want.pop("layout", None)
    for c in enumerate_candidates(inputs.space):
        if (all(getattr(c, k) == v for k, v in want.items()) and c.cp == 1 and c.offload is None
                and c.recompute_label == want["recompute"]
                and (c.layout_label == layout if layout else not c.split.given)):
            return inputs, c
    raise AssertionError(f"no candidate {want}")


@pytest.fixture(scope="module")
def timed() -> list[tuple[object, object, float]]:
    """Each case's inputs, candidate and DAG seconds (the DAG runs once)."""
    out = []
    for flags, want in CASES:
        inputs, c = _pick(flags, dict(want))
        row = Row(c)
        dag_time([row], inputs.base, inputs.space.global_batch)
        out.append((inputs, c, dag_seconds(row)))
    return out


def _errors(timed) -> list[float]:
    return [estimate(c, inputs.profile, inputs.settings, PipelineTimer(inputs.profile.platform)).time_s / dag_s - 1
            for inputs, c, dag_s in timed]


def test_whole_tensor_pipelines_beside_tp_are_the_dags(timed) -> None:
    assert all(abs(e) <= BOUND for e in _errors(timed)), _errors(timed)


def test_the_transfers_into_a_gpu_left_out_are_caught(timed, monkeypatch) -> None:
    # only the sender's collectives slowed: the 16-micro-batch pipeline comes out 6.2 % fast
    share = pipeline_sends.beside_transfers
    monkeypatch.setattr(pipeline_sends, "beside_transfers", lambda s, r, w, b: share(s, np.zeros_like(r), w, b))
    assert _errors(timed)[1] < -BOUND


def test_a_gpu_always_busy_is_caught(timed, monkeypatch) -> None:
    # transfers beside a GPU's idle time slow nothing: counted as beside its work, the pipeline of
    # 2 micro-batches comes out 5.4 % slow
    share = pipeline_sends.beside_transfers
    monkeypatch.setattr(pipeline_sends, "beside_transfers", lambda s, r, w, b: share(s, r, w, np.ones_like(b)))
    assert _errors(timed)[0] > BOUND
