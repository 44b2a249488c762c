"""The plan's estimate against the task DAG on activation offload (``--offload-activations``,
Megatron-Core's CPU offloading): a 4-layer Llama 3 8B and a 4-layer GPT-3 175B on 8 H100s
(a 64 GB/s host link each way), one stage and pipelines (1F1B and interleaved), ZeRO 0-2,
sequence parallelism on and off, N layers and a fraction of each chunk's, and a 32-layer GPT-3
on 4 and 8 interleaved stages, each DAG-timed once. Peak memory equal (within 0.1 %: the
offloaded activations are freed at the offload op and re-made by the reload, as the DAG's memory
plan has them), time within 2.5 % (TIME_BOUND) and never more than TIME_OVER_BOUND above (the
estimates claim that bound). Each term (the copies' time, the reload that starts while its block
waits for its input, the copy at a chunk's end, the later reloads behind the first, the freed
activations) is then broken on purpose and the comparison must catch it; the plan, given
``--offload-activations``, offloads in every candidate, and without it tries offload on the
candidates that do not fit."""

from __future__ import annotations

import csv
import importlib
from dataclasses import replace

import numpy as np
import pytest
from cli_capture import run

from triosim.plan import Candidate, PipelineTimer, estimate
from triosim.plan.estimate import TIME_OVER_BOUND

from .test_estimate_vs_dag import GPT3, LLAMA, fresh_errors, time_groups

offload_profile = importlib.import_module("triosim.plan.offload_profile")
C = Candidate


def off(c: Candidate, text: str) -> Candidate:
    return replace(c, offload=text)


# (tp, pp, dp, micro-batch, schedule, V, ZeRO, recompute, sequence parallel)
SAMPLE = [
    off(C(1, 1, 8, 1), "1"),
    off(C(1, 1, 8, 2, "1f1b", 1, 2), "3"),
    off(C(1, 2, 4, 1), "1"),
    off(C(2, 2, 2, 1, "1f1b", 1, 1, "none", True), "1"),
    off(C(1, 1, 8, 1, "1f1b", 1, 0), "0.5"),
    off(C(1, 2, 4, 1, "interleaved", 2, 2), "1"),
]


# Many interleaved stages with two layers a chunk (the GPT-3 175B plan's dp16×tp4×pp16 V3 in
# small): each forward block ends with its first layer's copy to host, which holds the GPU (and the
# next block's first reload) but not the send; charged to the next backward block from its
# input's arrival instead, the estimate was 6.0 % below the DAG here (7.3 % on the 175B plan).
INTERLEAVED = ["--model", "gpt3-175b", "--num-layers", "32", "--seq-len", "2048", "--gpu", "h100-sxm",
               "--topology", "nvlink-cluster", "--gpus", "8", "--global-batch", "64"]
# With three layers offloaded of a chunk's four, the block's later reloads follow its first on the
# host link: left out of the block's time from when the GPU is free, 3.0 % below the DAG.
DEEP = [off(C(1, 8, 1, 1, "interleaved", 2, 1), "1"), off(C(1, 4, 2, 1, "interleaved", 2, 1), "3")]


@pytest.fixture(scope="module")
def timed() -> list[tuple[object, list]]:
    return time_groups(((LLAMA, SAMPLE), (GPT3, SAMPLE), (INTERLEAVED, DEEP)))


# Time within 2.5 % and never 1 % above: the sample's worst is −1.9 % (Llama on dp2×tp2×pp2),
# none is above; a reload charged as if it started after the compute before it instead of while
# its block waits for its input is +1.5 % (GPT-3 on two 1F1B stages).
TIME_BOUND = 0.025
ABOVE_BOUND = TIME_OVER_BOUND


def errors(timed) -> list[str]:
    """Every candidate off the DAG by more than the bounds."""
    return [f"{c.mesh} {c.schedule_label} ZeRO-{c.zero} {c.recompute_label}: time {t:+.2%}, memory {m:+.2%}"
            for c, t, m in fresh_errors(timed) if abs(t) > TIME_BOUND or t > ABOVE_BOUND or abs(m) > 0.001]


def test_estimate_equals_the_dag_with_offload(timed) -> None:
    assert errors(timed) == []


def test_the_copies_time_left_out_is_caught(timed, monkeypatch) -> None:
    monkeypatch.setattr(offload_profile, "host_link_rate", lambda trace: float("inf"))
    assert errors(timed)


def test_the_reload_waiting_for_the_blocks_input_is_caught(timed, monkeypatch) -> None:
    # the first reload of a chunk's backward starts while the block waits for its input: charged
    # after the compute before it instead, a pipeline's estimate comes out high
    monkeypatch.setattr(offload_profile.OffloadProfile, "_first_reloads", property(lambda self: frozenset()))
    assert any("pp2" in line for line in errors(timed))


def test_the_copy_at_a_chunks_end_charged_to_the_next_backward_is_caught(timed, monkeypatch) -> None:
    # the estimate before: the copy's time added to the next backward block, from its input's
    # arrival, as if the GPU ran a backward next and the copy delayed nothing else
    original = PipelineTimer.rank_ends

    def planted(self, schedule, pp, virtual, micro, tp, forward, backward, cut_fwd, cut_bwd, from_free=None,
                held=None, pairs=None, slowed=None, blocking=False, stage_ends=False, first=None):
        if held is not None:
            backward = backward + held[0]
            from_free = (from_free[0], np.maximum(from_free[1] + held[0], backward))
        return original(self, schedule, pp, virtual, micro, tp, forward, backward, cut_fwd, cut_bwd, from_free,
                        pairs=pairs, slowed=slowed, blocking=blocking, stage_ends=stage_ends, first=first)

    monkeypatch.setattr(PipelineTimer, "rank_ends", planted)
    assert any("pp8 interleaved" in line for line in errors(timed))


def test_the_later_reloads_left_out_from_the_gpu_free_is_caught(timed, monkeypatch) -> None:
    original = offload_profile.OffloadProfile._measure

    def planted(self, batch, tp, sp, mb, cast_share):
        pt = original(self, batch, tp, sp, mb, cast_share)
        self._exposed[(batch, tp, sp, mb, cast_share)] = {}  # still charged from the input's arrival
        return pt

    monkeypatch.setattr(offload_profile.OffloadProfile, "_measure", planted)
    assert any("pp4 interleaved V2 ZeRO-1 offload 3" in line for line in errors(timed))


def test_the_freed_activations_left_out_is_caught(timed, monkeypatch) -> None:
    original = offload_profile.ModelProfile.stage_memories

    def planted(self, *args, **kwargs):  # the memory of the trace without the offload
        return original(self.parent if isinstance(self, offload_profile.OffloadProfile) else self, *args, **kwargs)

    monkeypatch.setattr(offload_profile.ModelProfile, "stage_memories", planted)
    assert any("memory" in line and "+0.00%" not in line.split("memory")[1] for line in errors(timed))


TIGHT = ["--model", "llama3-8b", "--num-layers", "4", "--seq-len", "4096", "--gpu", "h100-sxm", "--topology",
         "nvlink-cluster", "--gpus", "8", "--global-batch", "16", "--tp", "1", "--pp", "1", "--cp", "1", "--top", "0"]


def test_a_pinned_offload_is_every_candidates(tmp_path) -> None:
    out = tmp_path / "plan.csv"
    code, _, stderr = run(["plan", *TIGHT, "--offload-activations", "2", "--out", str(out)])
    assert code == 0, stderr
    rows = list(csv.DictReader(out.open()))
    assert {(x["recompute"], x["offload"]) for x in rows} == {("none", "2")}
    assert "3" not in {x["zero"] for x in rows}  # not under ZeRO-3
    assert rows[0]["command"].count("--offload-activations 2") == 1


def test_the_plan_finds_offload_where_nothing_lighter_fits(tmp_path) -> None:
    # 11.3 GB a GPU on GB200s (225 GB/s host links): without recomputation nothing fits (12.1 GB),
    # offloading 2 of the 4 layers does and is the fastest (216.4 ms, DAG-timed), ahead of block
    # recomputation of 2 layers (220.5 ms)
    gb200 = [x if x != "h100-sxm" else "gb200" for x in TIGHT[:-2]]
    out = tmp_path / "plan.csv"
    code, stdout, stderr = run(["plan", *gb200, "-capacity", "33.4", "--top", "3", "--out", str(out)])
    assert code == 0, stderr
    rows = list(csv.DictReader(out.open()))
    best = rows[0]
    assert (best["recompute"], best["offload"], best["status"]) == ("none", "2", "dag"), best
    assert "--offload-activations 2" in best["command"] and best["zero"] != "3"
    recomputed = [float(x["dag_ms"]) for x in rows if x["recompute"] != "none" and x["status"] == "dag"]
    assert recomputed and float(best["dag_ms"]) < min(recomputed)
    assert " refinements" in stdout and "offload 2" in stdout
    assert not any(x["offload"] and x["zero"] == "3" for x in rows)  # not under ZeRO-3


@pytest.mark.parametrize("flags,words", [
    (["--offload-activations", "1", "--recompute-modules", "mlp"], "Megatron-Core does not offload"),
    (["--offload-activations", "0"], "--offload-activations must be"),
])
def test_offload_refusals_are_one_line(flags, words) -> None:
    code, _, stderr = run(["plan", *TIGHT, *flags])
    assert code == 2 and words in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_offload_estimates_claim_the_bound(timed) -> None:
    # never more than TIME_OVER_BOUND above the DAG (errors() checks it): the plan skips an offload
    # refinement estimated that far above the best DAG time, as any other bounded row
    for inputs, rows in timed:
        timer = PipelineTimer(inputs.profile.platform)
        assert all(estimate(r.candidate, inputs.profile, inputs.settings, timer).bounded for r in rows)
