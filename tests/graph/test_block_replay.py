"""Pipeline blocks added from a template (triosim.graph.pipeline.block_replay) make the same graph,
schedule and report as blocks built op by op."""

from __future__ import annotations

from pathlib import Path

import pytest

from triosim.config import configure
from triosim.graph import build_graph
from triosim.graph.pipeline import block_replay, rank_program
from triosim.schedule.list_scheduler import schedule

ROOT = Path(__file__).resolve().parents[2]
SUPERPOD = str(ROOT / "topologies" / "dgx-a100-superpod.yaml")
BASE = dict(model="gpt-neo-1.3b", num_layers=4, gpu="a100-80gb", topology_file=SUPERPOD, tp=4, pp=2,
            schedule="1f1b", global_batch=16, micro_batch_size=1, pipeline_send="blocking",
            pipeline_scatter_gather=True, representatives=True)
CASES = {
    "selective+sp": dict(recompute="selective", sequence_parallel=True),
    "plain": dict(),
    "full recompute": dict(recompute="full"),
    "interleaved, overlapped sends": dict(schedule="interleaved", virtual_stages=2, num_layers=8,
                                          pipeline_send="overlapped"),
    "interleaved, blocking sends, pp 4": dict(schedule="interleaved", virtual_stages=2, num_layers=8, pp=4),
    "dp 2, ZeRO-1, overlapped gradient reduce": dict(dp=2, zero=1, overlap_grad_reduce=True,
                                                     recompute="selective", sequence_parallel=True),
    # ring attention: each attention op's partial attentions and key/value exchanges, and the
    # context-parallel tallies, added from the template
    "context parallel ring, cp 2": dict(model="llama3-8b", seq_len=4096, cp=2, sequence_parallel=True),
    "context parallel ring, cp 4, interleaved": dict(model="llama3-8b", seq_len=4096, cp=4, dp=2, zero=1,
                                                     schedule="interleaved", virtual_stages=2, num_layers=8,
                                                     pipeline_send="overlapped", recompute="selective",
                                                     sequence_parallel=True),
    # ZeRO-3: each block's unit gathers (the first after the GPU's previous gather) and dp tallies
    "dp 2, ZeRO-3": dict(dp=2, zero=3, recompute="selective", sequence_parallel=True),
    "dp 2, ZeRO-3, full recompute, interleaved": dict(dp=2, zero=3, recompute="full", schedule="interleaved",
                                                      virtual_stages=2, num_layers=8, pipeline_send="overlapped"),
    "context parallel ring and ZeRO-3": dict(model="llama3-8b", seq_len=4096, cp=2, dp=2, zero=3,
                                             sequence_parallel=True),
    # --overlap-param-gather: the first micro-batch's forward blocks gather (built op by op), the
    # rest repeat; interleaved, the gathers of later chunks go out between blocks (aligned)
    "dp 2, ZeRO-1, overlapped parameter gather": dict(dp=2, zero=1, overlap_grad_reduce=True,
                                                      overlap_param_gather=True, recompute="selective",
                                                      sequence_parallel=True),
    "dp 2, ZeRO-2, overlapped parameter gather, interleaved": dict(
        dp=2, zero=2, overlap_grad_reduce=True, overlap_param_gather=True, schedule="interleaved",
        virtual_stages=2, num_layers=8, pipeline_send="overlapped"),
}


class _BuiltOpByOp(block_replay.BlockReplay):
    """A replay that never adds a block from its template: every block is built op by op."""

    def replay(self, key, r, last, firsts) -> bool:
        return False


def _graph(monkeypatch, replay_cls, flags):
    monkeypatch.setattr(rank_program, "BlockReplay", replay_cls)
    used = []

    class Counting(replay_cls):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            used.append(self)

    monkeypatch.setattr(rank_program, "BlockReplay", Counting)
    trace, platform, strategy = configure(**{**BASE, **flags})
    graph = build_graph(trace, platform, strategy)
    return graph, sum(r.replayed for r in used)


def _columns(graph) -> tuple:
    return (graph.kind, graph.label, graph.duration, graph.resources, graph.devices, graph.nbytes, graph.latency,
            graph.attrs, graph.succ, graph.npred, graph.resource_names)


@pytest.mark.parametrize("flags", CASES.values(), ids=CASES.keys())
def test_replayed_blocks_equal_built_ones(monkeypatch, flags) -> None:
    built, none = _graph(monkeypatch, _BuiltOpByOp, flags)
    replayed, count = _graph(monkeypatch, block_replay.BlockReplay, flags)
    assert none == 0 and count > 0  # the template path ran
    assert _columns(replayed) == _columns(built)
    assert repr(replayed.meta) == repr(built.meta)  # memory plan, collectives rows, TP tallies
    a, b = schedule(built), schedule(replayed)
    assert (a.start, a.end, a.makespan) == (b.start, b.end, b.makespan)


def test_a_block_that_differs_is_not_replayed(monkeypatch) -> None:
    """Two recordings of a block that differ (here: a planted change of its first task's duration
    at every recording) leave no template: every block is built op by op."""
    orig = block_replay.BlockReplay._template

    def planted(self, rec, last, firsts):
        tmpl = orig(self, rec, last, firsts)
        if tmpl is not None:
            tmpl.columns[1][0] += rec.r * 1e-9
        return tmpl

    monkeypatch.setattr(block_replay.BlockReplay, "_template", planted)
    _graph_, count = _graph(monkeypatch, block_replay.BlockReplay, CASES["plain"])
    assert count == 0


def test_replayed_blocks_are_spelled_out_only_when_read(monkeypatch) -> None:
    """A replayed block's labels and attributes are written out on the first read of
    ``graph.label`` or ``graph.attrs``; until then the scheduler and the summaries read the
    stored rows (each replayed task: its template's dict less its micro-batch and collective
    name) and give the same figures as on a graph built op by op."""
    from triosim.report.result import summarize

    flags = CASES["selective+sp"]
    built, _ = _graph(monkeypatch, _BuiltOpByOp, flags)
    replayed, count = _graph(monkeypatch, block_replay.BlockReplay, flags)
    _trace, platform, _strategy = configure(**{**BASE, **flags})
    a, b = schedule(built), schedule(replayed)
    assert (a.start, a.end) == (b.start, b.end)
    assert summarize(built, a, platform) == summarize(replayed, b, platform)
    assert replayed._templated, "scheduling or summarising spelled the blocks out"
    unspelled = [None if label is None else 1 for label in replayed.label_rows]
    rows = list(replayed.attr_rows)
    spelled = replayed.attrs  # the first read: spelled out
    assert not replayed._templated
    assert unspelled.count(None) > count  # every replayed task was left unlabelled
    for t, (row, full) in enumerate(zip(rows, spelled)):
        if unspelled[t] is None:
            assert row is None or not {"microbatch", "collective"} & row.keys()
            assert (row or {}) == {k: v for k, v in full.items() if k not in ("microbatch", "collective")}
        else:
            assert row is full
    assert replayed.label == built.label and spelled == built.attrs


def test_blocks_after_the_parameter_gathers_are_replayed(monkeypatch) -> None:
    """Only the first micro-batch's forward blocks gather the parameters: every later block comes
    from a template as it does without the gathers (a gathering block, which no template
    expresses, is never watched: that would stop the watch of its stage's forward blocks)."""
    for order in (dict(), dict(schedule="interleaved", virtual_stages=2, num_layers=8, pipeline_send="overlapped")):
        flags = dict(dp=2, zero=1, overlap_grad_reduce=True, global_batch=32, **order)
        _, plain = _graph(monkeypatch, block_replay.BlockReplay, flags)
        _, gathering = _graph(monkeypatch, block_replay.BlockReplay, {**flags, "overlap_param_gather": True})
        assert gathering >= plain > 0, order
