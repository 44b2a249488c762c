"""`trace convert` on the original TrioSim vgg13 JSON pair (PyTorch 2.1, H100, batch 512).

Skipped when ../shared/reference is absent.  The pair has no record-function ids in its profiler
events and runs backward on a separate autograd thread, so it exercises the fallback pairing and
the kernel attribution across threads.
"""

from __future__ import annotations

import bisect
import csv
import json
from collections import defaultdict

import pytest
from tracer_fixtures import REFERENCE
from triosim.tracer.cli import main
from triosim.tracer.validate import check_trace_dir

pytestmark = pytest.mark.reference


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    d = REFERENCE / "tracer_data"
    graph, prof = d / "graph_vgg13-iter41.json", d / "profiler_vgg13-iter41.json"
    if not (graph.is_file() and prof.is_file()):
        pytest.skip("reference data (../shared/reference) not available")
    out = tmp_path_factory.mktemp("vgg13")
    assert main(["convert", "--graph", str(graph), "--profiler", str(prof), "--out", str(out),
                 "-q"]) == 0
    with open(out / "trace.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return out, rows, graph, prof


def _reference_rows():
    path = REFERENCE / "sample_trace" / "trace2-h100-bs128" / "vgg13" / "trace.csv"
    if not path.is_file():
        pytest.skip("reference sample trace not available")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_same_ops_and_stages_as_the_reference_sample(converted):
    _, rows, _, _ = converted
    ref = _reference_rows()
    assert len(rows) == 77
    assert [(r["OperatorName"], r["stage"]) for r in rows] == \
        [(r["OperatorName"], r["stage"]) for r in ref]
    assert [r["OperatorID"] for r in rows] == [r["OperatorID"] for r in ref]
    stages = [r["stage"] for r in rows]
    assert (stages.count("forward"), stages.count("backward"), stages.count("optimizer")) == \
        (35, 35, 7)


def test_tpflag_on_conv_linear_and_their_backward_ops(converted):
    _, rows, _, _ = converted
    flagged = [r["OperatorName"] for r in rows if r["tpflag"] == "1"]
    expected = {"aten::conv2d", "aten::linear",
                "autograd::engine::evaluate_function: ConvolutionBackward0",
                "autograd::engine::evaluate_function: AddmmBackward0"}
    assert set(flagged) == expected
    assert len(flagged) == 26  # 10 conv + 3 linear, forward and backward
    assert [r["tpflag"] for r in rows] == [r["tpflag"] for r in _reference_rows()]


def test_kernel_sums_match_the_json(converted):
    """Recompute each op's kernel sum straight from the JSON, independently of the converter:
    kernels -> launching runtime call (correlation) -> enclosing profiler op on that thread."""
    _, rows, _, prof = converted
    events = json.loads(prof.read_text())["traceEvents"]
    kernels = defaultdict(float)
    for e in events:
        if e.get("cat") == "kernel":
            kernels[e["args"]["correlation"]] += e["dur"]
    launches = defaultdict(list)
    for e in events:
        if e.get("cat") == "cuda_runtime":
            launches[e["tid"]].append((e["ts"], e["args"]["correlation"]))
    for v in launches.values():
        v.sort()
    names = {r["OperatorName"] for r in rows}
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e["name"] in names),
                 key=lambda e: e["ts"])
    # Top-level ops only: drop events nested in another kept-name event of the same thread.
    top = []
    for e in ops:
        if top and any(t["tid"] == e["tid"] and t["ts"] <= e["ts"] <= t["ts"] + t["dur"]
                       for t in top[-5:]):
            continue
        top.append(e)
    sums = []
    for e in top:
        lst = launches[e["tid"]]
        lo = bisect.bisect_left(lst, (e["ts"], -1))
        hi = bisect.bisect_right(lst, (e["ts"] + e["dur"], float("inf")))
        s = sum(kernels[c] for _, c in lst[lo:hi])
        if s > 0:
            sums.append((e["name"], s))
    assert len(sums) == len(rows)
    for (name, s), r in zip(sums, rows, strict=True):
        assert name == r["OperatorName"]
        assert abs(float(r["Operator_cudatimenooverlap"]) - s) <= 0.01 * s
    total = sum(float(r["Operator_cudatimenooverlap"]) for r in rows)
    assert abs(total - sum(kernels.values())) <= 0.01 * sum(kernels.values())


def test_reference_trace_is_consistent(converted):
    out, rows, _, _ = converted
    report = check_trace_dir(out)
    assert report.ok, report.problems
    assert len(report.parameters) == 26  # vgg13: 13 weights + 13 biases
    with open(out / "tensor.csv", newline="") as f:
        tensors = list(csv.DictReader(f))
    params = {int(t["TensorID"]): int(t["TensorNumElement"]) for t in tensors
              if t["TensorType"] in ("weight", "bias")}
    assert sum(params.values()) == 133_047_848  # vgg13's parameter count
    assert not any(t["TensorType"].endswith("=None") for t in tensors)
    # Batch 512 in the JSON: the first conv reads a [512, 3, 224, 224] input.
    assert rows[0]["InputSize"].startswith("[77070336;")


def test_reference_conversion_is_deterministic(converted, tmp_path):
    out, _, graph, prof = converted
    assert main(["convert", "--graph", str(graph), "--profiler", str(prof), "--out",
                 str(tmp_path), "-q"]) == 0
    for name in ("trace.csv", "tensor.csv"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes()
