"""Platform topologies: electrical ring, fully connected, switch, optical mesh with snake ring;
routes, link parameters, reference-compat link scaling and flag validation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triosim import build_platform
from triosim.errors import ConfigError
from triosim.hardware.platform import REMOTE, gpu_node, snake_order


def gpu_links(p) -> set[str]:
    return {name for name in p.links() if REMOTE not in name}


def test_ring_links_and_routes():
    p = build_platform(4, ptp_bandwidth_gbps=65, bandwidth_gbps=696, link_latency_us=2)
    assert p.topology == "ring" and p.ring == (0, 1, 2, 3)
    assert gpu_links(p) == {f"gpu{a}->gpu{b}" for a, b in
                            [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2), (3, 0), (0, 3)]}
    assert p.link("gpu0->gpu1") == {"bandwidth": 65e9, "latency": 2e-6, "kind": "nvlink"}
    assert p.link("gpu2->remote")["bandwidth"] == 696e9
    assert p.route("gpu0", "gpu2") in (("gpu0->gpu1", "gpu1->gpu2"), ("gpu0->gpu3", "gpu3->gpu2"))
    assert p.route("gpu1", REMOTE) == ("gpu1->remote",)
    assert p.route("gpu1", "gpu1") == ()
    assert p.route_time(("gpu0->gpu1",), 65e9) == pytest.approx(1 + 2e-6)
    assert p.ring_links() == [(f"gpu{i}->gpu{(i + 1) % 4}",) for i in range(4)]


@pytest.mark.parametrize("n, links", [(1, set()), (2, {"gpu0->gpu1", "gpu1->gpu0"})])
def test_small_rings(n, links):
    p = build_platform(n)
    assert gpu_links(p) == links
    assert p.ring_links() == ([] if n == 1 else [("gpu0->gpu1",), ("gpu1->gpu0",)])


def test_gpu_traffic_never_detours_through_remote_memory():
    p = build_platform(3, topology="switch")
    assert p.route("gpu0", "gpu2") == ("gpu0->switch", "switch->gpu2")
    assert all(REMOTE not in link for a in range(3) for b in range(3) for link in p.route(gpu_node(a), gpu_node(b)))


def test_fully_connected_has_direct_links():
    p = build_platform(5, topology="fully-connected", ptp_bandwidth_gbps=10, link_latency_us=1)
    assert len(gpu_links(p)) == 5 * 4
    for a in range(5):
        for b in range(5):
            if a != b:
                assert p.route(gpu_node(a), gpu_node(b)) == (f"gpu{a}->gpu{b}",)
    assert p.route_time(p.route("gpu3", "gpu1"), 1e9) == pytest.approx(0.1 + 1e-6)


def test_switch_routes_take_two_links():
    p = build_platform(4, topology="switch", ptp_bandwidth_gbps=20, link_latency_us=0.5)
    assert p.topology == "switch" and p.ring == (0, 1, 2, 3)
    assert p.ring_links()[3] == ("gpu3->switch", "switch->gpu0")
    assert p.route_time(p.ring_links()[0], 20e9) == pytest.approx(1 + 1e-6)


def test_optical_mesh_2x2():
    p = build_platform(4, interconnects=1, num_rows=2, num_cols=2, ptp_bandwidth_gbps=100)
    assert p.topology == "optical-mesh"
    assert p.ring == (0, 1, 3, 2)
    # Horizontal and vertical neighbours only, bandwidth from the flag, 20 ns per hop.
    assert gpu_links(p) == {"gpu0->gpu1", "gpu1->gpu0", "gpu2->gpu3", "gpu3->gpu2",
                            "gpu0->gpu2", "gpu2->gpu0", "gpu1->gpu3", "gpu3->gpu1"}
    assert all(p.link(k) == {"bandwidth": 100e9, "latency": 20e-9, "kind": "nvlink"} for k in gpu_links(p))
    assert all(len(hop) == 1 for hop in p.ring_links())
    assert len(p.route("gpu0", "gpu3")) == 2


def test_optical_mesh_latency_flag_and_default_shape():
    p = build_platform(3, interconnects=1, link_latency_us=0.1)
    assert p.ring == (0, 1, 2)  # -numCols defaults to -GPUnumber: a 1 × N line
    assert p.link("gpu0->gpu1")["latency"] == pytest.approx(1e-7)
    assert p.ring_links()[2] == ("gpu2->gpu1", "gpu1->gpu0")  # the ring closes over the line
    compat = build_platform(4, interconnects=1, num_rows=2, num_cols=2, reference_compat=True)
    assert all(p["latency"] == 0.0 for _, _, p in compat.graph.edges(data=True))


@pytest.mark.parametrize("rows, cols, n", [(2, 2, 3), (3, 2, 4), (2, None, 4), (0, -1, 4)])
def test_optical_mesh_shape_must_match_gpu_count(rows, cols, n):
    with pytest.raises(ConfigError, match="optical mesh"):
        build_platform(n, interconnects=1, num_rows=rows, num_cols=cols)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6))
def test_snake_ring_visits_every_gpu_through_neighbours(rows, cols):
    order = snake_order(rows, cols)
    assert sorted(order) == list(range(rows * cols))
    for a, b in zip(order, order[1:]):
        (ra, ca), (rb, cb) = divmod(a, cols), divmod(b, cols)
        assert abs(ra - rb) + abs(ca - cb) == 1
    p = build_platform(rows * cols, interconnects=1, num_rows=rows, num_cols=cols)
    assert p.ring == order
    hops = p.ring_links()
    # Every ring hop but the closing one is a single link; no two hops share a directed link.
    assert all(len(h) == 1 for h in hops[:-1])
    flat = [link for h in hops for link in h]
    assert len(flat) == len(set(flat))


def test_reference_compat_scales_ring_links():
    for n in (2, 4, 8):
        p = build_platform(n, ptp_bandwidth_gbps=65, link_latency_us=3, reference_compat=True)
        assert p.link("gpu0->gpu1") == {"bandwidth": pytest.approx(65e9 * 2 * (n - 1) / n), "latency": 0.0, "kind": "nvlink"}
    assert build_platform(1, reference_compat=True).ptp_bandwidth == 65e9
    fc = build_platform(4, topology="fully-connected", reference_compat=True)
    assert fc.link("gpu0->gpu1")["bandwidth"] == 65e9


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_gpus": 0}, "GPUnumber"),
        ({"num_gpus": 2, "bandwidth_gbps": 0}, "-bandwidth"),
        ({"num_gpus": 2, "ptp_bandwidth_gbps": -1}, "ptp-bandwidth"),
        ({"num_gpus": 2, "capacity_log2": 5}, "capacity"),
        ({"num_gpus": 2, "link_latency_us": -1}, "latency"),
        ({"num_gpus": 2, "interconnects": 2}, "interconnects"),
        ({"num_gpus": 2, "topology": "torus"}, "topology"),
        ({"num_gpus": 4, "interconnects": 1, "topology": "switch"}, "cannot be combined"),
    ],
)
def test_bad_flags_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        build_platform(**kwargs)


def test_nvlink_cluster_routes_inside_nodes_over_nvlink_and_between_nodes_over_nics():
    from triosim.graph.collectives.algorithms import add_all_reduce
    from triosim.schedule.list_scheduler import schedule
    from triosim.schedule.tasks import TaskGraph

    p = build_platform(8, ptp_bandwidth_gbps=450, topology="nvlink-cluster", gpus_per_node=4,
                       node_bandwidth_gbps=50)
    assert p.route("gpu0", "gpu3") == ("gpu0->nvsw0", "nvsw0->gpu3")
    assert p.route("gpu3", "gpu4") == ("gpu3->net", "net->gpu4")
    assert p.route("gpu0", "remote") == ("gpu0->remote",)
    # A flat ring all-reduce is bound by the slowest hop: the NIC between nodes.
    g = TaskGraph()
    add_all_reduce(g, p, list(p.ring), 8 * 10**9, "ar", detail="expanded")
    assert schedule(g).makespan == pytest.approx(2 * 7 * 10**9 / 50e9)


def test_nvlink_cluster_flags_are_checked():
    with pytest.raises(ConfigError, match="--gpus-per-node must be >= 1"):
        build_platform(8, topology="nvlink-cluster", gpus_per_node=0)
    with pytest.raises(ConfigError, match="--node-bandwidth must be > 0"):
        build_platform(8, topology="nvlink-cluster", node_bandwidth_gbps=0)
