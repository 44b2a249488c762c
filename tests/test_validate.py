"""The invariant checkers themselves report what they claim to (so property tests can fail)."""

from __future__ import annotations

from triosim.schedule.list_scheduler import Schedule, schedule
from triosim.schedule.tasks import TaskGraph
from triosim.schedule.validate import critical_path, dag_violations, schedule_violations


def small_graph() -> TaskGraph:
    g = TaskGraph()
    a = g.add_compute(0, 1.0, "a")
    b = g.add_task("transfer", "b", 2.0, ["gpu0->gpu1"], [0, 1], after=[a])
    g.add_compute(1, 1.0, "c", after=[b])
    return g


def test_clean_graph_and_schedule_have_no_violations():
    g = small_graph()
    assert dag_violations(g) == []
    assert schedule_violations(g, schedule(g)) == []
    assert critical_path(g) == 4.0


def test_cycle_and_dangling_task_are_reported():
    g = small_graph()
    g.add_edge(2, 0)
    g.add_compute(3, 1.0, "lonely")
    found = " | ".join(dag_violations(g))
    assert "cycle" in found and "dangling" in found


def test_precedence_overlap_and_bounds_are_reported():
    g = small_graph()
    g.add_task("transfer", "d", 1.0, ["gpu0->gpu1"], [0, 1], after=[0])
    s = schedule(g)
    bad = Schedule(list(s.start), list(s.end), s.makespan)
    bad.start[2], bad.end[2] = 0.0, 1.0  # c before its predecessor b
    bad.start[3], bad.end[3] = 1.5, 2.5  # d overlaps b on the link
    bad.makespan = 2.5  # shorter than the critical path (4.0)
    found = " | ".join(schedule_violations(g, bad))
    assert "before predecessor" in found and "at once" in found and "critical path" in found
