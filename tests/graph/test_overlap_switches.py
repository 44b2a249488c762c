"""Megatron-Core's overlap switches on the composition: --pipeline-send blocking vs overlapped,
--overlap-grad-reduce vs Megatron's default (gradients reduced after the backward), and
--overlap-param-gather; each property with the planted bug it catches."""

from __future__ import annotations

import tempfile
from dataclasses import replace

import pytest

from triosim import build_platform, load_trace
from triosim.errors import ConfigError
from triosim.graph import build_graph
from triosim.graph.data import gradient_sync
from triosim.graph.pipeline import blocking, rank_program
from triosim.graph.pipeline.schedules import FORWARD
from triosim.graph.strategy import Strategy
from triosim.schedule.list_scheduler import schedule
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace
from triosim.trace.synthetic_transformer import SyntheticTransformer, write_synthetic_transformer


def _trace(layers: int = 4):
    model = SyntheticModel(layers=layers, batch_size=8, seed=2, min_us=100.0, max_us=300.0)
    with tempfile.TemporaryDirectory() as tmp:
        return load_trace(write_synthetic_trace(tmp, model), batch_size=8)


def _run(n: int, strategy: Strategy, gbps: float = 65.0):
    g = build_graph(_trace(), build_platform(n, ptp_bandwidth_gbps=gbps, topology="switch"), strategy)
    return g, schedule(g)


def _compute_on(g, gpu: int) -> list[int]:
    return [t for t in range(len(g)) if g.kind[t] == "compute" and g.devices[t] == (gpu,)]


# ----------------------------------------------------------------------------- pipeline sends


def _sends_overlapping_compute(g, s) -> int:
    """Pipeline sends during which the sending or the receiving GPU computes."""
    busy = {gpu: [(s.start[t], s.end[t]) for t in _compute_on(g, gpu)] for gpu in range(4)}
    hits = 0
    for t in range(len(g)):
        if g.kind[t] != "transfer" or not g.label[t].startswith("send "):
            continue
        a, b = s.start[t], s.end[t]
        if any(x < b and a < y for gpu in g.devices[t] for x, y in busy[gpu] if y > x):
            hits += 1
    return hits


@pytest.mark.parametrize("schedule_name", ["1f1b", "gpipe"])
def test_a_blocking_send_holds_both_stages(schedule_name):
    """Megatron's batched send/receive: a stage computes on only after its send and the matching
    receive have finished, so no stage computes while one of its sends is in flight; the
    overlapped sends of Megatron-Core's overlap_p2p_comm run beside compute."""
    kw = dict(pp=2, micro_batch_size=2, schedule=schedule_name)
    g, s = _run(2, Strategy(pipeline_send="blocking", **kw), gbps=0.05)
    assert _sends_overlapping_compute(g, s) == 0
    g2, s2 = _run(2, Strategy(pipeline_send="overlapped", **kw), gbps=0.05)
    assert _sends_overlapping_compute(g2, s2) > 0
    assert s.makespan > s2.makespan


def test_blocking_sends_catch_a_planted_bug(monkeypatch):
    """Bug: the next block of the sending stage does not wait for its send."""
    monkeypatch.setattr(blocking.StreamNeighbours, "after", lambda self, gpu, task: None)
    g, s = _run(2, Strategy(pp=2, micro_batch_size=2, schedule="1f1b", pipeline_send="blocking"), gbps=0.05)
    assert _sends_overlapping_compute(g, s) > 0


def test_auto_sends_block_under_1f1b_and_overlap_when_interleaved():
    assert Strategy(pp=2, schedule="1f1b").blocking_sends
    assert not Strategy(pp=4, schedule="interleaved", virtual_stages=2).blocking_sends
    assert not Strategy(case=4).blocking_sends  # the original's case 4 keeps its sends
    with pytest.raises(ConfigError, match="--pp 3 or more"):
        _run(2, Strategy(pp=2, micro_batch_size=1, schedule="interleaved", virtual_stages=2,
                         pipeline_send="blocking"))


# ----------------------------------------------------------------------------- gradient reduce


def _gradient_collectives(g) -> list[int]:
    return [t for t in range(len(g)) if (g.attrs[t] or {}).get("bucket") is not None and g.kind[t] != "sync"]


def _reduced_after_backward(g, s) -> bool:
    """Megatron's default: every gradient collective starts once the GPU's last backward op has ended."""
    last_bwd = max(s.end[t] for t in _compute_on(g, 0) if g.attrs[t]["stage"] == "backward")
    return min(s.start[t] for t in _gradient_collectives(g)) >= last_bwd


def test_gradients_reduce_after_the_backward_unless_overlapped():
    kw = dict(dp=2, bucket_mb=0.001, collective_detail="macro")
    g, s = _run(2, Strategy(**kw))
    assert _reduced_after_backward(g, s)
    assert len({g.attrs[t]["bucket"] for t in _gradient_collectives(g)}) == 1  # one bucket: Megatron's infinite size
    g2, s2 = _run(2, Strategy(overlap_grad_reduce=True, **kw))
    assert not _reduced_after_backward(g2, s2)
    assert len({g2.attrs[t]["bucket"] for t in _gradient_collectives(g2)}) > 1
    assert sum(g.nbytes[t] for t in _gradient_collectives(g)) == sum(g2.nbytes[t] for t in _gradient_collectives(g2))


def test_gradient_reduce_timing_catches_a_planted_bug(monkeypatch):
    """Bug: without --overlap-grad-reduce the buckets still start as backward fills them."""
    monkeypatch.setattr(gradient_sync, "overlapped", lambda b: True)
    g, s = _run(2, Strategy(dp=2, bucket_mb=0.001, collective_detail="macro"))
    assert not _reduced_after_backward(g, s)


# ----------------------------------------------------------------------------- parameter gather


def _gathers(g) -> list[int]:
    return [t for t in range(len(g)) if g.kind[t] == "collective" and "gather" in g.label[t]]


def _param_gather_ok(g, s) -> bool:
    """ZeRO-1 with --overlap-param-gather: the parameters gathered once, in buckets, none after
    the optimizer, the first forward op after the first bucket's gather."""
    trace = _trace()
    params = sum(trace.tensors[p].bytes for p in trace.parameters)
    opt = min(s.start[t] for t in _compute_on(g, 0) if g.attrs[t]["stage"] == "optimizer")
    first_fwd = min(s.start[t] for t in _compute_on(g, 0) if g.attrs[t]["stage"] == "forward")
    gathers = _gathers(g)
    return (len(gathers) > 1 and sum(g.nbytes[t] for t in gathers) == params
            and max(s.end[t] for t in gathers) <= opt and first_fwd >= min(s.end[t] for t in gathers))


def test_parameters_gathered_before_forward_with_overlap_param_gather():
    kw = dict(dp=2, zero=1, bucket_mb=0.001, collective_detail="macro", overlap_grad_reduce=True)
    g, s = _run(2, Strategy(overlap_param_gather=True, **kw))
    assert _param_gather_ok(g, s)
    g2, s2 = _run(2, Strategy(**kw))  # Megatron's default: one all-gather after the optimizer step
    last = max(range(len(g2)), key=lambda t: s2.end[t])
    assert _gathers(g2) == [last] and not _param_gather_ok(g2, s2)


def test_param_gather_catches_a_planted_bug(monkeypatch):
    """Bug: the last bucket's parameters gathered with the ones before it (counted twice)."""
    real = rank_program.fsdp_units

    def doubled(*a):
        units = real(*a)
        fwd = units[FORWARD]
        return {**units, FORWARD: [*fwd[:-1], replace(fwd[-1], nbytes=fwd[-1].nbytes + fwd[0].nbytes)]}

    monkeypatch.setattr(rank_program, "fsdp_units", doubled)
    g, s = _run(2, Strategy(dp=2, zero=1, bucket_mb=0.001, collective_detail="macro", overlap_grad_reduce=True,
                            overlap_param_gather=True))
    assert not _param_gather_ok(g, s)


def test_overlap_param_gather_needs_what_megatron_asserts():
    with pytest.raises(ConfigError, match="--overlap-param-gather needs the distributed optimizer"):
        Strategy(dp=2, overlap_param_gather=True, overlap_grad_reduce=True).validate(2)
    with pytest.raises(ConfigError, match="needs --overlap-grad-reduce"):
        Strategy(dp=2, zero=1, overlap_param_gather=True).validate(2)
    with pytest.raises(ConfigError, match="needs the degrees"):
        Strategy(case=2, overlap_grad_reduce=True).validate(8)


# ----------------------------------------------------------------------------- scatter/gather


def _sends_and_gathers(strategy: Strategy, n: int = 4):
    g, s = _run(n, strategy, gbps=0.5)
    sends = [t for t in range(len(g)) if g.kind[t] == "transfer" and g.label[t].startswith("send ")]
    gathers = [t for t in range(len(g)) if g.kind[t] != "sync" and g.label[t].startswith("tp gather ")]
    return g, s, sends, gathers


def test_scatter_gather_sends_a_tp_share_and_gathers_it_before_the_readers():
    """Megatron-LM 2021–22 without sequence parallelism: each TP rank sends 1/tp of a pipeline
    tensor and the receiving TP group all-gathers it before the stage reads it."""
    kw = dict(pp=2, tp=2, micro_batch_size=4, schedule="1f1b", pipeline_send="blocking", exact=True,
              collective_detail="macro")
    g, s, sends, gathers = _sends_and_gathers(Strategy(**kw))
    g2, s2, sends2, gathers2 = _sends_and_gathers(Strategy(pipeline_scatter_gather=True, **kw))
    assert not gathers and gathers2 and len(sends2) == len(sends)
    assert sorted(-(-g.nbytes[t] // 2) for t in sends) == sorted(g2.nbytes[t] for t in sends2)
    for t in gathers2:  # the readers of the buffer wait for the gather (through its per-GPU "done" tasks)
        after = [w for u in g2.succ[t] for w in ([u] if g2.kind[u] == "compute" else g2.succ[u])]
        readers = [u for u in after if g2.kind[u] == "compute"]
        assert readers and all(s2.start[u] >= s2.end[t] for u in readers)
    # no reader waits for a bare share (a send's compute successor is its sender's next block: blocking)
    assert all(g2.devices[u] != (g2.devices[t][1],) for t in sends2 for u in g2.succ[t] if g2.kind[u] == "compute")


def test_scatter_gather_is_off_with_sequence_parallelism():
    kw = dict(pp=2, tp=2, micro_batch_size=4, schedule="1f1b", sequence_parallel=True, tp_style="megatron")
    with tempfile.TemporaryDirectory() as tmp:
        trace = load_trace(write_synthetic_transformer(tmp, SyntheticTransformer(layers=2, batch_size=8)),
                           batch_size=8)
    g = build_graph(trace, build_platform(4, topology="switch"), Strategy(pipeline_scatter_gather=True, **kw))
    assert not any(label.startswith("tp gather ") for label in g.label)
