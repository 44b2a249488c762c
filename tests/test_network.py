"""The flow network model: max-min fair sharing, the issue's examples, and link-capacity
properties over random flow sets on random topologies (each with a planted bug it catches)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import triosim.hardware.flow_network as network
from triosim import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.schedule.network import attach_network
from triosim.schedule.tasks import TaskGraph

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GB = 1e9


def flows_graph(platform, flows):
    g = TaskGraph()
    for i, (s, d, nbytes) in enumerate(flows):
        g.add_transfer(platform, s, d, nbytes, f"f{i}")
    return attach_network(g, platform)


def test_abc_example_takes_two_ms_with_fair_sharing_and_three_exclusive():
    # A(0→1), B(0→2), C(3→2) on a switch, each 1 ms alone.
    p = build_platform(4, topology="switch", ptp_bandwidth_gbps=1, network="flow")
    flows = [(0, 1, 10**6), (0, 2, 10**6), (3, 2, 10**6)]
    assert schedule(flows_graph(p, flows)).makespan == pytest.approx(2e-3, rel=1e-12)
    ex = p.with_network(network="exclusive")
    assert schedule(flows_graph(ex, flows)).makespan == pytest.approx(3e-3, rel=1e-12)


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_k_flows_into_one_gpu_each_get_one_kth(k):
    p = build_platform(k + 1, topology="switch", ptp_bandwidth_gbps=10, network="flow")
    g = flows_graph(p, [(s, 0, 10**7) for s in range(1, k + 1)])
    s = schedule(g, record_rates=True)
    assert s.makespan == pytest.approx(k * 1e-3, rel=1e-12)
    for _t0, _t1, rates in s.rates:
        assert all(r == pytest.approx(10 * GB / k, rel=1e-12) for r in rates.values())


def test_multi_hop_flow_is_limited_by_its_bottleneck():
    # gpu0 -> gpu2 on a 3-GPU line crosses two links; a second flow on the first link halves it.
    p = build_platform(3, topology="switch", ptp_bandwidth_gbps=2, network="flow")
    g = flows_graph(p, [(0, 2, 2 * 10**6), (0, 1, 10**6)])
    s = schedule(g)
    # Both share gpu0->switch at 1 GB/s until the 1 MB flow ends at 1 ms; then 2 GB/s for 0.5 ms.
    assert s.end[1] == pytest.approx(1e-3, rel=1e-12)
    assert s.end[0] == pytest.approx(1.5e-3, rel=1e-12)


def test_latency_is_a_fixed_delay_before_sharing():
    p = build_platform(3, topology="switch", ptp_bandwidth_gbps=1, link_latency_us=100, network="flow")
    g = flows_graph(p, [(0, 1, 10**6)])
    assert schedule(g).makespan == pytest.approx(2e-4 + 1e-3, rel=1e-12)


def test_exclusive_graph_schedules_as_before():
    p = build_platform(4, topology="switch", ptp_bandwidth_gbps=1)
    assert p.network == "exclusive"
    g = flows_graph(p, [(0, 1, 10**6), (0, 2, 10**6)])
    assert schedule(g).makespan == pytest.approx(2e-3, rel=1e-12)


# ----------------------------------------------------------------------------- properties


@st.composite
def flow_sets(draw):
    n = draw(st.integers(2, 7))
    topology = draw(st.sampled_from(("ring", "fully-connected", "switch", "nvlink-cluster")))
    p = build_platform(n, topology=topology, ptp_bandwidth_gbps=draw(st.floats(1, 500)),
                       node_bandwidth_gbps=draw(st.floats(1, 100)), gpus_per_node=draw(st.integers(1, 4)),
                       network="flow")
    pairs = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.integers(1, 10**8)).filter(
        lambda x: x[0] != x[1])
    flows = draw(st.lists(pairs, min_size=1, max_size=12))
    return p, flows


def check_capacities(platform, graph, sched):
    """No link above its bandwidth at any time; no flow above its bottleneck; bytes all moved."""
    moved = [0.0] * len(graph)
    for t0, t1, rates in sched.rates:
        load: dict[str, float] = {}
        for task, rate in rates.items():
            route = graph.task_resources(task)
            assert rate <= min(platform.link_bandwidth(x) for x in route) * (1 + 1e-9)
            for name in route:
                load[name] = load.get(name, 0.0) + rate
            moved[task] += rate * (t1 - t0)
        for name, total in load.items():
            assert total <= platform.link_bandwidth(name) * (1 + 1e-9), (name, total)
    for task in range(len(graph)):
        assert moved[task] == pytest.approx(graph.nbytes[task], rel=1e-6)


def capacity_property(case):
    platform, flows = case
    g = flows_graph(platform, flows)
    s = schedule(g, record_rates=True)
    check_capacities(platform, g, s)
    # Never faster than alone, never slower than all flows back to back.
    for t in range(len(g)):
        assert s.end[t] - s.start[t] >= g.duration[t] * (1 - 1e-9)
    assert s.makespan <= sum(g.duration) * (1 + 1e-9)


def fairness_property(case):
    """Every flow is bottlenecked: some link of its route is full and it has the top rate there."""
    platform, flows = case
    g = flows_graph(platform, flows)
    s = schedule(g, record_rates=True)
    for _t0, _t1, rates in s.rates:
        load: dict[str, float] = {}
        for task, rate in rates.items():
            for name in g.task_resources(task):
                load[name] = load.get(name, 0.0) + rate
        for task, rate in rates.items():
            assert any(
                load[name] >= platform.link_bandwidth(name) * (1 - 1e-9)
                and all(rates[o] <= rate * (1 + 1e-9) for o in rates if name in g.task_resources(o))
                for name in g.task_resources(task)
            ), (task, rates)


test_random_flows_respect_link_capacities = PROPS(given(flow_sets())(capacity_property))
test_random_flows_are_max_min_fair = PROPS(given(flow_sets())(fairness_property))
# Planted-bug runs stop at the first failure (no shrinking): they only show the property fails.
PLANTED = settings(PROPS, phases=[Phase.generate])


def _greedy_rates(flows):
    """Planted bug: every flow runs at its solo rate, as if it had the links to itself."""
    for f in flows:
        f.rate = f.solo_rate


def test_capacity_property_catches_flows_ignoring_each_other(monkeypatch):
    import triosim.schedule.list_scheduler as sched_module

    monkeypatch.setattr(sched_module, "maxmin_rates", _greedy_rates)
    with pytest.raises(AssertionError):
        PLANTED(given(flow_sets())(capacity_property))()


def _half_rates(flows):
    """Planted bug: rates fair but only half the link used."""
    network.maxmin_rates(flows)
    for f in flows:
        f.rate /= 2


def test_fairness_property_catches_wasted_capacity(monkeypatch):
    import triosim.schedule.list_scheduler as sched_module

    monkeypatch.setattr(sched_module, "maxmin_rates", _half_rates)
    with pytest.raises(AssertionError):
        PLANTED(given(flow_sets())(fairness_property))()


# ----------------------------------------------------------------------------- the old model


def test_reference_compat_implies_the_original_network():
    p = build_platform(8, reference_compat=True, network="flow", collective_algo="auto", collective_latency_us=None)
    assert (p.network, p.collective_algo, p.collective_latency_us) == ("exclusive", "one-way-ring", 0.0)


@pytest.mark.parametrize("argv, before", [
    (["-case", "1", "-GPUnumber", "8"], "108.3662"),
    (["-case", "3", "-GPUnumber", "4"], "215.8429"),
    (["-case", "1", "-GPUnumber", "16", "--topology", "nvlink-cluster", "-ptp-bandwidth", "450",
      "--node-bandwidth", "50"], "113.9952"),
])
def test_exclusive_one_way_ring_reproduces_the_earlier_numbers(capsys, vgg13_dir, argv, before):
    """The numbers the simulator gave before the network flags existed (vgg13, batch 128)."""
    from triosim.cli.console import main

    old = ["--network", "exclusive", "--collective-algo", "one-way-ring", "--collective-latency-us", "0"]
    assert main(["run", "--trace-dir", str(vgg13_dir), *argv, *old, "-q"]) == 0
    assert capsys.readouterr()[0].strip() == before
