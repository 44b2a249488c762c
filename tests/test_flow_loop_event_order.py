"""The flow loop takes its events in (time, kind, task) order whichever queue holds them: those
made in increasing order wait on a sorted run, the others on the heap. On a graph whose only link
task is a lone transfer, the loop must place the compute tasks exactly as the plain list
scheduler does, contention on the GPUs' streams included (who takes a stream first is decided by
that order)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triosim.schedule.list_scheduler as scheduler
from triosim.schedule.network import BANDWIDTH_META, NETWORK_META
from triosim.schedule.tasks import TaskGraph

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def lockstep_dags(draw):
    """Chains on a few GPUs, durations on a coarse grid (many equal times), some edges across
    chains and some tasks sharing another chain's GPU (a stream two chains contend for)."""
    chains = draw(st.integers(2, 6))
    length = draw(st.integers(2, 6))
    gpus = draw(st.lists(st.integers(0, 2), min_size=chains, max_size=chains))
    tasks = []
    for step in range(length):
        for c in range(chains):
            seconds = draw(st.sampled_from([0.0, 1e-3, 2e-3, 3e-3]))
            across = draw(st.lists(st.integers(0, chains - 1), max_size=1)) if step else []
            tasks.append((gpus[c], seconds, c, step, across))
    return chains, tasks


def _graph(chains: int, tasks, flow: bool) -> TaskGraph:
    g = TaskGraph()
    last: dict[int, int] = {}
    for gpu, seconds, c, _step, across in tasks:
        after = [last[k] for k in {c, *across} if k in last]
        last[c] = g.add_compute(gpu, seconds, f"c{c}", after=after)
    g.add_task("transfer", "lone", 1e-3, ("link:gpu8->gpu9",), (8, 9), 1000)  # holds a link nobody else does
    if flow:
        g.meta.update({NETWORK_META: "flow", BANDWIDTH_META: {"link:gpu8->gpu9": 1e6}})
    return g


@PROPS
@given(lockstep_dags())
def test_the_flow_loop_places_compute_as_the_list_scheduler(drawn):
    chains, tasks = drawn
    plain = scheduler.schedule(_graph(chains, tasks, flow=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler, "EARLIEST", False)  # the loop itself, not the one pass
        looped = scheduler.schedule(_graph(chains, tasks, flow=True))
    assert (looped.start, looped.end) == (plain.start, plain.end)
