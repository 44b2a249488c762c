"""The flow loop takes an event it has just made at once when it is the next one
(``list_scheduler.AT_ONCE``): a compute task made ready is begun on its free shared stream, a
flow's start without latency joins its links, instead of on the loop's next turn. The schedule
must be the one the next turn gives, float for float, on random DAGs with SM sharing, on small
hybrid meshes and on the orderings the conditions guard (the one pass that places a graph in
which nothing meets, ``list_scheduler.EARLIEST``, is off here: it would take some of them)."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triosim.schedule.list_scheduler as scheduler
from triosim.config import configure
from triosim.graph import build_graph
from triosim.schedule.network import BANDWIDTH_META, NETWORK_META
from triosim.schedule.sm_sharing import COMM_SMS_META, SM_COUNT_META
from triosim.schedule.tasks import TaskGraph

PROPS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LINKS = {"ring": ("link:gpu0->gpu1", "link:gpu1->gpu0"), "send": ("link:gpu0->gpu1",), "other": ("link:gpu2->gpu0",)}


def _both(graph: TaskGraph, monkeypatch) -> tuple[scheduler.Schedule, scheduler.Schedule, int]:
    """(the schedule with tasks begun at once, the one without, how many turns of the loop the
    first took fewer: events taken off the heap)."""
    taken = [0]

    class CountingHeap:  # the loop takes every event through heappop or heappushpop
        heapify, heappush = heapq.heapify, heapq.heappush

        @staticmethod
        def heappop(heap):
            taken[0] += 1
            return heapq.heappop(heap)

        @staticmethod
        def heappushpop(heap, item):
            taken[0] += 1
            return heapq.heappushpop(heap, item)

    monkeypatch.setattr(scheduler, "heapq", CountingHeap)
    monkeypatch.setattr(scheduler, "EARLIEST", False)  # the loop itself (not the one pass before it)
    fast = scheduler.schedule(graph)
    fast_turns, taken[0] = taken[0], 0
    with monkeypatch.context() as m:
        m.setattr(scheduler, "AT_ONCE", False)
        general = scheduler.schedule(graph)
    return fast, general, taken[0] - fast_turns


@st.composite
def dags(draw):
    """Compute on three GPUs (chains and joins) with collectives and sends between them that take
    SMs, on durations of a coarse grid so that starts and ends coincide often."""
    n = draw(st.integers(2, 16))
    tasks = []
    for i in range(n):
        kind = draw(st.sampled_from(["compute", "compute", "compute", "ring", "send", "other"]))
        gpu = draw(st.integers(0, 2))
        seconds = draw(st.sampled_from([0.0, 1e-4, 2e-4, 5e-4, 1e-3]))
        after = draw(st.lists(st.integers(0, max(0, i - 1)), max_size=2, unique=True)) if i else []
        latency = draw(st.sampled_from([0.0, 1e-5]))
        tasks.append((kind, gpu, seconds, after, latency))
    return tasks, draw(st.sampled_from([0, 16, 40]))


def _graph(tasks, comm_sms: int) -> TaskGraph:
    g = TaskGraph()
    for i, (kind, gpu, seconds, after, latency) in enumerate(tasks):
        if kind == "compute":
            g.add_compute(gpu, seconds, f"c{i}", after=after)
        else:
            links = LINKS[kind]
            devices = (0, 1) if kind != "other" else (2, 0)
            g.add_task("collective" if kind == "ring" else "transfer", f"{kind}{i}", latency + seconds, links, devices,
                       1000, after=after, latency_s=latency)
    g.meta.update({NETWORK_META: "flow", BANDWIDTH_META: {name: 1e6 for names in LINKS.values() for name in names},
                   SM_COUNT_META: 100, COMM_SMS_META: comm_sms})
    return g


def test_a_chain_of_compute_tasks_is_begun_at_once_and_ends_as_the_next_turn_says(monkeypatch):
    g = TaskGraph()
    a = g.add_compute(0, 1e-3, "a")
    x = g.add_task("collective", "x", 5e-4, LINKS["ring"], (0, 1), 1000, after=[a])
    b = g.add_compute(0, 2e-3, "b", after=[a])  # runs while x holds 25 of GPU 0's SMs
    c = g.add_compute(0, 1e-3, "c", after=[b])
    g.meta.update({NETWORK_META: "flow", BANDWIDTH_META: {name: 2e6 for name in LINKS["ring"]}, SM_COUNT_META: 100,
                   COMM_SMS_META: 25})
    fast, general, saved = _both(g, monkeypatch)
    assert saved == 1  # c begun at once (b is made ready after x, which the loop takes first)
    assert (fast.start, fast.end) == (general.start, general.end)
    assert fast.start[b] == fast.end[a] == 1e-3 and fast.start[c] == fast.end[b]
    assert fast.end[b] == pytest.approx(1e-3 + 2e-3 + 5e-4 * 0.25, rel=1e-12)  # slowed while x ran
    assert fast.end[x] == pytest.approx(1.5e-3, rel=1e-12)


@PROPS
@given(dags())
def test_random_dags_schedule_alike_with_and_without_beginning_at_once(drawn):
    tasks, comm_sms = drawn
    with pytest.MonkeyPatch.context() as mp:
        fast, general, _saved = _both(_graph(tasks, comm_sms), mp)
    assert (fast.start, fast.end, fast.makespan) == (general.start, general.end, general.makespan)


MESHES = [
    dict(model="megatron-22b", tp=8, pp=4, schedule="1f1b", global_batch=8, recompute="selective",
         sequence_parallel=True, pipeline_send="blocking", pipeline_scatter_gather=True),
    dict(model="gpt3-175b", tp=8, pp=2, schedule="interleaved", virtual_stages=2, global_batch=4, recompute="full",
         num_layers=8),
]


@pytest.mark.parametrize("flags", MESHES)
def test_small_megatron_meshes_schedule_alike_with_and_without_beginning_at_once(flags, monkeypatch):
    trace, platform, strategy = configure(gpu="a100-80gb", topology_file="topologies/dgx-a100-superpod.yaml",
                                          micro_batch_size=1, dtype="fp16", representatives=True, **flags)
    graph = build_graph(trace, platform, strategy)
    fast, general, saved = _both(graph, monkeypatch)
    assert saved > len(graph) // 10
    assert (fast.start, fast.end, fast.makespan) == (general.start, general.end, general.makespan)


def _flow_graph(g: TaskGraph, comm_sms: int = 10) -> TaskGraph:
    g.meta.update({NETWORK_META: "flow", BANDWIDTH_META: {name: 1e6 for name in LINKS["ring"]}, SM_COUNT_META: 100,
                   COMM_SMS_META: comm_sms})
    return g


def test_a_task_ready_at_the_same_time_with_a_lower_id_takes_the_stream_first(monkeypatch):
    # p0 and p1 end together; p0's end is taken first and makes r ready, but q (made ready by
    # p1's end, still on the heap) has the lower id: q runs first on GPU 1, as the next turn says.
    g = TaskGraph()
    p0 = g.add_compute(0, 1e-3, "p0")
    p1 = g.add_compute(2, 1e-3, "p1")
    q = g.add_compute(1, 1e-3, "q", after=[p1])
    r = g.add_compute(1, 1e-3, "r", after=[p0])
    g.add_task("collective", "x", 1e-3, LINKS["ring"], (3, 4), 1000)  # its SMs on GPUs that compute nothing
    fast, general, _saved = _both(_flow_graph(g), monkeypatch)
    assert (fast.start, fast.end) == (general.start, general.end)
    assert fast.start[q] == 1e-3 and fast.start[r] == fast.end[q]


def test_a_task_ready_later_waits_for_a_flow_ending_before_it(monkeypatch):
    # A link-less transfer (placed on its own, holding no SMs) from 0.5 ms to 2.5 ms makes b ready
    # at 2.5 ms while the flow x, ending at 1 ms, is under way: x's end makes a ready first, and a
    # takes GPU 0 before b.
    g = TaskGraph()
    x = g.add_task("collective", "x", 1e-3, LINKS["ring"], (0, 1), 1000, sms=10)
    c0 = g.add_compute(2, 5e-4, "c0")
    hop = g.add_task("transfer", "local", 2e-3, (), (2, 0), 0, after=[c0])
    b = g.add_compute(0, 1e-3, "b", after=[hop])
    a = g.add_compute(0, 5e-3, "a", after=[x])
    fast, general, _saved = _both(_flow_graph(g, comm_sms=0), monkeypatch)
    assert (fast.start, fast.end) == (general.start, general.end)
    assert fast.start[a] == pytest.approx(1e-3) and fast.start[b] == fast.end[a]


def test_a_flow_without_latency_joins_at_once(monkeypatch):
    g = TaskGraph()
    a = g.add_compute(0, 1e-3, "a")
    x = g.add_task("collective", "x", 1e-3, LINKS["ring"], (0, 1), 1000, after=[a])
    b = g.add_compute(0, 1e-3, "b", after=[x])
    fast, general, saved = _both(_flow_graph(g), monkeypatch)
    assert saved == 2  # x's start (its latency is over at once) and b, made ready by x's end
    assert (fast.start, fast.end) == (general.start, general.end)
    assert fast.start[b] == fast.end[x] == pytest.approx(2e-3)


def test_flows_ending_together_release_the_lower_id_first(monkeypatch):
    # x1 and x2 end together: x1's end makes r ready first, then x2's makes q ready; q has the
    # lower id and takes GPU 1 first, as the next turns say.
    g = TaskGraph()
    x1 = g.add_task("collective", "x1", 1e-3, LINKS["ring"], (3, 4), 1000)
    x2 = g.add_task("transfer", "x2", 1e-3, LINKS["other"], (2, 0), 1000)
    q = g.add_compute(1, 1e-3, "q", after=[x2])
    r = g.add_compute(1, 1e-3, "r", after=[x1])
    _flow_graph(g).meta[BANDWIDTH_META] = {name: 1e6 for names in LINKS.values() for name in names}
    fast, general, _saved = _both(g, monkeypatch)
    assert (fast.start, fast.end) == (general.start, general.end)
    assert fast.end[x1] == fast.end[x2]
    assert fast.start[q] == fast.end[x2] and fast.start[r] == fast.end[q]


def test_a_flow_whose_latency_outlasts_another_flow_joins_after_that_one_ends(monkeypatch):
    # x2 is ready at 0.5 ms with 1 ms of latency: x1 on the same ring ends at 1 ms, before x2
    # joins at 1.5 ms, so x2 runs alone (had it joined at once, the two would share the ring).
    g = TaskGraph()
    x1 = g.add_task("collective", "x1", 1e-3, LINKS["ring"], (3, 4), 1000)
    c = g.add_compute(2, 5e-4, "c")
    x2 = g.add_task("collective", "x2", 1e-3 + 1e-3, LINKS["ring"], (3, 4), 1000, after=[c], latency_s=1e-3)
    fast, general, _saved = _both(_flow_graph(g), monkeypatch)
    assert (fast.start, fast.end) == (general.start, general.end)
    assert fast.end[x1] == pytest.approx(1e-3) and fast.end[x2] == pytest.approx(2.5e-3)
