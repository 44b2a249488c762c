"""Cross-stage sends added for every micro-batch at once (triosim.graph.pipeline.crossings) make
the same graph, schedule and report as the per-call path (send_hop_by_hop and block_hops per
micro-batch and replica)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from triosim.config import configure
from triosim.graph import build_graph, composition
from triosim.graph.pipeline import crossings
from triosim.graph.strategy import Strategy
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.trace import load_trace

from .test_pipeline_parallel import ToyModel, write_toy_trace

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "sample_trace" / "gpt-cpu-bs8"
SUPERPOD = str(ROOT / "topologies" / "dgx-a100-superpod.yaml")
BASE = dict(model="gpt-neo-1.3b", num_layers=4, gpu="a100-80gb", topology_file=SUPERPOD, tp=4, pp=2,
            schedule="1f1b", global_batch=16, micro_batch_size=1, pipeline_send="blocking", representatives=True)
CASES = {
    "1T-like: blocking, scatter/gather, selective + sp": dict(recompute="selective", sequence_parallel=True,
                                                            pipeline_scatter_gather=True),
    "overlapped sends, pp 4": dict(pp=4, pipeline_send="overlapped"),
    "gpipe, pp 4": dict(pp=4, schedule="gpipe"),
    "interleaved, blocking, pp 4": dict(schedule="interleaved", virtual_stages=2, num_layers=8, pp=4),
    "dp 2, tp 2, every GPU built": dict(dp=2, tp=2, representatives=False, exact=True),
    "scatter/gather without sp (per-call path only)": dict(pipeline_scatter_gather=True),
    "blocking, full recomputation, pp 4 (groups wait for their receives)": dict(pp=4, recompute="full"),
    "overlapped, full recomputation, pp 4 (blocks wait for their receives)": dict(pp=4, recompute="full",
                                                                                 pipeline_send="overlapped"),
    "scatter/gather, full recomputation (per-call path only)": dict(pipeline_scatter_gather=True, recompute="full"),
}


def _graph(monkeypatch, bulk: bool, flags):
    monkeypatch.setattr(composition, "BULK_SENDS", bulk)
    calls = []
    real = crossings.send_version_in_bulk

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(composition, "send_version_in_bulk", counting)
    trace, platform, strategy = configure(**{**BASE, **flags})
    return build_graph(trace, platform, strategy), len(calls)


def _columns(graph) -> tuple:
    return (graph.kind, graph.label, graph.duration, graph.resources, graph.devices, graph.nbytes, graph.latency,
            graph.attrs, graph.succ, graph.npred, graph.resource_names)


@pytest.mark.parametrize("flags", CASES.values(), ids=CASES.keys())
def test_bulk_sends_equal_per_call_ones(monkeypatch, flags) -> None:
    per_call, none = _graph(monkeypatch, False, flags)
    bulk, count = _graph(monkeypatch, True, flags)
    assert none == 0
    assert (count > 0) == (not flags.get("pipeline_scatter_gather") or flags.get("sequence_parallel", False))
    assert sum(k == "transfer" for k in bulk.kind) > 0
    assert _columns(bulk) == _columns(per_call)
    assert repr(bulk.meta) == repr(per_call.meta)
    a, b = schedule(per_call), schedule(bulk)
    assert (a.start, a.end, a.makespan) == (b.start, b.end, b.makespan)


@pytest.mark.parametrize("kw", [dict(dp=1, tp=2, pp=4, micro_batch_size=3, schedule="1f1b", pipeline_send="blocking"),
                                dict(dp=2, tp=2, pp=2, micro_batch_size=3, schedule="gpipe")])
def test_bulk_sends_of_uneven_micro_batches(monkeypatch, kw) -> None:
    """A batch of 8 in micro-batches of 3: the last one's sends carry fewer bytes (another row)."""
    trace = load_trace(GPT)
    graphs = []
    for bulk in (False, True):
        monkeypatch.setattr(composition, "BULK_SENDS", bulk)
        platform = build_platform(num_gpus=8, topology="nvlink-cluster", gpus_per_node=4)
        graphs.append(composition.build(trace, platform, Strategy(exact=False, **kw)))
    per_call, bulk = graphs
    assert len({n for n, k in zip(bulk.nbytes, bulk.kind) if k == "transfer"}) > 1
    assert _columns(bulk) == _columns(per_call)
    assert repr(bulk.meta) == repr(per_call.meta)


@pytest.mark.parametrize("kw", [dict(dp=1, tp=2, pp=4, micro_batch_size=1, schedule="1f1b", pipeline_send="blocking"),
                                dict(dp=2, tp=1, pp=4, micro_batch_size=2, schedule="gpipe")])
def test_bulk_sends_over_several_hops(monkeypatch, tmp_path, kw) -> None:
    """A residual input from two layers back, one layer per stage: activations go two hops
    forward and their gradients two hops back; layer 2's output also goes back to stage 0."""
    model = ToyModel(batch=4, widths=(8, 16, 16, 16, 8), forward_us=(5.0, 7.0, 6.0, 9.0, 3.0),
                     skips=(False, True, True, True))
    trace = _toy_read_both_ways(model, tmp_path)
    graphs = []
    for bulk in (False, True):
        monkeypatch.setattr(composition, "BULK_SENDS", bulk)
        platform = build_platform(num_gpus=8, topology="nvlink-cluster", gpus_per_node=4)
        graphs.append(composition.build(trace, platform, Strategy(exact=False, **kw)))
    per_call, bulk = graphs
    chained = [i for i, k in enumerate(bulk.kind) if k == "transfer"
               and any(bulk.kind[j] == "transfer" and bulk.attrs[j]["buffer"] == bulk.attrs[i]["buffer"]
                       for j in bulk.succ[i])]
    assert {bulk.attrs[i]["direction"] for i in chained} == {"forward", "backward"}
    both = {a["buffer"] for a, k in zip(bulk.attrs, bulk.kind) if k == "transfer" and a["direction"] == "forward"} & \
        {a["buffer"] for a, k in zip(bulk.attrs, bulk.kind) if k == "transfer" and a["direction"] == "backward"}
    assert both  # a version sent both ways
    assert _columns(bulk) == _columns(per_call)
    assert repr(bulk.meta) == repr(per_call.meta)
    a, b = schedule(per_call), schedule(bulk)
    assert (a.start, a.end, a.makespan) == (b.start, b.end, b.makespan)


def _toy_read_both_ways(model: ToyModel, tmp: Path):
    """The toy trace with layer 0's backward op also reading layer 2's output (tensor 7): stage 1
    writes it and sends it forward to stage 2 and back to stage 0."""
    out = write_toy_trace(tmp / "toy", model)
    with open(out / "trace.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    last_backward = max(k for k, row in enumerate(rows) if row[1].endswith("AddmmBackward0"))
    row = rows[last_backward]
    row[2] = row[2][:-1] + "; 7]"
    row[6] = row[6][:-1] + f"; {model.batch * model.widths[3]}]"
    with open(out / "trace.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return load_trace(out, batch_size=model.batch)
