"""The interleaved schedule (``--schedule interleaved --virtual-stages V``) inside hybrid runs:
``--pp P`` equals ``-case 4`` with the same schedule, the bubble is (P−1)/(V·R), representatives
equal the exact build with DP, TP and ZeRO, and bad combinations are one-line errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import triosim.graph.pipeline.rank_program as hybrid_module
from triosim import build_platform, load_trace, simulate
from triosim.cli.console import main
from triosim.errors import ConfigError
from triosim.graph.layer_count import count_layers
from triosim.graph.pipeline.schedules import BACKWARD, FORWARD
from triosim.graph.strategy import Strategy
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace
from triosim.trace.synthetic_transformer import (
    SyntheticTransformer,
    write_synthetic_transformer,
)

GPT = Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-cpu-bs8"


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a))


def _traces(tmp: Path):
    yield load_trace(GPT, batch_size=8)
    yield load_trace(write_synthetic_transformer(tmp / "t", SyntheticTransformer(layers=8, batch_size=8)),
                     batch_size=8)
    yield load_trace(write_synthetic_trace(tmp / "m", SyntheticModel(layers=8, batch_size=8, seed=3)), batch_size=8)


@pytest.mark.parametrize("p, v, mb", [(2, 2, 2), (2, 2, 1), (4, 2, 2)])
def test_pp_interleaved_equals_case_4(tmp_path, p, v, mb):
    """Original network model (the API's defaults): the same pipeline, task for task, except that
    a hybrid block waits for what it receives before its first task, as Megatron waits for a
    receive before the step using it, where -case 4 (the original TrioSim's) waits only at the
    op reading it: a block that starts with other ops (the synthetic transformer's) runs them
    later. Exactly equal where every block's first op reads its input (the GPT sample)."""
    for trace in _traces(tmp_path):
        if count_layers(trace).count < p * v:  # the GPT sample's 4 layers make 4 stages at most
            continue
        kw = dict(micro_batch_size=mb, schedule="interleaved", virtual_stages=v)
        a = simulate(trace, build_platform(p), Strategy(pp=p, **kw))
        b = simulate(trace, build_platform(p), Strategy(case=4, **kw))
        if Path(trace.path) == GPT:
            assert _close(a.makespan_s, b.makespan_s), (trace.path, a.makespan_s, b.makespan_s)
        else:
            assert b.makespan_s * (1 - 1e-9) <= a.makespan_s <= b.makespan_s * 1.01, (trace.path, a.makespan_s,
                                                                                     b.makespan_s)
        assert [g.peak_memory_bytes for g in a.per_gpu] == [g.peak_memory_bytes for g in b.per_gpu]
        assert a.graph.meta["hybrid"]["stage_parameters"] and len(a.per_gpu) == p


def _uniform(tmp: Path):
    path = write_synthetic_trace(tmp / "u", SyntheticModel(layers=16, batch_size=16, min_us=100.0, max_us=100.0))
    trace = load_trace(path, batch_size=16)
    ops = [op._replace(duration_s=1e-9) if "loss" in op.name.lower() or op.stage == "optimizer" else op
           for op in trace.ops]
    return replace(trace, ops=ops)


def _bubble(trace, p: int, v: int, r: int) -> float:
    res = simulate(trace, build_platform(p, ptp_bandwidth_gbps=1e6, link_latency_us=0.0),
                   Strategy(pp=p, micro_batch_size=trace.batch_size // r, schedule="interleaved", virtual_stages=v,
                            partition="time"))
    ideal = sum(op.duration_s for op in trace.ops) / p
    return (res.makespan_s - ideal) / ideal


@pytest.mark.parametrize("p, v, r", [(4, 2, 4), (4, 4, 8), (2, 2, 16)])
def test_bubble_is_p_minus_1_over_v_r(tmp_path, p, v, r):
    assert _bubble(_uniform(tmp_path), p, v, r) == pytest.approx((p - 1) / (v * r), rel=1e-4)


def test_planted_bug_one_micro_batch_at_a_time_is_caught(tmp_path, monkeypatch):
    """Bug: a GPU takes each micro-batch through all its virtual stages before starting the next
    (no overlap of micro-batches across the ring): the bubble is far above (P−1)/(V·R)."""
    def depth_first(ranks, num_micro, rank, virtual):
        fwd = [(FORWARD, r, v) for r in range(num_micro) for v in range(virtual)]
        bwd = [(BACKWARD, r, v) for r in range(num_micro) for v in reversed(range(virtual))]
        return fwd + bwd

    monkeypatch.setattr(hybrid_module, "interleaved_order", depth_first)
    closed = 3 / (2 * 8)
    assert _bubble(_uniform(tmp_path), 4, 2, 8) > 1.5 * closed


@pytest.mark.parametrize("dp, tp, zero", [(2, 1, 0), (1, 2, 1), (2, 2, 3)])
def test_representatives_equal_exact(dp, tp, zero):
    trace = load_trace(GPT, batch_size=8)
    n = dp * tp * 2
    results = []
    for exact in (True, False):
        s = Strategy(dp=dp, tp=tp, pp=2, zero=zero, micro_batch_size=2, schedule="interleaved", virtual_stages=2,
                     exact=exact, collective_detail="macro")
        results.append(simulate(trace, build_platform(n, topology="switch"), s))
    a, b = results
    assert _close(a.makespan_s, b.makespan_s)
    peak = {g.gpu: g.peak_memory_bytes for g in a.per_gpu}
    assert all(peak[g.gpu] == g.peak_memory_bytes for g in b.per_gpu)


def test_stages_more_than_layers_is_refused():
    with pytest.raises(ConfigError, match=r"--pp 4 × --virtual-stages 2 = 8 stages is more than the model's 4 "):
        simulate(load_trace(GPT, batch_size=8), build_platform(4),
                 Strategy(pp=4, micro_batch_size=2, schedule="interleaved", virtual_stages=2))


@pytest.mark.parametrize("argv, needle", [
    (["--pp", "2", "-micro-batch-size", "8", "--schedule", "interleaved", "--virtual-stages", "2"],
     "multiple of the pipeline's GPUs (2)"),
    (["--pp", "4", "-micro-batch-size", "2", "--schedule", "interleaved", "--virtual-stages", "2"],
     "--pp 4 × --virtual-stages 2 = 8 stages is more than the model's 4 transformer layers"),
])
def test_bad_interleaved_combinations_exit_2(capsys, argv, needle):
    code = main(["run", "-trace-dir", str(GPT), *argv, "-q"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err


def test_cli_runs_dp_tp_pp_interleaved(capsys):
    code = main(["run", "-trace-dir", str(GPT), "--dp", "2", "--tp", "2", "--pp", "2", "-micro-batch-size", "2",
                 "--schedule", "interleaved", "--virtual-stages", "2", "-q"])
    out, _ = capsys.readouterr()
    assert code == 0 and float(out) > 0
