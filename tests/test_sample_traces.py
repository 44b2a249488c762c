"""The bundled sample traces (sample_trace/): each is consistent, loads with the batch its
meta.json gives, and says where its times come from (CPU op times, or GPU kernel times)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from triosim.tracer.validate import check_trace_dir

from triosim import load_trace

SAMPLES = Path(__file__).resolve().parents[1] / "sample_trace"
NAMES = sorted(p.name for p in SAMPLES.iterdir() if (p / "trace.csv").is_file())


def test_the_cpu_and_h200_samples_are_bundled():
    assert {"resnet18-cpu-bs16", "gpt-cpu-bs8", "gpt-h16-cpu-bs8", "resnet18-h200-bs16",
            "resnet18-h200-bs64", "gpt-h200-bs8", "gpt-h16-h200-bs8", "vgg13-h200-bs128",
            "resnet50-h200-bs128", "gpt2-small-h200-bs8"} <= set(NAMES)
    readme = (SAMPLES / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_sample_trace_is_consistent_and_labelled(name):
    path = SAMPLES / name
    report = check_trace_dir(path)
    assert report.ok, report.problems
    meta = json.loads((path / "meta.json").read_text())
    on_gpu = "-h200-" in name
    assert meta["time_source"] == ("kernels" if on_gpu else "cpu")
    assert meta["device"].startswith("cuda") == on_gpu
    if on_gpu:
        assert meta["device_name"] == "NVIDIA H200"
    assert name.endswith(f"-bs{meta['batch_size']}")
    trace = load_trace(path)
    assert trace.batch_size == meta["batch_size"] and trace.batch_source == "meta.json"
    assert trace.time_source == meta["time_source"]
    assert len(trace.ops) == meta["ops"]
