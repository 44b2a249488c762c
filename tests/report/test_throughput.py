"""Throughput figures: global batch, micro-batches, samples/s, tokens/s, TFLOP/s per GPU and MFU,
as closed forms of the iteration time, the model FLOPs, the degrees and the device's peak.

Planted bugs each test catches (shown when the feature was added): the global batch without the
dp factor; TFLOP/s not divided by the GPU count; the peak taken for the trace's dtype instead of
the run's ``--dtype``; the micro-batch count of a ``-case 2`` run taken from ``-micro-batch-size``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from triosim.cli.console import main
from triosim.compute.model_flops import megatron_gpt_flops
from triosim.hardware.device_db import get_device
from triosim.report.throughput import Throughput, throughput_lines

GPT = str(Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-h200-bs8")  # 4 × d256, V 4096, s 128, bs 8
GPT_FLOPS_PER_SAMPLE = megatron_gpt_flops(1, 128, 4, 256, 4096)


def _json(capsys, *argv: str) -> dict:
    code = main(["run", "-trace-dir", GPT, *argv, "--json", "-"])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)


def test_known_time_gives_the_closed_forms():
    t = Throughput(global_batch=64, data_parallel=4, micro_batch=2, micro_batches=8, iteration_s=2.0, gpus=16,
                   model_flops=3.2e16, seq_len=2048, peak_flops=1e15, peak_dtype="bf16", gpu_name="X")
    assert t.samples_per_s == 32.0
    assert t.tokens_per_s == 32.0 * 2048
    assert t.flops_per_gpu == 3.2e16 / 2.0 / 16  # 1e15: every GPU at its peak
    assert t.mfu == 1.0
    d = t.to_dict()
    assert d["model_tflops_per_s_per_gpu"] == 1000.0 and d["peak_tflops_per_gpu"] == 1000.0 and d["mfu"] == 1.0
    lines = throughput_lines(d, "X")
    assert lines[0] == "Batch: global 64 = dp 4 × 8 micro-batches of 2"
    assert lines[-1] == "MFU: 100.0 % of X's dense bf16 peak (1,000 TFLOP/s)"


def test_no_sequence_and_no_gpu_leave_tokens_and_mfu_out():
    t = Throughput(global_batch=8, data_parallel=1, micro_batch=8, micro_batches=1, iteration_s=0.5, gpus=1,
                   model_flops=1e12)
    assert t.tokens_per_s is None and t.mfu is None and t.samples_per_s == 16.0
    assert [line.split(":")[0] for line in throughput_lines(t.to_dict())] == ["Batch", "Throughput", "Model FLOPs"]


def test_no_shapes_means_no_flop_figures_not_zero():
    t = Throughput(global_batch=8, data_parallel=1, micro_batch=8, micro_batches=1, iteration_s=0.5, gpus=1,
                   model_flops=None, peak_flops=1e15, peak_dtype="bf16")
    assert t.flops_per_gpu is None and t.mfu is None and t.to_dict()["model_tflops_per_s_per_gpu"] is None
    assert [line.split(":")[0] for line in throughput_lines(t.to_dict())] == ["Batch", "Throughput"]
    from triosim.graph.strategy import Strategy
    from triosim.report.throughput import throughput_of
    from triosim.trace.load import load_trace

    trace = load_trace(GPT)
    assert throughput_of(trace, Strategy(dp=2), 2, 1.0, 0.0).model_flops is None
    assert throughput_of(trace, Strategy(dp=2), 2, 1.0, 5.0).model_flops == 5.0 * 16


def test_hybrid_run_with_global_batch(capsys):
    d = _json(capsys, "--dp", "2", "--tp", "2", "--pp", "2", "--global-batch", "64", "-micro-batch-size", "2",
              "--schedule", "1f1b")
    t, seconds = d["throughput"], d["makespan_ms"] / 1e3
    assert (t["global_batch"], t["data_parallel"], t["micro_batch"], t["micro_batches"]) == (64, 2, 2, 16)
    assert d["batch_size_sim"] == 32  # each replica: 64 / dp 2
    assert t["samples_per_s"] == pytest.approx(64 / seconds, rel=1e-7)
    assert t["tokens_per_s"] == pytest.approx(64 * 128 / seconds, rel=1e-7)
    assert t["model_flops_per_iteration"] == pytest.approx(64 * GPT_FLOPS_PER_SAMPLE, rel=1e-12)
    assert t["model_tflops_per_s_per_gpu"] == pytest.approx(64 * GPT_FLOPS_PER_SAMPLE / seconds / 8 / 1e12, rel=1e-6)
    assert t["mfu"] is None and t["peak_tflops_per_gpu"] is None  # no --gpu


def test_mfu_is_achieved_over_the_dtype_peak_of_the_device(capsys):
    d = _json(capsys, "--dp", "2", "--gpu", "h100-sxm", "--op-time-source", "roofline", "--dtype", "bf16")
    t, seconds = d["throughput"], d["makespan_ms"] / 1e3
    peak = get_device("h100-sxm").matrix_peak("bf16")
    assert t["peak_dtype"] == "bf16" and t["peak_tflops_per_gpu"] == pytest.approx(peak / 1e12)
    achieved = 16 * GPT_FLOPS_PER_SAMPLE / seconds / 2  # dp 2 × batch 8, on 2 GPUs
    assert t["mfu"] == pytest.approx(achieved / peak, rel=1e-6)


def test_trace_dtype_peak_without_dtype_flag(capsys):
    d = _json(capsys, "--gpu", "h100-sxm", "--op-time-source", "roofline")
    assert d["throughput"]["peak_dtype"] == "fp32"  # the trace's fp32 matmuls: no TF32 for matmul by default
    assert d["throughput"]["peak_tflops_per_gpu"] == pytest.approx(get_device("h100-sxm").matrix_peak("fp32") / 1e12)


@pytest.mark.parametrize("argv, expected", [
    (("-case", "2", "-GPUnumber", "4"), (32, 4, 8, 1)),  # a batch of 8 per GPU, one micro-batch
    (("-case", "2", "-GPUnumber", "4", "-micro-batch-size", "4"), (32, 4, 8, 1)),  # case 2 has no micro-batches
    (("-case", "4", "-GPUnumber", "2", "-micro-batch-size", "3"), (8, 1, 3, 3)),  # 3 + 3 + 2
    (("--dp", "2", "-micro-batch-size", "4"), (16, 2, 4, 2)),
])
def test_case_and_hybrid_batches(capsys, argv, expected):
    t = _json(capsys, *argv)["throughput"]
    assert (t["global_batch"], t["data_parallel"], t["micro_batch"], t["micro_batches"]) == expected


def test_summary_shows_the_lines(capsys):
    code = main(["run", "-trace-dir", GPT, "--dp", "2", "--global-batch", "32", "-micro-batch-size", "4",
                 "--gpu", "h100-sxm"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Batch: global 32 = dp 2 × 4 micro-batches of 4" in out
    assert "tokens/s (sequence 128)" in out and "TFLOP/s per GPU" in out and "MFU: " in out
