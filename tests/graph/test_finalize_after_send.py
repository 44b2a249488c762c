"""Pipeline sends: what follows a rank's program waits for its last send.

Megatron-Core's 1F1B cooldown ends with ``send_backward`` (``_communicate(wait_on_reqs=True)``),
and the interleaved schedule with ``overlap_p2p_comm`` waits on the last send's handle; only then
do ``finalize_model_grads`` (the data-parallel gradient reduction, the tied embedding's
all-reduce) and the optimizer run. Before this, the gradient
reduction of a stage past the first started as soon as its last backward task ended, beside
its last send, and slowed that send (and the previous stage's last backward block waiting for it)
where both share a link."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

import triosim.graph.composition as composition
from triosim.config import configure
from triosim.graph import build_graph
from triosim.graph.strategy import Strategy
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.trace import load_trace
from triosim.trace.synthetic_transformer import SyntheticTransformer, write_synthetic_transformer

LLAMA = dict(model="llama3-8b", num_layers=4, seq_len=4096, gpu="h100-sxm", topology="nvlink-cluster",
             gpus_per_node=8, dp=4, pp=2, global_batch=8, micro_batch_size=1)


def _early(g, s) -> list[tuple[str, float, float]]:
    """Each task after a program that starts before its GPU's last pipeline send has ended:
    (its label, its start, that send's end). After a program: a gradient bucket's collective
    or the tied embedding's all-reduce, on a GPU that sends (a stage past the first)."""
    last_send: dict[int, float] = {}
    for i, kind in enumerate(g.kind):
        a = g.attrs[i] or {}
        if kind == "transfer" and a.get("direction") is not None:
            gpu = g.devices[i][0]
            last_send[gpu] = max(last_send.get(gpu, 0.0), s.end[i])
    assert last_send, "no pipeline send found"
    out = []
    for i, label in enumerate(g.label):
        a = g.attrs[i] or {}
        if a.get("bucket") is None and "tied embedding" not in label:
            continue
        for gpu in g.devices[i][:1]:
            if gpu in last_send and s.start[i] < last_send[gpu] - 1e-12:
                out.append((label, s.start[i], last_send[gpu]))
    return out


SENDS = {"blocking": {}, "overlapped": dict(pipeline_send="overlapped"),
         "interleaved": dict(schedule="interleaved", virtual_stages=2)}


@pytest.mark.parametrize("sends", list(SENDS))
@pytest.mark.parametrize("bulk", [True, False], ids=["sends in bulk", "sends call by call"])
@pytest.mark.parametrize("exact", [True, False], ids=["every GPU", "representatives"])
def test_the_gradient_reduction_starts_after_the_last_send(monkeypatch, bulk, exact, sends) -> None:
    """Blocking sends return once sent; with overlapped ones (``overlap_p2p_comm``) the schedule
    waits on the last send's handle before ``finalize_model_grads``."""
    monkeypatch.setattr(composition, "BULK_SENDS", bulk)
    trace, platform, strategy = configure(**{**LLAMA, **SENDS[sends]}, exact=exact)
    assert strategy.blocking_sends == (sends == "blocking")
    g = build_graph(trace, platform, strategy)
    s = schedule(g)
    assert any((a or {}).get("bucket") is not None for a in g.attrs)
    assert _early(g, s) == []


def test_the_tied_embedding_all_reduce_starts_after_the_last_send() -> None:
    model = SyntheticTransformer(layers=4, hidden=16, heads=4, seq_len=8, vocab=64, tied=True)
    with tempfile.TemporaryDirectory() as tmp:
        trace = load_trace(write_synthetic_transformer(tmp, model), batch_size=model.batch_size)
    strategy = Strategy(dp=2, pp=2, schedule="1f1b", micro_batch_size=1, exact=True)
    g = build_graph(trace, build_platform(num_gpus=4), strategy)
    s = schedule(g)
    assert any("tied embedding" in label for label in g.label)
    assert _early(g, s) == []


@pytest.mark.parametrize("sends", list(SENDS))
def test_the_reduction_beside_the_last_send_is_caught(monkeypatch, sends) -> None:
    """Planted: nothing recorded after the programs, so the reduction starts at the last
    backward task's end, beside the send (as before the fix)."""
    monkeypatch.setattr(composition.Composition, "_record_after_program", lambda self, *args: None)
    trace, platform, strategy = configure(**{**LLAMA, **SENDS[sends]}, exact=True)
    g = build_graph(trace, platform, strategy)
    assert _early(g, schedule(g))


GPT = dict(trace_dir=str(Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-cpu-bs8"), topology="nvlink-cluster",
           gpus_per_node=4, dp=2, pp=2, micro_batch_size=2, exact=True)


@pytest.mark.parametrize("sends", list(SENDS))
def test_a_last_block_whose_send_leaves_before_its_end_is_waited_for(sends) -> None:
    """The traced GPT's last backward block sends a gradient its LayerNorm backward writes,
    before the block's last task (a weight gradient's GEMM) has run: finalize waits for that send
    too, not only for one the block's last task posts."""
    trace, platform, strategy = configure(**{**GPT, **SENDS[sends]})
    g = build_graph(trace, platform, strategy)
    assert _early(g, schedule(g)) == []

