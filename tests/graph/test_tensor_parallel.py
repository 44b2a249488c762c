"""Case 3 (tensor parallel): reference-compat numbers, N = 1 is case 0, sharded memory, and DAG
properties on random synthetic traces with planted bugs."""

from __future__ import annotations

import tempfile

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triosim.graph.collectives.algorithms as algorithms
import triosim.graph.tensor.per_op as tp
from triosim import build_platform, load_trace, simulate
from triosim.graph import build_graph
from triosim.graph.strategy import Strategy
from triosim.schedule.list_scheduler import schedule
from triosim.schedule.tasks import TaskGraph
from triosim.schedule.validate import schedule_violations
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace


@st.composite
def scenarios(draw):
    model = SyntheticModel(
        layers=draw(st.integers(1, 6)),
        batch_size=draw(st.sampled_from([1, 4, 8])),
        width=draw(st.sampled_from([8, 64, 256])),
        seed=draw(st.integers(0, 10_000)),
        tp_fraction=draw(st.sampled_from([0.0, 0.5, 1.0])),
        foreach_optimizer=draw(st.booleans()),
    )
    return model, draw(st.integers(1, 5)), draw(st.sampled_from(["expanded", "macro"]))


def load_model(model: SyntheticModel):
    with tempfile.TemporaryDirectory() as tmp:
        return load_trace(write_synthetic_trace(tmp, model), batch_size=model.batch_size)


def check_tensor_parallel_properties(model: SyntheticModel, gpus: int, detail: str) -> None:
    trace = load_model(model)
    platform = build_platform(gpus)
    graph = build_graph(trace, platform, Strategy(case=3, collective_detail=detail))
    assert nx.is_directed_acyclic_graph(graph.to_networkx()), "the task graph has a cycle"
    sch = schedule(graph)
    assert schedule_violations(graph, sch) == []

    # Every op once per GPU, a tpflag op at t/N, any other op at t.
    runs: dict[tuple[int, int], list[int]] = {}
    for t, kind in enumerate(graph.kind):
        if kind == "compute":
            runs.setdefault((graph.attrs[t]["op"], graph.devices[t][0]), []).append(t)
    assert set(runs) == {(op.index, g) for op in trace.ops for g in range(gpus)}
    assert all(len(ts) == 1 for ts in runs.values()), "an op runs twice on one GPU"
    for (i, _), (t,) in runs.items():
        op = trace.ops[i]
        want = op.duration_s / gpus if op.tpflag and op.stage != "optimizer" else op.duration_s
        assert graph.duration[t] == pytest.approx(want, rel=1e-12), "wrong op time"

    # One collective per tpflag op: all-gather of the forward output, all-reduce of the
    # backward op's input gradient (its weight/bias gradients stay sharded).
    moved: dict[int, int] = {}  # expanded: bytes of all ring steps; macro: the payload
    names: dict[int, str] = {}
    for t, kind in enumerate(graph.kind):
        if kind in ("transfer", "collective"):
            a = graph.attrs[t]
            moved[a["op"]] = moved.get(a["op"], 0) + graph.nbytes[t]
            names[a["op"]] = a["collective"]
    expected: dict[int, int] = {}
    for op in trace.ops:
        if not op.tpflag or gpus == 1:
            continue
        if op.stage == "forward":
            size = sum(trace.tensors[k].bytes for k in trace.writes[op.index])
            steps = gpus - 1  # each GPU receives the N−1 shards it lacks
            assert names[op.index].startswith("allgather")
        else:
            grads = [k for k in trace.writes[op.index] if k not in trace.batch_invariant]
            size = sum(trace.tensors[k].bytes for k in grads)
            steps = 2 * (gpus - 1)  # reduce-scatter, then all-gather
            assert names[op.index].startswith("allreduce")
        expected[op.index] = steps * size if detail == "expanded" else size
    assert moved == expected, "collective bytes differ from the tpflag ops' outputs"

    # An op reading a gathered or reduced buffer starts after that collective ended on its GPU.
    done: dict[tuple[int, int], float] = {}
    for t, kind in enumerate(graph.kind):
        a = graph.attrs[t] or {}
        if kind == "sync" and "collective" in a and len(graph.devices[t]) == 1:
            done[(a["op"], graph.devices[t][0])] = sch.end[t]
    for i in expected:
        filled = {k for k in trace.writes[i] if trace.ops[i].stage == "forward" or k not in trace.batch_invariant}
        for op in trace.ops[i + 1 :]:
            if filled & set(trace.reads[op.index]):
                for g in range(gpus):
                    (t,) = runs[(op.index, g)]
                    assert sch.start[t] >= done[(i, g)] - 1e-15, "an op ran before its input was gathered"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_tensor_parallel_invariants(scenario):
    check_tensor_parallel_properties(*scenario)


def check_one_gpu_is_case0(model: SyntheticModel) -> None:
    trace = load_model(model)
    one = simulate(trace, build_platform(1), Strategy(case=3))
    zero = simulate(trace, build_platform(1), Strategy(case=0))
    assert one.makespan_s == zero.makespan_s, "N = 1 differs from case 0"
    assert one.per_gpu[0].peak_memory_bytes == zero.per_gpu[0].peak_memory_bytes


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(0, 10_000), st.sampled_from([0.0, 0.5, 1.0]))
def test_one_gpu_is_case0(layers, seed, fraction):
    check_one_gpu_is_case0(SyntheticModel(layers=layers, seed=seed, tp_fraction=fraction))


PLANTED = (SyntheticModel(layers=4, batch_size=8, width=64, seed=7, tp_fraction=1.0), 3, "expanded")


def test_planted_scenario_passes():
    check_tensor_parallel_properties(*PLANTED)


def test_op_count_property_catches_a_duplicate(monkeypatch):
    real = TaskGraph.add_compute_tagged  # what the builder adds an op's task with, one GPU …

    def buggy(self, device, duration_s, label, attrs, after=()):
        if device == 0 and attrs.get("op") == 2:  # the op is issued twice on GPU 0
            real(self, device, duration_s, label, attrs, after)
        return real(self, device, duration_s, label, attrs, after)

    real_each = TaskGraph.add_compute_each  # … and every GPU's task of a segment at once

    def buggy_each(self, devices, duration_s, labels, attrs, afters):
        if attrs.get("op") == 2 and 0 in devices:
            at = list(devices).index(0)
            real(self, 0, duration_s, labels[at], attrs, afters[at])
        return real_each(self, devices, duration_s, labels, attrs, afters)

    monkeypatch.setattr(TaskGraph, "add_compute_tagged", buggy)
    monkeypatch.setattr(TaskGraph, "add_compute_each", buggy_each)
    with pytest.raises(AssertionError, match="twice"):
        check_tensor_parallel_properties(*PLANTED)


def test_time_property_catches_an_unsplit_op(monkeypatch):
    monkeypatch.setattr(tp, "op_time", lambda trace, i, n: trace.ops[i].duration_s)
    with pytest.raises(AssertionError, match="wrong op time"):
        check_tensor_parallel_properties(*PLANTED)


def test_bytes_property_catches_reducing_weight_gradients(monkeypatch):
    monkeypatch.setattr(tp, "input_gradients", lambda trace, i: trace.writes[i])
    with pytest.raises(AssertionError, match="collective bytes"):
        check_tensor_parallel_properties(*PLANTED)


def test_wait_property_catches_an_op_not_waiting(monkeypatch):
    real = tp.tp_collectives

    def buggy(trace, n, reference_compat=False):  # the collective forgets which buffer it fills
        return [tp.TpCollective(c.op, c.kind, (), c.nbytes) for c in real(trace, n, reference_compat)]

    monkeypatch.setattr(tp, "tp_collectives", buggy)
    with pytest.raises(AssertionError, match="before its input was gathered"):
        check_tensor_parallel_properties(*PLANTED)


def test_acyclic_property_catches_an_op_waiting_for_its_own_gather(monkeypatch):
    real = tp.add_all_gather

    def buggy(graph, platform, group, nbytes, label, after=(), **kw):
        synced = real(graph, platform, group, nbytes, label, after=after, **kw)
        for g, preds in after.items():
            for p in preds:
                graph.add_edge(synced[g], p)
        return synced

    monkeypatch.setattr(algorithms, "add_all_gather", buggy)
    with pytest.raises(AssertionError, match="cycle"):
        check_tensor_parallel_properties(*PLANTED)


def test_case0_property_catches_splitting_on_one_gpu(monkeypatch):
    monkeypatch.setattr(tp, "op_time", lambda trace, i, n: trace.ops[i].duration_s / max(n, 2)
                        if trace.ops[i].tpflag else trace.ops[i].duration_s)
    with pytest.raises(AssertionError, match="differs from case 0"):
        check_one_gpu_is_case0(SyntheticModel(layers=3, seed=1, tp_fraction=1.0))


# ----------------------------------------------------------------------------- reference traces


@pytest.mark.reference
@pytest.mark.parametrize("gpus, expected_ms", [(2, 142.3782), (4, 84.0817), (8, 55.0548)])
def test_reference_compat(vgg13_dir, gpus, expected_ms):
    trace = load_trace(vgg13_dir)
    res = simulate(trace, build_platform(gpus, reference_compat=True), Strategy(case=3, reference_compat=True))
    assert res.makespan_ms == pytest.approx(expected_ms, rel=0.01)


@pytest.mark.reference
def test_reference_compat_model(vgg13_dir):
    """Σ op times with tpflag ops at t/N, plus Σ ⌊bytes/N⌋ of their outputs over ptp."""
    trace = load_trace(vgg13_dir)
    for gpus in (2, 4, 8):
        compute = sum(op.duration_s / gpus if op.tpflag else op.duration_s for op in trace.ops)
        comm = sum(trace.tensors[x].bytes // gpus for op in trace.ops if op.tpflag for x in op.outputs)
        res = simulate(trace, build_platform(gpus, reference_compat=True), Strategy(case=3, reference_compat=True))
        assert res.makespan_s == pytest.approx(compute + comm / 65e9, rel=1e-9)


@pytest.mark.reference
@pytest.mark.parametrize("model", ["vgg13", "resnet50"])
def test_one_gpu_is_case0_on_reference(model, request):
    trace = load_trace(request.getfixturevalue(f"{model}_dir"))
    one = simulate(trace, build_platform(1), Strategy(case=3))
    zero = simulate(trace, build_platform(1), Strategy(case=0))
    assert one.makespan_s == zero.makespan_s
    assert one.to_dict()["per_gpu"] == zero.to_dict()["per_gpu"]


@pytest.mark.reference
@pytest.mark.parametrize("model", ["vgg13", "resnet50"])
def test_sharded_weights_shrink_memory(model, request):
    trace = load_trace(request.getfixturevalue(f"{model}_dir"))
    peaks = [simulate(trace, build_platform(n), Strategy(case=3)).per_gpu[0].peak_memory_bytes for n in (1, 2, 4)]
    assert peaks[0] > peaks[1] > peaks[2]
    sharded = tp.sharded_buffers(trace)
    assert set(trace.parameters) & sharded  # conv/linear weights are sharded
    # Sharding saves at most what the sharded buffers weigh.
    saved = sum(trace.tensors[k].bytes for k in sharded)
    assert peaks[0] - peaks[1] <= saved // 2 + len(sharded)
