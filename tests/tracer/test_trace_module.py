"""``triosim.tracer.trace_module``: a training step of the user's own nn.Module, traced on the CPU
into a trace directory that loads and simulates; bad arguments are one-line errors before training."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from triosim.tracer import TracerError, trace_module
from triosim.tracer.validate import check_trace_dir

pytestmark = pytest.mark.tracer
torch = pytest.importorskip("torch")
nn = torch.nn


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class KeywordNet(nn.Module):
    """Takes keyword arguments and returns a dict, as Hugging Face-style models do."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 8)
        self.head = nn.Linear(8, 32)

    def forward(self, ids, scale: float = 1.0):
        return {"logits": self.head(self.emb(ids)) * scale}


class FullMaskAttention(nn.Module):
    """Self-attention over every token (an encoder's): SDPA with is_causal=False."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False)
        return y.transpose(1, 2).reshape(b, t, 16)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_trace_module_writes_a_trace_that_loads_and_simulates(tmp_path: Path) -> None:
    import triosim

    torch.manual_seed(0)
    model = TinyMLP()
    x, y = torch.randn(4, 16), torch.randint(0, 4, (4,))
    before = model.fc1.weight.detach().clone()
    out = tmp_path / "tinymlp"
    result = trace_module(model, x, nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters()), out,
                          target=y)
    assert result.trace_dir == out
    assert not torch.equal(model.fc1.weight, before)  # trained for real
    ops = _rows(out / "trace.csv")
    stages = [o["stage"] for o in ops]
    assert stages[0] == "forward" and "backward" in stages and stages[-1] == "optimizer"
    assert {o["OperatorName"] for o in ops if o["tpflag"] == "1"} == {
        "aten::linear", "autograd::engine::evaluate_function: AddmmBackward0"}
    report = check_trace_dir(out)
    assert report.ok, report.problems
    meta = json.loads((out / "meta.json").read_text())
    assert meta["batch_size"] == 4 and meta["model"] == "TinyMLP" and meta["optimizer"] == "adam"
    assert meta["device"] == "cpu" and meta["time_source"] == "cpu" and meta["raw"] == []
    assert not (out / "raw").exists()

    trace = triosim.load_trace(out)
    assert trace.batch_size == 4 and trace.batch_source == "meta.json"
    single = triosim.simulate(*triosim.configure(trace_dir=str(out)))
    data_parallel = triosim.simulate(*triosim.configure(case=2, GPUnumber=2, trace_dir=str(out)))
    assert single.makespan_ms > 0 and data_parallel.makespan_ms >= single.makespan_ms


def test_a_full_mask_attention_model_is_traced_as_full(tmp_path: Path) -> None:
    import triosim
    from triosim.compute.op_cost import trace_op_costs

    torch.manual_seed(0)
    model = FullMaskAttention()
    out = tmp_path / "full"
    trace_module(model, torch.randn(2, 8, 16), lambda y: y.square().mean(),
                 torch.optim.SGD(model.parameters(), lr=0.1), out, iterations=2)
    assert json.loads((out / "meta.json").read_text())["attention_mask"] == "full"
    costs = [c for c in trace_op_costs(triosim.load_trace(out)) if c.attention is not None]
    assert [c.kind for c in costs] == ["attention", "attention_backward"]
    assert costs[0].attention == (8, False, 8)  # head size, mask, keys per query
    # 4 · b·h·s_q·d · s_k: every (query, key) pair of the full mask
    assert costs[0].flops == 4 * 2 * 2 * 8 * 8 * 8


def test_trace_module_keyword_inputs_loss_without_target_and_raw_files(tmp_path: Path) -> None:
    model = KeywordNet()
    ids = torch.randint(0, 32, (3, 5))
    out = tmp_path / "kw"
    trace_module(model, {"ids": ids, "scale": 0.5},
                 lambda o: nn.functional.cross_entropy(o["logits"].flatten(0, 1), ids.flatten()),
                 torch.optim.SGD(model.parameters(), lr=0.1), out, name="my model!", iterations=2,
                 keep_raw=True)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["model"] == "my_model" and meta["batch_size"] == 3 and meta["optimizer"] == "sgd"
    assert sorted(p.name for p in (out / "raw").iterdir()) == ["graph_my_model-iter1.json",
                                                              "profiler_my_model-iter1.json"]
    names = {o["OperatorName"] for o in _rows(out / "trace.csv")}
    assert {"aten::embedding", "aten::linear"} <= names


def _error(call) -> str:
    with pytest.raises(TracerError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_trace_module_bad_arguments_are_one_line_errors_before_training(tmp_path: Path) -> None:
    model = TinyMLP()
    x, y = torch.randn(4, 16), torch.randint(0, 4, (4,))
    opt = torch.optim.Adam(model.parameters())
    loss = nn.CrossEntropyLoss()
    before = [p.detach().clone() for p in model.parameters()]
    a_file = tmp_path / "taken.txt"
    a_file.write_text("keep")

    def trace(**changes):
        args = {"model": model, "example_inputs": x, "loss_fn": loss, "optimizer": opt,
                "out_dir": tmp_path / "out", "target": y, **changes}
        return lambda: trace_module(**args)

    assert "model must be a torch.nn.Module, got function" in _error(trace(model=lambda t: t))
    assert "Identity has no parameters to train" in _error(trace(model=nn.Identity()))
    assert "optimizer must be a torch.optim.Optimizer" in _error(trace(optimizer="adam"))
    other = torch.optim.SGD(TinyMLP().parameters(), lr=0.1)
    assert "optimizer holds none of the model's parameters" in _error(trace(optimizer=other))
    assert "loss_fn must be callable" in _error(trace(loss_fn="cross_entropy"))
    assert f"out_dir {a_file} exists and is not a directory" in _error(trace(out_dir=a_file))
    assert "iterations must be at least 2" in _error(trace(iterations=1))
    assert "example_inputs holds no tensor" in _error(trace(example_inputs=[1, 2]))
    assert "batch_size must be a positive integer, got 0" in _error(trace(batch_size=0))
    assert "the first input tensor is a scalar" in _error(trace(example_inputs=torch.tensor(1.0)))
    assert a_file.read_text() == "keep" and not (tmp_path / "out").exists()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # nothing trained
    # A loss that is not a scalar is found on the first warm-up step.
    assert "loss_fn must return a scalar tensor" in _error(trace(loss_fn=lambda out, t: out))


def test_the_recipe_in_the_tracer_doc_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "tracer.md").read_text(encoding="utf-8")
    section = doc.split("## Tracing your own model (Python)", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/tracer.md", "exec"), {"__name__": "recipe"})
    printed = capsys.readouterr().out
    assert "ops written to tinymlp-trace" in printed and "ms per iteration on 4 GPUs" in printed
    assert json.loads((tmp_path / "tinymlp-trace" / "meta.json").read_text())["batch_size"] == 8
