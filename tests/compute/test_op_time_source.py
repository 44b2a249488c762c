"""The op-time sources (trace, roofline, retarget) and auto's choice between them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from triosim.compute.op_cost import trace_op_costs
from triosim.compute.op_time import attach_op_time_model
from triosim.compute.op_time_source import (
    RetargetSource,
    RooflineSource,
    ShapeCosts,
    choose_source,
    device_from_name,
    gpu_timing,
    time_on_device,
    trace_origin,
)
from triosim.compute.roofline import roofline_seconds
from triosim.compute.scale import scale_trace
from triosim.errors import ConfigError
from triosim.hardware.device_db import get_device
from triosim.trace.load import load_trace

SAMPLES = Path(__file__).resolve().parents[2] / "sample_trace"
H200_TRACE = SAMPLES / "resnet18-h200-bs16"
CPU_TRACE = SAMPLES / "resnet18-cpu-bs16"


def loaded(path: Path):
    return attach_op_time_model(load_trace(path))


@pytest.fixture(scope="module")
def h200_trace():
    return loaded(H200_TRACE)


@pytest.fixture(scope="module")
def cpu_trace():
    return loaded(CPU_TRACE)


@pytest.mark.parametrize("name, device", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("Tesla V100-SXM2-32GB", "v100-32gb"),
    ("AMD Instinct MI300X", "mi300x"), ("NVIDIA L40S", "l40s"), ("NVIDIA B200", "b200"),
])
def test_recorded_device_names_map_to_the_database(name: str, device: str) -> None:
    assert device_from_name(name).name == device


def test_unknown_device_name_is_none() -> None:
    assert device_from_name("NVIDIA T4") is None
    assert device_from_name("") is None


def test_origins(h200_trace, cpu_trace) -> None:
    assert trace_origin(h200_trace) == "gpu"
    assert trace_origin(cpu_trace) == "cpu"


def test_auto_chooses_by_the_trace_origin(h200_trace, cpu_trace) -> None:
    h200, h100 = get_device("h200"), get_device("h100-sxm")
    assert choose_source("auto", h100, cpu_trace) == "roofline"  # CPU-timed
    assert choose_source("auto", h200, h200_trace) == "trace"  # the trace's own GPU
    assert choose_source("auto", h100, h200_trace) == "retarget"  # another GPU
    with pytest.raises(ConfigError, match="--trace-gpu h200: meta.json says this trace was timed on the CPU"):
        choose_source("auto", h200, cpu_trace, trace_gpu="h200")  # a CPU's times are no GPU's


def test_auto_on_a_gpu_trace_of_unknown_gpu_asks_for_trace_gpu(tmp_path: Path) -> None:
    d = tmp_path / "t"
    shutil.copytree(H200_TRACE, d)
    meta = json.loads((d / "meta.json").read_text())
    meta["device_name"] = "NVIDIA T4"
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="--trace-gpu NAME"):
        choose_source("auto", get_device("h100"), loaded(d))
    (d / "meta.json").unlink()  # no meta.json: which GPU is unknown too
    with pytest.raises(ConfigError, match="--trace-gpu NAME"):
        choose_source("auto", get_device("h100"), load_trace(d, batch_size=16))


def test_auto_on_a_synthetic_trace_is_roofline(tmp_path: Path) -> None:
    from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

    trace = loaded(write_synthetic_trace(tmp_path / "s", SyntheticModel(layers=2, batch_size=4)))
    assert choose_source("auto", get_device("h100"), trace) == "roofline"


def test_roofline_source_times_every_op_by_its_roofline(cpu_trace) -> None:
    device = get_device("h100-sxm")
    timed = RooflineSource(device).apply(cpu_trace)
    costs = trace_op_costs(cpu_trace)
    assert [op.duration_s for op in timed.ops] == [roofline_seconds(c, device) for c in costs]
    assert timed.time_source == "roofline"


def test_roofline_follows_the_simulated_batch(cpu_trace) -> None:
    device = get_device("h100-sxm")
    timed = RooflineSource(device).apply(cpu_trace)
    big = scale_trace(timed, 256)
    shapes = ShapeCosts.of(cpu_trace)
    for i, op in enumerate(big.ops):
        assert op.duration_s == roofline_seconds(shapes.at(256)[i], device)
    # a batch-sized op does 16x the FLOPs; the optimizer's do not change
    conv = next(i for i, c in enumerate(shapes.costs) if c.op_class == "conv")
    opt = next(i for i, op in enumerate(cpu_trace.ops) if op.stage == "optimizer")
    assert shapes.at(256)[conv].flops == pytest.approx(16 * shapes.costs[conv].flops)
    assert shapes.at(256)[opt] == shapes.costs[opt]
    assert sum(op.duration_s for op in big.ops) > 5 * sum(op.duration_s for op in timed.ops)


def test_retarget_to_the_source_gpu_is_the_measurement_exactly(h200_trace) -> None:
    h200 = get_device("h200")
    same = RetargetSource(h200, h200).apply(h200_trace)
    assert [op.duration_s for op in same.ops] == [op.duration_s for op in h200_trace.ops]
    for b in (4, 16, 64):
        assert [o.duration_s for o in scale_trace(same, b).ops] == [o.duration_s for o in scale_trace(h200_trace, b).ops]


def test_retarget_is_measured_times_the_roofline_ratio(h200_trace) -> None:
    h200, a100 = get_device("h200"), get_device("a100-80gb")
    moved = RetargetSource(h200, a100).apply(h200_trace)
    costs = trace_op_costs(h200_trace)
    for op, new, c in zip(h200_trace.ops, moved.ops, costs):
        assert new.duration_s == pytest.approx(op.duration_s * roofline_seconds(c, a100) / roofline_seconds(c, h200))
    assert sum(o.duration_s for o in moved.ops) > sum(o.duration_s for o in h200_trace.ops)  # an A100 is slower
    # at another batch: today's op-time model's time, times the ratio at that batch
    shapes = ShapeCosts.of(h200_trace)
    scaled = scale_trace(moved, 64)
    i = next(i for i, c in enumerate(costs) if c.op_class == "conv")
    ratio = roofline_seconds(shapes.at(64)[i], a100) / roofline_seconds(shapes.at(64)[i], h200)
    assert scaled.ops[i].duration_s == pytest.approx(h200_trace.op_time.seconds(i, 64) * ratio)


def test_time_on_device_says_what_it_did(cpu_trace, h200_trace) -> None:
    timed, timing = time_on_device(cpu_trace, get_device("h100"))
    assert timing.source == "roofline" and gpu_timing(timed) is timing
    assert timing.header().startswith("H100-SXM, op times: roofline from shapes, ")
    timed, timing = time_on_device(h200_trace, get_device("h200"))
    assert timing.source == "trace" and timing.header() == "H200-SXM, op times: measured"
    assert [o.duration_s for o in timed.ops] == [o.duration_s for o in h200_trace.ops]
    _, timing = time_on_device(h200_trace, get_device("b200"), dtype="bf16")
    assert timing.source == "retarget" and timing.dtype == "bf16"
    assert timing.header() == "B200 (HGX), op times: retargeted from H200-SXM, bf16"


def test_a_dtype_the_device_lacks_is_refused(cpu_trace) -> None:
    with pytest.raises(ConfigError, match="has no fp8 matrix peak"):
        time_on_device(cpu_trace, get_device("v100"), dtype="fp8")
