"""Vocabulary-parallel embedding, LM head and cross-entropy: their placement on the pipeline's
first and last stage, their shards, and the tied embeddings' gradient all-reduce between the
first and last stage (closed forms, each able to fail)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

import triosim.graph.composition as composition
from triosim.graph import build_graph
from triosim.graph.pipeline.tied_embedding import find_tied
from triosim.graph.strategy import Strategy
from triosim.graph.tensor.megatron import plan_tensor_parallel
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.trace import load_trace
from triosim.trace.synthetic_transformer import SyntheticTransformer, write_synthetic_transformer

GPT = Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-cpu-bs8"


def _transformer(**kw):
    model = SyntheticTransformer(layers=4, hidden=16, heads=4, seq_len=8, vocab=64, **kw)
    with tempfile.TemporaryDirectory() as tmp:
        return model, load_trace(write_synthetic_transformer(tmp, model), batch_size=model.batch_size)


def test_gpt_sample_vocab_parts():
    trace = load_trace(GPT, batch_size=8)
    vp = plan_tensor_parallel(trace, 4).vocab
    assert (vp.vocab, vp.tokens, vp.head, vp.loss, vp.embedding, vp.tied) == (4096, 1024, 53, (54,), 1, False)
    assert [trace.ops[i].name.rsplit(": ", 1)[-1] for i in vp.backward] == \
        ["NllLossBackward0", "LogSoftmaxBackward0", "MmBackward0"]


def test_embedding_first_head_last():
    """Megatron's placement: the embedding on the first stage, the head and the loss on the last."""
    model, trace = _transformer()
    vp = plan_tensor_parallel(trace, 2).vocab
    g = build_graph(trace, build_platform(num_gpus=4), Strategy(pp=4))
    stage_of = {}
    for a, kind in zip(g.attrs, g.kind):
        if kind == "compute" and a and "op" in a and "stage_index" in a:
            stage_of.setdefault(a["op"], a["stage_index"])
    assert stage_of[vp.embedding] == 0
    assert {stage_of[i] for i in (vp.head, *vp.loss, *vp.backward)} == {3}


def check_tied_allreduce(tp: int, dp: int, pp: int) -> None:
    """One all-reduce per (dp, tp) replica of the table's gradient shard, V·h·4/T bytes, between
    the first and the last stage; the head's gradient part is not sent through the pipeline."""
    model, trace = _transformer(tied=True)
    tied = find_tied(trace)
    assert tied is not None and tied.nbytes == model.vocab * model.hidden * 4
    g = build_graph(trace, build_platform(num_gpus=tp * dp * pp), Strategy(tp=tp, dp=dp, pp=pp, exact=True))
    schedule(g)
    emb = g.meta["hybrid"]["collectives_dp0_tp0"].get("embedding")
    if pp == 1:
        assert emb is None
        return
    assert emb == {"collectives": 1, "payload_bytes": tied.nbytes // tp,
                   "wire_bytes_per_gpu": pytest.approx(tied.nbytes // tp)}, "tied all-reduce off its closed form"
    sent = {a["buffer"] for a in g.attrs if a and "buffer" in a}
    assert not sent & set(tied.head_part), "the head's gradient part still crosses the pipeline"


@pytest.mark.parametrize("tp,dp,pp", [(1, 1, 2), (2, 1, 2), (2, 2, 4), (1, 1, 1)])
def test_tied_allreduce(tp, dp, pp):
    check_tied_allreduce(tp, dp, pp)


def test_untied_has_no_allreduce():
    _, trace = _transformer()
    assert find_tied(trace) is None
    g = build_graph(trace, build_platform(num_gpus=2), Strategy(pp=2))
    assert "embedding" not in g.meta["hybrid"]["collectives_dp0_tp0"]


def test_catches_tied_allreduce_left_out(monkeypatch):
    monkeypatch.setattr(composition, "find_tied", lambda trace: None)
    with pytest.raises(AssertionError, match="closed form"):
        check_tied_allreduce(2, 1, 2)
