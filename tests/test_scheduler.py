"""List scheduler: hand-checked cases and hypothesis properties over random DAGs.

The property test is also run against a planted bug (a scheduler that ignores resource
occupancy) to show that it can fail.
"""

from __future__ import annotations

import heapq

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triosim.errors import TriosimError
from triosim.schedule import list_scheduler as scheduler_module
from triosim.schedule.list_scheduler import Schedule, schedule
from triosim.schedule.tasks import TaskGraph
from triosim.schedule.validate import critical_path, schedule_violations


def test_chain_and_shared_resource():
    g = TaskGraph()
    a = g.add_task("compute", "a", 1.0, ["gpu0.compute"], [0])
    b = g.add_task("compute", "b", 2.0, ["gpu0.compute"], [0])  # independent but same stream
    c = g.add_task("transfer", "c", 0.5, ["gpu0->gpu1"], [0, 1], after=[a])
    d = g.add_task("sync", "d", 0.0, after=[b, c])
    s = schedule(g)
    assert (s.start[a], s.end[a]) == (0.0, 1.0)
    assert (s.start[b], s.end[b]) == (1.0, 3.0)  # waits for the stream, ties by id
    assert (s.start[c], s.end[c]) == (1.0, 1.5)
    assert s.start[d] == 3.0 and s.makespan == 3.0


def test_cycle_is_reported():
    g = TaskGraph()
    a = g.add_task("sync", "a", 0.0)
    b = g.add_task("sync", "b", 0.0, after=[a])
    g.add_edge(b, a)
    with pytest.raises(TriosimError, match="cycle"):
        schedule(g)


@st.composite
def random_dags(draw):
    n = draw(st.integers(1, 40))
    nres = draw(st.integers(1, 5))
    g = TaskGraph()
    for t in range(n):
        preds = draw(st.lists(st.integers(0, t - 1), max_size=3, unique=True)) if t else []
        res = draw(st.lists(st.integers(0, nres - 1), max_size=2, unique=True))
        dur = draw(st.floats(0, 10, allow_nan=False))
        g.add_task("transfer" if res else "sync", f"t{t}", dur if res else 0.0, [f"r{r}" for r in res], after=preds)
    return g


def check_schedule_properties(g: TaskGraph) -> None:
    s = schedule(g)
    assert schedule_violations(g, s) == []
    assert s.makespan >= critical_path(g) - 1e-9


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags())
def test_schedule_respects_precedence_resources_and_bounds(g):
    check_schedule_properties(g)


def _buggy_schedule(graph: TaskGraph, progress=None) -> Schedule:
    """Planted bug: ignores resource occupancy (tasks overlap on a shared link)."""
    n = len(graph)
    indeg = list(graph.npred)
    ready = [0.0] * n
    start, end = [0.0] * n, [0.0] * n
    heap = [(0.0, i) for i in range(n) if indeg[i] == 0]
    while heap:
        t, i = heapq.heappop(heap)
        start[i], end[i] = t, t + graph.duration[i]
        for j in graph.succ[i]:
            ready[j] = max(ready[j], end[i])
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (ready[j], j))
    return Schedule(start, end, max(end, default=0.0))


def test_property_catches_a_planted_bug(monkeypatch):
    monkeypatch.setattr(scheduler_module, "schedule", _buggy_schedule)
    monkeypatch.setitem(globals(), "schedule", _buggy_schedule)
    with pytest.raises(AssertionError):
        test_schedule_respects_precedence_resources_and_bounds()


@st.composite
def chains(draw):
    """A chain, task i before task i + 1, on one or several resources; sometimes one more edge
    or one task fewer in the chain, which is no longer a plain chain."""
    n = draw(st.integers(1, 60))
    g = TaskGraph()
    for t in range(n):
        dur = draw(st.floats(0, 1e-2, allow_nan=False))
        res = [f"r{draw(st.integers(0, 2))}"]
        g.add_task("compute", f"t{t}", dur, res, [0], after=[t - 1] if t else [])
    twist = draw(st.sampled_from(["none", "none", "extra edge", "free task"]))
    if twist == "extra edge" and n > 2:
        g.add_edge(0, n - 1)
    elif twist == "free task":
        g.add_task("compute", "free", draw(st.floats(0, 1e-2)), ["r0"], [0])
    return g


def _looped(g: TaskGraph) -> Schedule:
    """The general loop, never the chain's closed form."""
    original = scheduler_module._chain_schedule
    scheduler_module._chain_schedule = lambda graph: None
    try:
        return schedule(g)
    finally:
        scheduler_module._chain_schedule = original


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_a_chain_is_placed_as_the_loop_places_it(g):
    """The closed form for one chain (a single GPU's program) gives the loop's schedule exactly,
    and graphs that are not one chain still take the loop."""
    fast, loop = schedule(g), _looped(g)
    assert (fast.start, fast.end, fast.makespan) == (loop.start, loop.end, loop.makespan)
    plain = scheduler_module._chain_schedule(g) is not None
    assert plain == (g.npred[0] == 0 and g.npred.count(1) == len(g) - 1 and not g.succ[-1]
                     and all(s == [i + 1] for i, s in enumerate(g.succ[:-1])))
