"""The one-pass schedule of a DAG in which nothing meets (``schedule.contention_free``) must be
the flow loop's, float for float, wherever it is taken, and must step aside wherever the loop
would have done something else: two tasks on one stream, flows sharing a link, a communication
kernel taking SMs from a running compute task, flows joining together at different rates. Each
check is shown necessary by a graph that it alone refuses and whose times the pass gets wrong
without it."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triosim.schedule.contention_free as contention_free
import triosim.schedule.list_scheduler as scheduler
from triosim.config import configure
from triosim.graph import build_graph
from triosim.schedule.network import BANDWIDTH_META, NETWORK_META
from triosim.schedule.sm_sharing import COMM_SMS_META, SM_COUNT_META
from triosim.schedule.tasks import TaskGraph

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LINKS = {"ring": ("link:gpu0->gpu1", "link:gpu1->gpu0"), "send": ("link:gpu0->gpu1",), "other": ("link:gpu2->gpu0",),
         "apart": ("link:gpu3->gpu4",)}
BANDWIDTH = {name: 1e6 for names in LINKS.values() for name in names}


def _both(graph: TaskGraph, monkeypatch) -> tuple[scheduler.Schedule, scheduler.Schedule, bool]:
    """(the schedule as triosim finds it, the flow loop's, whether the one pass gave the first)."""
    taken = []
    real = contention_free.earliest_schedule

    def spy(*args):
        out = real(*args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(scheduler, "earliest_schedule", spy)
    found = scheduler.schedule(graph)
    with monkeypatch.context() as m:
        m.setattr(scheduler, "EARLIEST", False)
        loop = scheduler.schedule(graph)
    return found, loop, bool(taken and taken[0])


def _flow_graph(g: TaskGraph, comm_sms: int = 0) -> TaskGraph:
    g.meta.update({NETWORK_META: "flow", BANDWIDTH_META: dict(BANDWIDTH), SM_COUNT_META: 100,
                   COMM_SMS_META: comm_sms})
    return g


@st.composite
def dags(draw):
    """Compute on three GPUs and flows on four link sets, durations on a coarse grid (starts and
    ends coincide often), edges forward in id order and some backward (as pipeline sends added
    after the programs they feed), SMs shared or not."""
    n = draw(st.integers(2, 14))
    tasks = []
    for i in range(n):
        kind = draw(st.sampled_from(["compute", "compute", "compute", "ring", "send", "other", "apart"]))
        gpu = draw(st.integers(0, 2))
        seconds = draw(st.sampled_from([0.0, 1e-4, 2e-4, 5e-4, 1e-3]))
        after = draw(st.lists(st.integers(0, max(0, i - 1)), max_size=2, unique=True)) if i else []
        latency = draw(st.sampled_from([0.0, 1e-5]))
        nbytes = draw(st.sampled_from([0, 1000, 3000]))
        tasks.append((kind, gpu, seconds, after, latency, nbytes))
    back = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2))
    return tasks, back, draw(st.sampled_from([0, 16, 40]))


def _graph(tasks, back, comm_sms: int) -> TaskGraph:
    g = TaskGraph()
    for i, (kind, gpu, seconds, after, latency, nbytes) in enumerate(tasks):
        if kind == "compute":
            g.add_compute(gpu, seconds, f"c{i}", after=after)
        else:
            devices = (0, 1) if kind in ("ring", "send") else (2, 0) if kind == "other" else (3, 4)
            g.add_task("collective" if kind == "ring" else "transfer", f"{kind}{i}", latency + seconds, LINKS[kind],
                       devices, nbytes, after=after, latency_s=latency)
    for u, v in back:  # later-created tasks that an earlier one waits for (where no cycle follows)
        if u > v and not _reaches(g, v, u):
            g.add_edge(u, v)
    return _flow_graph(g, comm_sms)


def _reaches(g: TaskGraph, a: int, b: int) -> bool:
    seen, todo = set(), [a]
    while todo:
        k = todo.pop()
        if k == b:
            return True
        if k not in seen:
            seen.add(k)
            todo.extend(g.succ[k])
    return False


@PROPS
@given(dags())
def test_random_dags_get_the_loops_times_whether_or_not_the_pass_is_taken(drawn):
    tasks, back, comm_sms = drawn
    with pytest.MonkeyPatch.context() as mp:
        found, loop, _taken = _both(_graph(tasks, back, comm_sms), mp)
    assert (found.start, found.end, found.makespan) == (loop.start, loop.end, loop.makespan)


def test_the_random_dags_take_the_pass_often_and_refuse_it_often():
    """The property above tests both branches: over a fixed sample the pass is taken for some
    graphs and refused for others."""
    outcomes = []
    for seed in range(60):
        rng = random.Random(seed)
        n = rng.randint(2, 10)
        tasks = []
        for i in range(n):
            kind = rng.choice(["compute", "compute", "ring", "send", "apart"])
            after = [rng.randint(0, i - 1)] if i and rng.random() < 0.7 else []
            tasks.append((kind, rng.randint(0, 2), rng.choice([1e-4, 5e-4, 1e-3]), after, 0.0, 1000))
        graph = _graph(tasks, [], rng.choice([0, 16]))
        with pytest.MonkeyPatch.context() as mp:
            found, loop, taken = _both(graph, mp)
        assert (found.start, found.end) == (loop.start, loop.end)
        outcomes.append(taken)
    assert 5 <= sum(outcomes) <= len(outcomes) - 5


MESHES = [
    # a 1F1B pipeline with blocking sends and SP collectives: nothing meets but the embedding's
    # reduce-scatter beside the compute after it (the loop's)
    dict(model="megatron-22b", tp=8, pp=4, schedule="1f1b", global_batch=8, recompute="selective",
         sequence_parallel=True, pipeline_send="blocking", pipeline_scatter_gather=True),
    dict(model="gpt3-175b", tp=8, pp=2, schedule="interleaved", virtual_stages=2, global_batch=4, recompute="full",
         num_layers=8),
    dict(model="gpt3-175b", dp=4, pp=2, global_batch=8, num_layers=4),
]


@pytest.mark.parametrize("flags", MESHES)
def test_megatron_meshes_get_the_loops_times(flags, monkeypatch):
    trace, platform, strategy = configure(gpu="a100-80gb", topology_file="topologies/dgx-a100-superpod.yaml",
                                          micro_batch_size=1, dtype="fp16", representatives=True, **flags)
    found, loop, _taken = _both(build_graph(trace, platform, strategy), monkeypatch)
    assert (found.start, found.end, found.makespan) == (loop.start, loop.end, loop.makespan)


def _case2_graph(gpus: int) -> TaskGraph:
    trace, platform, strategy = configure(trace_dir="sample_trace/gpt-h16-cpu-bs8", case=2, gpus=gpus, exact=True)
    return build_graph(trace, platform, strategy)


def test_data_parallel_on_every_gpu_takes_the_pass_with_the_loops_times(monkeypatch):
    found, loop, taken = _both(_case2_graph(16), monkeypatch)
    assert taken
    assert (found.start, found.end, found.makespan) == (loop.start, loop.end, loop.makespan)


# -- each check, necessary: a graph only it refuses, whose times the pass alone gets wrong -----

def _refused_only_by(check: str, graph: TaskGraph, monkeypatch) -> None:
    found, loop, taken = _both(graph, monkeypatch)
    assert not taken and (found.start, found.end) == (loop.start, loop.end)
    monkeypatch.setattr(contention_free, check, lambda *args: True)  # planted: the check waved through
    wrong, loop, taken = _both(graph, monkeypatch)
    assert taken and (wrong.start, wrong.end) != (loop.start, loop.end)


def test_two_tasks_ready_together_on_one_stream_are_refused(monkeypatch):
    g = TaskGraph()
    g.add_compute(0, 1e-3, "a")
    g.add_compute(0, 1e-3, "b")  # the loop runs it after a
    g.add_task("transfer", "x", 1e-3, LINKS["apart"], (3, 4), 1000)
    _refused_only_by("_resources_apart", _flow_graph(g), monkeypatch)


def test_flows_of_two_tuples_on_one_link_at_once_are_refused(monkeypatch):
    g = TaskGraph()
    g.add_task("collective", "x", 1e-3, LINKS["ring"], (0, 1), 1000)
    g.add_task("transfer", "y", 1e-3, LINKS["send"], (0, 1), 1000)  # shares gpu0->gpu1 with x
    _refused_only_by("_resources_apart", _flow_graph(g), monkeypatch)


def test_a_collective_taking_sms_from_a_running_compute_task_is_refused(monkeypatch):
    # x holds 25 of GPU 0's SMs while b runs there. The pass places b, then d, then x, so its
    # own look at the task placed just before (d) does not see it: the check over every GPU does.
    g = TaskGraph()
    g.add_task("collective", "x", 5e-4, LINKS["ring"], (0, 1), 1000)
    b = g.add_compute(0, 2e-3, "b")
    g.add_compute(0, 1e-3, "d", after=[b])
    _refused_only_by("_sms_apart", _flow_graph(g, comm_sms=25), monkeypatch)


def test_a_collective_beside_the_compute_placed_just_before_it_ends_the_pass_at_once(monkeypatch):
    g = TaskGraph()
    a = g.add_compute(0, 1e-3, "a")
    g.add_task("collective", "x", 5e-4, LINKS["ring"], (0, 1), 1000, after=[a])
    g.add_compute(0, 2e-3, "b", after=[a])  # slowed while x holds GPU 0's SMs
    graph = _flow_graph(g, comm_sms=25)
    monkeypatch.setattr(contention_free, "_sms_apart", lambda *args: True)  # the pass itself refuses it
    found, loop, taken = _both(graph, monkeypatch)
    assert not taken and (found.start, found.end) == (loop.start, loop.end)
    assert loop.end[2] == pytest.approx(1e-3 + 2e-3 + 5e-4 * 0.25, rel=1e-12)


def test_beyond_the_passs_own_sm_checks_the_check_after_it_refuses(monkeypatch):
    """Past its first SM_CHECKS_IN_PASS tasks the pass no longer looks for a collective beside a
    compute task of its GPU: the same graph is then refused by _sms_apart alone."""
    g = TaskGraph()
    a = g.add_compute(0, 1e-3, "a")
    g.add_task("collective", "x", 5e-4, LINKS["ring"], (0, 1), 1000, after=[a])
    g.add_compute(0, 2e-3, "b", after=[a])
    monkeypatch.setattr(contention_free, "SM_CHECKS_IN_PASS", 0)
    _refused_only_by("_sms_apart", _flow_graph(g, comm_sms=25), monkeypatch)


def test_flows_joining_together_at_different_rates_are_refused(monkeypatch):
    # Joined together, x and y are rated by one max-min filling, which gives y its rate alone
    # less one unit in the last place at this bandwidth.
    g = TaskGraph()
    g.add_task("transfer", "x", 1e-3, LINKS["send"], (0, 1), 1000)
    g.add_task("transfer", "y", 5e-4, LINKS["apart"], (3, 4), 1000)
    _flow_graph(g).meta[BANDWIDTH_META]["link:gpu3->gpu4"] = 4155024.4969246546
    _refused_only_by("_flows_apart", g, monkeypatch)


def test_two_flows_of_one_tuple_meeting_end_the_pass_at_once(monkeypatch):
    g = TaskGraph()
    g.add_task("collective", "x", 1e-3, LINKS["ring"], (0, 1), 1000)
    g.add_task("collective", "y", 1e-3, LINKS["ring"], (0, 1), 1000)  # the two share the ring: 2 ms each
    found, loop, taken = _both(_flow_graph(g), monkeypatch)
    assert not taken and (found.start, found.end) == (loop.start, loop.end)
    assert loop.end == [pytest.approx(2e-3), pytest.approx(2e-3)]
