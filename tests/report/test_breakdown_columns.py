"""The breakdown's compute parts, grouped with numpy, are the floats of the task-by-task loop:
each phase's running sum in task order and each GPU's union of compute spans."""

from __future__ import annotations

from types import SimpleNamespace

from triosim.report.breakdown import COMPUTE_PARTS, _compute_parts, compute_phase
from triosim.report.intervals import union
from triosim.schedule.list_scheduler import schedule
from triosim.schedule.tasks import TaskGraph


def _loop(graph, sched):
    """The task-by-task loop the breakdown ran before (the reference)."""
    stages = graph.meta.get("op_stages", ())
    recomputed = graph.meta.get("recompute_ops", frozenset())
    compute, busy = {}, {}
    for i, kind in enumerate(graph.kind):
        if kind != "compute":
            continue
        s, e = sched.start[i], sched.end[i]
        op = (graph.attrs[i] or {}).get("op")
        stage = stages[op] if isinstance(op, int) and 0 <= op < len(stages) else "forward"
        for d in graph.devices[i]:
            parts = compute.setdefault(d, dict.fromkeys(COMPUTE_PARTS, 0.0))
            parts[compute_phase(stage, op in recomputed)] += e - s
            busy.setdefault(d, []).append((s, e))
    return compute, {d: union(v) for d, v in busy.items()}


def _graph() -> TaskGraph:
    g = TaskGraph()
    g.meta["op_stages"] = ("forward", "backward", "optimizer", "forward")
    g.meta["recompute_ops"] = frozenset({3})
    prev = {}
    # durations that do not add up exactly in floats, so that a different order shows
    for k in range(600):
        d = (k * 7) % 3
        dur = (0.1, 0.2, 0.3, 1e-9, 1 / 3, 0.7)[k % 6] * (1 + k / 97) ** 3
        prev[d] = g.add_compute(d, dur, f"c{k}", after=[prev[d]] if d in prev else [], op=k % 4)
    g.add_task("compute", "two GPUs", 0.25, ("gpu0.compute", "gpu1.compute"), (0, 1), after=[prev[0], prev[1]],
               op=1)
    g.add_sync("join", after=list(prev.values()), devices=(2,))
    g.add_compute(4, 0.0, "empty")
    return g


def test_compute_parts_are_the_loops_floats():
    g = _graph()
    sched = schedule(g)
    got = _compute_parts(g, SimpleNamespace(start=sched.start, end=sched.end))
    assert got == _loop(g, sched)
    assert got[0][0]["recompute"] > 0 and got[0][0]["optimizer"] > 0  # every phase is exercised
