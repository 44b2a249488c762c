"""Flows on links only their own tuple holds (a TP group's ring inside one NVSwitch node) skip
the flow network's per-link sets while alone: the schedule must be the one the general path
gives, float for float, on hand-made DAGs, random ones and small hybrid meshes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triosim.schedule.list_scheduler as scheduler
from triosim import build_platform
from triosim.config import configure
from triosim.graph import build_graph
from triosim.hardware.flow_network import ActiveFlows
from triosim.schedule.network import attach_network
from triosim.schedule.private_links import private_tuples
from triosim.schedule.tasks import TaskGraph

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RING01 = ("gpu0->switch", "switch->gpu1", "gpu1->switch", "switch->gpu0")  # private: nobody else
RING23 = ("gpu2->switch", "switch->gpu3", "gpu3->switch", "switch->gpu2")  # shared with SEND23 when present
SEND23 = ("gpu2->switch", "switch->gpu3")


def _platform():
    return build_platform(4, topology="switch", ptp_bandwidth_gbps=1, link_latency_us=10, network="flow")


def _both(graph: TaskGraph, monkeypatch) -> tuple[scheduler.Schedule, scheduler.Schedule, int]:
    """(schedule with the lone-flow path, schedule without it, flows that took the lone path)."""
    taken = []

    class Counted(dict):  # the scheduler enters a lone flow here (inline or through add_alone)
        def __setitem__(self, key, task):
            taken.append(task)
            super().__setitem__(key, task)

    class Counting(ActiveFlows):
        def __init__(self) -> None:
            super().__init__()
            self.alone = Counted()

    monkeypatch.setattr(scheduler, "ActiveFlows", Counting)
    monkeypatch.setattr(scheduler, "EARLIEST", False)  # the loop itself (not the one pass before it)
    fast = scheduler.schedule(graph)
    with monkeypatch.context() as m:
        m.setattr(scheduler, "private_tuples", lambda *_a: set())
        general = scheduler.schedule(graph)
    return fast, general, len(taken)


def _collective(g: TaskGraph, p, links: tuple[str, ...], nbytes: int, label: str, after=(), latency=2e-5) -> int:
    xfer = nbytes / p.link_bandwidth(links[0])
    return g.add_task("collective", label, latency + xfer, links, (), nbytes, after=after, latency_s=latency,
                      link_bytes=nbytes)


def test_private_tuples_are_those_whose_links_no_other_tuple_holds():
    links = frozenset({1, 2, 3, 4, 5})
    assert private_tuples([(1, 2), (3, 4), (4, 5), (0, 9), (1, 2)], links) == {(1, 2)}
    assert private_tuples([(0, 1, 2), (2, 1)], links) == set()  # the same links in another order: shared
    assert private_tuples([(0, 7)], links) == set()  # no link: not a flow at all


def test_overlapping_flows_of_one_tuple_share_as_the_general_path_says(monkeypatch):
    # Two collectives on the same private ring overlap: the first runs alone, then shares with
    # the second (it must then be entered on its links), then runs alone again.
    p = _platform()
    g = TaskGraph()
    a = _collective(g, p, RING01, 10**6, "a")
    c = g.add_compute(2, 3e-4, "c")
    _collective(g, p, RING01, 10**6, "b", after=[c])
    _collective(g, p, RING01, 5 * 10**5, "d", after=[a])
    fast, general, taken = _both(attach_network(g, p), monkeypatch)
    assert taken >= 1
    assert (fast.start, fast.end) == (general.start, general.end)
    # closed form: a alone 0.3 ms, then a and b at half rate until a's last 0.7 MB are through
    assert fast.end[a] == pytest.approx(2e-5 + 3e-4 + 2 * 7e-4, rel=1e-9)


def test_a_tuple_shared_with_another_never_takes_the_lone_path(monkeypatch):
    p = _platform()
    g = TaskGraph()
    x = _collective(g, p, RING23, 10**6, "ring")
    y = g.add_task("transfer", "send", 2e-5 + 1e-3, SEND23, (2, 3), 10**6, latency_s=2e-5)
    fast, general, taken = _both(attach_network(g, p), monkeypatch)
    assert taken == 0
    assert (fast.start, fast.end) == (general.start, general.end)
    assert fast.end[x] == fast.end[y] == pytest.approx(2e-5 + 2e-3, rel=1e-9)  # the two share gpu2->switch


@st.composite
def dags(draw):
    """Collectives on two rings (one private, one shared with a send unless left out), sends
    and compute, with durations on a coarse grid so that starts and ends coincide often."""
    with_send = draw(st.booleans())
    n = draw(st.integers(2, 14))
    tasks = []
    for i in range(n):
        kind = draw(st.sampled_from(["ring01", "ring23", "send23", "compute"] if with_send
                                    else ["ring01", "ring23", "compute"]))
        size = draw(st.sampled_from([0, 10**5, 2 * 10**5, 5 * 10**5, 10**6]))
        after = draw(st.lists(st.integers(0, max(0, i - 1)), max_size=2, unique=True)) if i else []
        latency = draw(st.sampled_from([0.0, 1e-5, 1e-4]))
        tasks.append((kind, size, after, latency))
    return tasks


def _dag_graph(tasks) -> TaskGraph:
    p = _platform()
    g = TaskGraph()
    for i, (kind, size, after, latency) in enumerate(tasks):
        if kind == "compute":
            g.add_compute(i % 4, size * 1e-9, f"c{i}", after=after)
        elif kind == "send23":
            g.add_task("transfer", f"s{i}", latency + size * 1e-9, SEND23, (2, 3), size, after=after, latency_s=latency)
        else:
            _collective(g, p, RING01 if kind == "ring01" else RING23, size, f"r{i}", after=after, latency=latency)
    return attach_network(g, p)


@PROPS
@given(dags())
def test_random_dags_schedule_alike_with_and_without_the_lone_path(tasks):
    with pytest.MonkeyPatch.context() as mp:
        fast, general, _taken = _both(_dag_graph(tasks), mp)
    assert (fast.start, fast.end, fast.makespan) == (general.start, general.end, general.makespan)


HYBRID = [  # one representative per role, as large runs are built: each TP group a charge on its own ring
    dict(model="megatron-22b", tp=8, pp=2, schedule="1f1b", global_batch=4, recompute="selective",
         sequence_parallel=True),
    dict(model="gpt3-175b", tp=8, pp=2, schedule="interleaved", virtual_stages=2, global_batch=4, recompute="full",
         num_layers=8),
    dict(model="megatron-22b", tp=8, pp=2, dp=2, schedule="1f1b", global_batch=8, recompute="none", num_layers=4),
]


@pytest.mark.parametrize("flags", HYBRID)
def test_small_megatron_meshes_schedule_alike_with_and_without_the_lone_path(flags, monkeypatch):
    trace, platform, strategy = configure(gpu="a100-80gb", topology_file="topologies/dgx-a100-superpod.yaml",
                                          micro_batch_size=1, dtype="fp16", representatives=True, **flags)
    graph = build_graph(trace, platform, strategy)
    fast, general, taken = _both(graph, monkeypatch)
    assert taken > 0
    assert (fast.start, fast.end, fast.makespan) == (general.start, general.end, general.makespan)
