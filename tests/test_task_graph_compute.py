"""``TaskGraph.add_compute`` appends what the generic ``add_task("compute", …)`` does, field for
field (it skips the generic steps because a large mesh adds 10^6 compute tasks)."""

from __future__ import annotations

import pytest

from triosim.schedule.tasks import KINDS, TaskGraph, compute_resource

FIELDS = ("kind", "label", "duration", "resources", "devices", "nbytes", "latency", "attrs", "succ", "npred",
          "resource_names")


def _fill(g: TaskGraph, compute) -> None:
    a = compute(g, 3, 1e-3, "a", ())
    g.add_task("transfer", "x", 2e-3, ("gpu3->switch", "switch->gpu1"), (3, 1), 100, after=[a], latency_s=1e-4)
    b = compute(g, 1, 0.0, "b", (a, 1), op=7, stage="forward")
    compute(g, 3, 5e-4, "c", (b,), microbatch=2)
    compute(g, 0, 2.5e-4, "d", ())


def _generic(g, device, dur, label, after, **attrs):
    return g.add_task("compute", label, dur, (compute_resource(device),), (device,), after=after, **attrs)


def _fast(g, device, dur, label, after, **attrs):
    return g.add_compute(device, dur, label, after=after, **attrs)


def test_add_compute_appends_what_add_task_appends():
    slow, fast = TaskGraph(), TaskGraph()
    _fill(slow, _generic)
    _fill(fast, _fast)
    for field in FIELDS:
        assert getattr(fast, field) == getattr(slow, field), field
    assert fast.to_networkx().nodes(data=True) == slow.to_networkx().nodes(data=True)


def test_add_sync_each_appends_what_add_sync_tagged_appends():
    one, each = TaskGraph(), TaskGraph()
    for g in (one, each):
        _fill(g, _fast)
    tags = {"collective": "ar", "op": 3}
    afters = [[0, 1], [2], [], [1, 1]]
    for gpu, after in zip((3, 1, 7, 3), afters):
        one.add_sync_tagged(f"ar done gpu{gpu}", after, (gpu,), tags)
    assert each.add_sync_each([3, 1, 7, 3], [f"ar done gpu{g}" for g in (3, 1, 7, 3)], tags, afters) == range(5, 9)
    for field in FIELDS:
        assert getattr(each, field) == getattr(one, field), field
    # the graph's interned device tuples: GPU 3's syncs share its compute task's
    assert each.devices[5] is each.devices[8] is each.devices[0] and one.devices[5] is one.devices[0]


@pytest.mark.parametrize("bad", [-1e-9, float("nan")])
def test_add_compute_refuses_a_negative_or_nan_duration(bad):
    with pytest.raises(ValueError, match="negative or NaN"):
        TaskGraph().add_compute(0, bad, "op")


def test_kind_columns_follow_the_graph_as_it_grows() -> None:
    """``kind_codes``, ``tasks_of_kind`` and ``compute_tasks`` read only the tasks added since the
    last call, and give what a scan of the whole graph gives at every size."""
    g = TaskGraph()

    def scanned():
        kinds = g.kind
        compute = [i for i, k in enumerate(kinds) if k == "compute"]
        return ([KINDS.index(k) for k in kinds], compute, [g.devices[i][0] for i in compute],
                [i for i, k in enumerate(kinds) if k in ("transfer", "sync")])

    def read():
        at, gpu = g.compute_tasks()
        return g.kind_codes().tolist(), at.tolist(), gpu.tolist(), g.tasks_of_kind("transfer", "sync").tolist()

    assert read() == scanned()
    _fill(g, _fast)
    assert read() == scanned()
    g.add_sync("s", after=[0])
    g.add_compute_each([5, 6], 1e-3, ["e5", "e6"], None, [[0], [1]])
    assert read() == scanned()
    assert not g.kind_codes().flags.writeable and not g.compute_tasks()[0].flags.writeable
