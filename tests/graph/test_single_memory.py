"""Case 0's memory plan on the trace's buffer columns equals the general planner's.

When every buffer of the trace fits on the GPU at once, ``whole_trace_fitting`` computes the
plan from integer-coded arrays instead of per-step lists; it must give exactly what
``plan_memory`` gives on the same program (peak and bytes resident at every step), and defer
to it (None) when the buffers do not fit. Checked on the bundled traces and on generated ones,
with a planted bug.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import triosim.graph.single as single_module
from triosim.compute.scale import scale_trace
from triosim.graph.memory.plan import plan_memory
from triosim.graph.single import op_steps, persistent_buffers, whole_trace_fitting
from triosim.hardware.presets import build_platform
from triosim.schedule.tasks import TaskGraph
from triosim.trace import Op, Tensor, Trace, derive
from triosim.trace.load import load_trace

REPO = Path(__file__).resolve().parents[2]


def _general_plan(trace: Trace, capacity: int):
    graph = TaskGraph()
    tasks = graph.add_compute_chain(0, [1e-6] * len(trace.ops), [f"op{i}" for i in range(len(trace.ops))],
                                    [None] * len(trace.ops))
    platform = build_platform(1, capacity_log2=40)
    sizes = {k: t.bytes for k, t in trace.tensors.items()}
    report = plan_memory(graph, platform, 0, op_steps(trace, range(len(trace.ops)), tasks), sizes,
                         external=trace.external, persistent=persistent_buffers(trace), capacity=capacity)
    return tasks, report


def _same_plan(trace: Trace) -> None:
    tasks, want = _general_plan(trace, 2**62)
    got = whole_trace_fitting(trace, 2**62, 0, tasks)
    assert got is not None
    assert got.peak_bytes == want.peak_bytes
    assert got.step_tasks == want.step_tasks
    assert np.array_equal(got.step_bytes, want.step_bytes)
    # Below the peak's need, the general planner decides (evictions, fetches).
    used = set(_touched_buffers(trace))
    total = sum(t.bytes for k, t in trace.tensors.items() if k in used)
    if total > 0:
        assert whole_trace_fitting(trace, total - 1, 0, tasks) is None


def _touched_buffers(trace: Trace):
    for r, w in zip(trace.reads, trace.writes):
        yield from r
        yield from w


@pytest.mark.parametrize("name", ["gpt-cpu-bs8", "gpt-h16-cpu-bs8", "resnet18-cpu-bs16",
                                  # GPU traces: cuDNN batch norm's 0-element reserve tensors
                                  "resnet18-h200-bs16", "resnet50-h200-bs128", "gpt2-small-h200-bs8"])
def test_bundled_traces_plan_as_the_general_planner(name):
    trace = load_trace(REPO / "sample_trace" / name)
    _same_plan(trace)
    _same_plan(scale_trace(trace, 3))  # new sizes: the size column follows


def test_columns_follow_the_trace_they_were_made_from():
    trace = load_trace(REPO / "sample_trace" / "gpt-cpu-bs8")
    cols = trace.buffer_columns
    scaled = scale_trace(trace, 2)
    assert np.array_equal(scaled.buffer_columns.nbytes, [t.bytes for t in scaled.tensors.values()])
    assert not np.array_equal(scaled.buffer_columns.nbytes, cols.nbytes)
    # A trace made with other buffer lists does not reuse them.
    other = derive(Trace(path="x", batch_size=8, ops=trace.ops[:3], tensors=trace.tensors))
    assert len(other.buffer_columns.read_op) == sum(map(len, other.reads))


CATEGORIES = ["weight", "bias", "input", "output", "grad", "self", ""]


@st.composite
def traces(draw) -> Trace:
    n_tensors = draw(st.integers(1, 10))
    tensors = {}
    for k in range(n_tensors):
        tid = str(k + 1)
        nbytes = draw(st.sampled_from([0, 8, 16, 40]))
        tensors[tid] = Tensor(tid, nbytes, nbytes // 4, 4, draw(st.sampled_from(CATEGORIES)),
                              draw(st.sampled_from(["s1", "s2", "", f"own{k}"])), (4,))
    ids = st.sampled_from(sorted(tensors))
    n_ops = draw(st.integers(1, 12))
    stages = sorted(draw(st.lists(st.sampled_from([0, 1, 2]), min_size=n_ops, max_size=n_ops)))
    ops = [Op(i, i + 1, draw(st.sampled_from(["aten::mm", "aten::add_", "AddmmBackward0"])),
              tuple(draw(st.lists(ids, max_size=4))), tuple(draw(st.lists(ids, max_size=2))), 1e-6, 1e-6,
              ("forward", "backward", "optimizer")[stages[i]], False, i + 2)
           for i in range(n_ops)]
    return derive(Trace(path="generated", batch_size=4, ops=ops, tensors=tensors))


def _plan_property(examples: int, shrink: bool = True):
    phases = tuple(Phase) if shrink else (Phase.explicit, Phase.generate)

    @seed(20261203)
    @settings(max_examples=examples, deadline=None, database=None, phases=phases,
              suppress_health_check=[HealthCheck.too_slow])
    @given(traces())
    def prop(trace):
        _same_plan(trace)

    return prop


def test_generated_traces_plan_as_the_general_planner():
    _plan_property(300)()


def test_property_catches_a_plan_that_frees_buffers_a_step_early(monkeypatch):
    """Planted bug: a buffer used over several steps is freed one step before its last use."""
    original = single_module.lifetime_occupancy

    def ends_at_last_use(first, end, size, n):
        return original(first, np.minimum(end, np.maximum(first + 1, end - 1)), size, n)

    monkeypatch.setattr(single_module, "lifetime_occupancy", ends_at_last_use)
    with pytest.raises(AssertionError):
        _plan_property(300, shrink=False)()
