"""Case 3's op tasks carry one attribute dict per op, shared by every GPU's task of that op
(``TaskGraph.add_compute_tagged``) for its forward and backward ops: the same labels, attributes and key order as the per-op
builder, which gives every task its own dict, and no dict changed by another GPU's task."""

from __future__ import annotations

import pytest

import triosim.graph.tensor.megatron as mg
from triosim import Strategy, build_platform
from triosim.graph import build_graph
from triosim.graph.tensor import per_op
from triosim.trace.load import load_trace


def _ops(graph):
    return [(graph.label[t], list((graph.attrs[t] or {}).items()), graph.devices[t])
            for t in range(len(graph)) if graph.kind[t] == "compute"]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_case3_op_tasks_match_the_per_op_builder(synthetic_dir, n):
    trace = load_trace(synthetic_dir)
    composed = build_graph(trace, build_platform(n), Strategy(case=3))
    plan = mg.plan_tensor_parallel(trace, n, style="per-op")
    own = per_op.build_from_plan(trace, build_platform(n), Strategy(case=3), plan)
    assert sorted(_ops(composed)) == sorted(_ops(own))
    assert any(("shard", n) in attrs for _label, attrs, _d in _ops(composed))  # split ops are marked
    # one dict per forward or backward op, the same object on every GPU (the optimizer's few
    # ops are added after the program, each with its own)
    by_op: dict[int, set[int]] = {}
    for t in range(len(composed)):
        if composed.kind[t] == "compute" and composed.attrs[t]["stage"] != "optimizer":
            by_op.setdefault(composed.attrs[t]["op"], set()).add(id(composed.attrs[t]))
    assert by_op and all(len(ids) == 1 for ids in by_op.values())
