"""Collecting real (tiny) PyTorch training steps on the CPU and checking the converted traces."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from triosim.tracer.cli import main
from triosim.tracer.validate import check_trace_dir, parse_list

pytestmark = pytest.mark.tracer
torch = pytest.importorskip("torch")


def _collect(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "trace"
    rc = main(["collect", "--device", "cpu", "--out", str(out), "-q", *args])
    assert rc == 0
    return out


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _model_state(name: str, image_size: int = 16):
    from triosim.tracer.models import build_model

    spec = build_model(name, image_size=image_size)
    params = [p.numel() for p in spec.module.parameters()]
    buffers = [b.numel() for b in spec.module.buffers() if b.dim() > 0]
    return params, buffers


def _check_outside_tensors(out: Path, params: list[int], buffers: list[int], state_per_param: int,
                           batch_numels: list[int]) -> None:
    """Every input is produced earlier (or shares storage with an earlier output) or comes from
    outside the step; and what comes from outside is exactly the parameters, the optimizer state,
    the buffers and the batch (plus 0-dim scalars such as Adam's step counts)."""
    report = check_trace_dir(out)
    assert report.ok, report.problems
    size = {int(r["TensorID"]): int(r["TensorNumElement"]) for r in _rows(out / "tensor.csv")}
    shapes = {int(r["TensorID"]): r["TensorShape"] for r in _rows(out / "tensor.csv")}
    outside = [size[t] for t in report.external if shapes[t] != "[]"]
    expected = params * (1 + state_per_param) + buffers + batch_numels
    assert sorted(outside) == sorted(expected)
    assert len(report.parameters) == len(params)
    assert sorted(size[p] for p in report.parameters) == sorted(params)


def test_collect_cnn_with_adam(tmp_path):
    out = _collect(tmp_path, "--model", "tinycnn", "--batch-size", "2", "--image-size", "16")
    ops = _rows(out / "trace.csv")
    stages = [o["stage"] for o in ops]
    assert stages[0] == "forward" and stages[-1] == "optimizer" and "backward" in stages
    names = [o["OperatorName"] for o in ops]
    # Views and AccumulateGrad do no work and are left out, as in the original tracer.
    assert "aten::flatten" not in names
    assert not any("AccumulateGrad" in n for n in names)
    assert any(n.startswith("aten::_foreach_") for n in names)
    flagged = {o["OperatorName"] for o in ops if o["tpflag"] == "1"}
    assert flagged == {"aten::conv2d", "aten::linear",
                       "autograd::engine::evaluate_function: ConvolutionBackward0",
                       "autograd::engine::evaluate_function: AddmmBackward0"}
    for o in ops:
        assert float(o["Operator_cudatimenooverlap"]) > 0
        if o["stage"] == "backward":
            assert int(o["fwd_op"]) > 0
    params, buffers = _model_state("tinycnn")
    _check_outside_tensors(out, params, buffers, 2, [2 * 3 * 16 * 16, 2])
    meta = json.loads((out / "meta.json").read_text())
    assert meta["model"] == "tinycnn" and meta["device"] == "cpu"
    assert meta["torch"] == torch.__version__
    assert len(list((out / "raw").glob("*.json"))) == 2


def test_collect_gpt_with_sgd_per_tensor(tmp_path):
    out = _collect(tmp_path, "--model", "gpt-tiny", "--batch-size", "2", "--optimizer", "sgd",
                   "--no-foreach", "--no-raw")
    ops = _rows(out / "trace.csv")
    names = {o["OperatorName"] for o in ops}
    assert {"aten::embedding", "aten::linear", "aten::scaled_dot_product_attention"} <= names
    flagged = {o["OperatorName"] for o in ops if o["tpflag"] == "1"}
    assert {"aten::embedding", "aten::linear",
            "autograd::engine::evaluate_function: EmbeddingBackward0"} <= flagged
    assert not (out / "raw").exists()
    params, buffers = _model_state("gpt-tiny")
    _check_outside_tensors(out, params, buffers, 1, [2 * 16, 2 * 16])
    # SGD: each parameter is read by an optimizer op together with a gradient of its size.
    opt_inputs = [t for o in ops if o["stage"] == "optimizer"
                  for t in parse_list(o["Operator_input"])]
    assert opt_inputs


def test_a_traced_causal_gpt_says_so_and_its_attention_counts_half_the_flops(tmp_path):
    """gpt-tiny calls scaled_dot_product_attention with is_causal=True: meta.json says causal, so
    its attention ops (forward and backward) count half the FLOPs of the same trace read as full."""
    from dataclasses import replace

    from triosim import load_trace
    from triosim.compute.op_cost import trace_op_costs

    out = _collect(tmp_path, "--model", "gpt-tiny", "--batch-size", "2", "--iterations", "2", "--no-raw")
    assert json.loads((out / "meta.json").read_text())["attention_mask"] == "causal"
    trace = load_trace(out)
    full = replace(trace, info={**trace.info, "attention_mask": "full"})
    pairs = [(c.kind, c.flops, f.flops) for c, f in zip(trace_op_costs(trace), trace_op_costs(full))
             if c.attention is not None]
    # 2 layers: one forward and one backward attention op each
    assert sorted(k for k, _, _ in pairs) == ["attention"] * 2 + ["attention_backward"] * 2
    assert all(causal == full / 2 > 0 for _, causal, full in pairs)


def test_conversion_of_a_recorded_step_is_deterministic(tmp_path):
    out = _collect(tmp_path, "--model", "tinycnn", "--batch-size", "2", "--image-size", "8",
                   "--iterations", "2")
    graph = next((out / "raw").glob("graph_*.json"))
    prof = next((out / "raw").glob("profiler_*.json"))
    again = tmp_path / "again"
    assert main(["convert", "--graph", str(graph), "--profiler", str(prof), "--out",
                 str(again), "-q"]) == 0
    for name in ("trace.csv", "tensor.csv"):
        assert (again / name).read_bytes() == (out / name).read_bytes()


def test_collect_bad_input_exits_2(tmp_path, capsys):
    rc = main(["collect", "--model", "nosuchnet", "--batch-size", "2", "--device", "cpu",
               "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown model 'nosuchnet'" in err and err.count("\n") == 1
    rc = main(["collect", "--model", "tinycnn", "--batch-size", "2", "--device", "cpu",
               "--iterations", "1", "--out", str(tmp_path / "x")])
    assert rc == 2 and "--iterations" in capsys.readouterr().err
    rc = main(["collect", "--model", "tinycnn", "--batch-size", "2", "--device", "cpu",
               "--data", str(tmp_path / "no-images"), "--out", str(tmp_path / "x")])
    assert rc == 2 and "image directory not found" in capsys.readouterr().err
    if not torch.cuda.is_available():
        rc = main(["collect", "--model", "tinycnn", "--batch-size", "2", "--device", "cuda",
                   "--out", str(tmp_path / "x")])
        assert rc == 2 and "CUDA is not available" in capsys.readouterr().err


def test_collect_from_an_image_folder(tmp_path):
    pytest.importorskip("torchvision")
    from PIL import Image

    for cls in ("a", "b"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (20, 24), (40 * i, 90, 200)).save(tmp_path / "imgs" / cls / f"{i}.png")
    out = _collect(tmp_path, "--model", "tinycnn", "--batch-size", "3", "--image-size", "16",
                   "--data", str(tmp_path / "imgs"), "--iterations", "2")
    assert check_trace_dir(out).ok
    assert json.loads((out / "meta.json").read_text())["data"].endswith("imgs")


def test_seed_compatible_datacollect_script(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(repo / "tracer" / "datacollect.py"), "2", "--models", "tinycnn",
         "--image-size", "16", "--iterations", "2", "--device", "cpu"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "data" / "graph" / "graph_tinycnn-iter1.json").is_file()
    assert (tmp_path / "data" / "profiler" / "profiler_tinycnn-iter1.json").is_file()
    proc = subprocess.run([sys.executable, str(repo / "tracer" / "dataprocess.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert check_trace_dir(tmp_path / "data" / "middledata" / "trace" / "tinycnn").ok


def test_collect_several_batch_sizes_for_the_op_time_fit(tmp_path, capsys):
    from triosim import load_trace
    from triosim.compute.op_time import attach_op_time_model

    out = _collect(tmp_path, "--model", "tinycnn", "--batch-sizes", "4,2", "--image-size", "16")
    assert json.loads((out / "meta.json").read_text())["batch_size"] == 4
    assert json.loads((out / "batch-2" / "meta.json").read_text())["batch_size"] == 2
    trace = attach_op_time_model(load_trace(out, batch_size=4))
    assert trace.op_time.name == "fit" and trace.op_time.batches == (2, 4)
    assert main(["collect", "--device", "cpu", "--out", str(tmp_path / "x"), "--model", "tinycnn"]) == 2
    assert "--batch-size" in capsys.readouterr().err


def test_profiler_cycle_warning_is_not_shown(tmp_path, monkeypatch, recwarn):
    """PyTorch 2.11 warns on each profile() that events are cleared at the end of each cycle
    (seen on an H200); a collection records one cycle, so the warning is noise and is hidden."""
    import warnings

    import torch.profiler

    class Noisy(torch.profiler.profile):
        def __enter__(self):
            warnings.warn("Warning: Profiler clears events at the end of each cycle. Only "
                          "events from the current cycle will be reported.", UserWarning, stacklevel=2)
            return super().__enter__()

    monkeypatch.setattr(torch.profiler, "profile", Noisy)
    _collect(tmp_path, "--model", "tinycnn", "--batch-size", "2", "--image-size", "8",
             "--iterations", "2", "--no-raw")
    assert not [w for w in recwarn if "clears events" in str(w.message)]
