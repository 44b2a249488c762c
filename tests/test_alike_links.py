"""Links another link stands for in every flow (schedule/flows.alike_links) are left out of the
flows: the schedule must be the one with every link, float for float, on hand-made and random
DAGs of macro collectives and transfers sharing links; a class that ignored the bytes a charge
puts on a link (the planted bug) moves it."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triosim.schedule.list_scheduler as scheduler
from triosim.schedule import flows
from triosim.schedule.network import BANDWIDTH_META, NETWORK_META
from triosim.schedule.tasks import TaskGraph

LINKS = [f"l{k}" for k in range(6)]
BANDWIDTH = {"l0": 1e9, "l1": 1e9, "l2": 1e9, "l3": 1e9, "l4": 2e9, "l5": 1e9}


def _graph(charges: list[tuple[dict[str, float], int]], sends: list[tuple[str, ...]]) -> TaskGraph:
    """Macro collectives (their per-link bytes, how many tasks in a chain) and transfers, all
    starting at 0 so that they share links."""
    g = TaskGraph()
    for k, (load, calls) in enumerate(charges):
        prev = []
        for c in range(calls):
            size = max(load.values())
            prev = [g.add_task("collective", f"c{k}.{c}", 1e-3 + size / 1e9, tuple(load), (0,), int(size), after=prev,
                               latency_s=1e-3, link_load=load)]
    for k, route in enumerate(sends):
        g.add_task("transfer", f"t{k}", 2e-3, route, (0,), 10**6, latency_s=0.0)
    g.meta[NETWORK_META] = "flow"
    g.meta[BANDWIDTH_META] = dict(BANDWIDTH)
    return g


def _schedules(graph: TaskGraph, monkeypatch, alike=None) -> tuple[scheduler.Schedule, scheduler.Schedule]:
    with_alike = scheduler.schedule(graph) if alike is None else None
    if alike is not None:
        monkeypatch.setattr(scheduler, "alike_links", lambda g, bw, *holds: alike)
        with_alike = scheduler.schedule(graph)
    monkeypatch.setattr(scheduler, "alike_links", lambda g, bw, *holds: frozenset())
    every = scheduler.schedule(graph)
    monkeypatch.undo()
    return with_alike, every


def test_classes_follow_holders_bytes_and_bandwidth() -> None:
    ring = {"l0": 5e6, "l1": 5e6, "l2": 5e6, "l3": 5e6, "l4": 5e6}
    skew = {"l0": 1e6, "l1": 1e6, "l2": 1e6, "l3": 3e6}
    g = _graph([(ring, 2), (skew, 1)], [("l0",)])
    rid = {name: g.resource_id(name) for name in LINKS[:5]}
    bandwidth = {rid[n]: BANDWIDTH[n] for n in rid}
    dropped = flows.alike_links(g, bandwidth)
    # l0: the transfer holds it too; l3: 3 MB in the second charge; l4: another bandwidth;
    # l1 and l2 are alike: one stands for the other.
    assert dropped == {rid["l2"]}


def test_schedule_unchanged_and_planted_bug_caught(monkeypatch) -> None:
    ring = {"l0": 5e6, "l1": 5e6, "l2": 5e6, "l3": 5e6}
    skew = {"l1": 3e6, "l2": 1e6, "l3": 1e6}
    g = _graph([(ring, 3), (skew, 2)], [("l0",)])
    rid = {name: g.resource_id(name) for name in LINKS[:4]}
    assert flows.alike_links(g, {rid[n]: BANDWIDTH[n] for n in rid}) == {rid["l3"]}
    fast, every = _schedules(g, monkeypatch)
    assert fast.start == every.start and fast.end == every.end
    # Classes by holders alone would let l2 stand for l1 too, where the second charge puts 3 MB.
    bad, every = _schedules(g, monkeypatch, alike=frozenset({rid["l1"], rid["l3"]}))
    assert bad.end != every.end


loads = st.dictionaries(st.sampled_from(LINKS), st.sampled_from([1e6, 2e6, 4e6]), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(charges=st.lists(st.tuples(loads, st.integers(1, 3)), min_size=1, max_size=4),
       sends=st.lists(st.lists(st.sampled_from(LINKS), min_size=1, max_size=3, unique=True).map(tuple), max_size=3))
def test_random_graphs_schedule_alike(charges, sends, monkeypatch) -> None:
    g = _graph(charges, sends)
    fast, every = _schedules(g, monkeypatch)
    assert fast.start == every.start and fast.end == every.end
