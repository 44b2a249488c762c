"""The 16-head GPT sample trace (``gpt-h16-cpu-bs8``): it loads with its recorded batch, Megatron
detection finds its 2 layers' attention and MLP blocks and its 16 heads, and ``--tp 8`` (which
the 4-head ``gpt-cpu-bs8`` sample refuses) is accepted on the command line."""

from __future__ import annotations

import json

import pytest
from triosim.sample_trace import trace_dir

import triosim.graph.tensor.megatron as mg
from triosim.cli.console import main
from triosim.trace import Trace, load_trace

H16 = "gpt-h16-cpu-bs8"


@pytest.fixture(scope="module")
def h16() -> Trace:
    return load_trace(trace_dir(H16))


def test_loads_with_recorded_batch_and_model(h16):
    meta = json.loads((trace_dir(H16) / "meta.json").read_text())
    assert meta["model"] == "gpt-h16" and meta["batch_size"] == 8
    assert h16.batch_size == 8
    assert len(h16.ops) == meta["ops"]
    assert {op.stage for op in h16.ops} == {"forward", "backward", "optimizer"}


def test_megatron_finds_two_layers_and_sixteen_heads(h16):
    plan = mg.plan_tensor_parallel(h16, 8)
    assert plan.style == "megatron" and plan.fallback_reason is None
    assert [b.kind for b in plan.blocks] == ["attention", "mlp"] * 2
    assert plan.heads == 16
    # one all-reduce forward and one backward per block; the vocabulary-parallel embedding's
    # output, the cross-entropy's max and (two calls) target logit and sum, the head's input gradient
    assert [(c.kind, c.calls) for c in plan.collectives] == [("all_reduce", 1)] * 6 + [("all_reduce", 2)] \
        + [("all_reduce", 1)] * 5
    assert sum(c.calls for c in plan.collectives) == 8 + 5
    assert plan.summary() == ("megatron tensor parallel: 4 blocks (2 attention, 2 mlp), 16 attention heads, "
                              "vocabulary-parallel head (4096 words)")


def test_tp8_accepted_here_but_not_on_the_four_head_sample(capsys):
    code = main(["run", "-trace-dir", str(trace_dir(H16)), "--tp", "8", "-GPUnumber", "8", "-q"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip()
    code = main(["run", "-trace-dir", str(trace_dir("gpt-cpu-bs8")), "--tp", "8", "-GPUnumber", "8", "-q"])
    out, err = capsys.readouterr()
    assert code == 2 and "does not divide the 4 attention heads" in err
