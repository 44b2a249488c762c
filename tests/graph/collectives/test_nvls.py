"""NCCL's NVLS (NVLink SHARP) as the ``nvls`` algorithm: its closed form on a DGX H100 node,
where it is offered (a SHARP switch under every GPU of the group, Simple protocol) and where
not (A100, across nodes, a pair of nodes' GPUs), what ``auto`` picks, the task DAG against the
closed form, and planted bugs each check catches."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import triosim.graph.collectives.nvls_cost as nvls_cost
import triosim.graph.collectives.protocols as protocols
from triosim import build_platform
from triosim.graph.collectives.algorithms import add_all_gather, add_all_reduce, add_reduce_scatter
from triosim.graph.collectives.choice import supported
from triosim.graph.collectives.cost import collective_cost
from triosim.hardware.cluster import build_cluster
from triosim.hardware.topology_file import ClusterSpec, LinkSpec
from triosim.report.result import summarize
from triosim.schedule.list_scheduler import schedule
from triosim.schedule.network import attach_network
from triosim.schedule.tasks import TaskGraph
from triosim.schedule.validate import dag_violations

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PLANTED = settings(PROPS, max_examples=200, phases=[Phase.generate])  # stops at the first failure
ADD = {"all_reduce": add_all_reduce, "reduce_scatter": add_reduce_scatter, "all_gather": add_all_gather}
NVLS_OPS = tuple(ADD)
S = 2**30
H100_NVLS = 450e9 * 0.69  # dgx-h100-superpod: NVLink 450 GB/s per direction, sharp_efficiency 0.69


def h100(gpus: int = 8, latency: float | None = 0.0, **kw):
    return build_platform(gpus, topology_file="dgx-h100-superpod", collective_latency_us=latency, **kw)


# ----------------------------------------------------------------------------- closed form


def check_h100_node_closed_forms() -> None:
    """On one DGX H100 node (N = 8): all-reduce S(1 + 1/N)/B, reduce-scatter and all-gather
    S/B, B = 450 GB/s · 0.69; NCCL's latency adds 25 µs; every GPU↔switch link carries the
    module docstring's bytes."""
    p, n = h100(), 8
    want = {"all_reduce": S * (1 + 1 / n) / H100_NVLS, "reduce_scatter": S / H100_NVLS, "all_gather": S / H100_NVLS}
    for op, seconds in want.items():
        c = collective_cost(p, range(n), op, S, "nvls")
        assert c.algo == "nvls" and c.protocol == "simple"
        assert c.seconds == pytest.approx(seconds, rel=1e-9), op
    nccl = collective_cost(h100(latency=None), range(n), "all_reduce", S, "nvls")
    assert nccl.seconds == pytest.approx(25e-6 + want["all_reduce"], rel=1e-9)
    assert nccl.latency_seconds == pytest.approx(25e-6)
    # The links carry the payload over NVLS's share of their modelled rate (0.69 / 0.82).
    wire = S * 0.82 / 0.69
    ar = collective_cost(p, range(n), "all_reduce", S, "nvls").link_bytes
    rs = collective_cost(p, range(n), "reduce_scatter", S, "nvls").link_bytes
    ag = collective_cost(p, range(n), "all_gather", S, "nvls").link_bytes
    for g in range(n):
        up, down = f"gpu{g}->nvsw0", f"nvsw0->gpu{g}"
        assert ar[up] == pytest.approx(wire * (1 + 1 / n), rel=1e-9)
        assert ar[down] == pytest.approx(wire * (1 + 1 / n), rel=1e-9)
        assert (rs[up], rs[down]) == (pytest.approx(wire, rel=1e-9), pytest.approx(wire / n, rel=1e-9))
        assert (ag[up], ag[down]) == (pytest.approx(wire / n, rel=1e-9), pytest.approx(wire, rel=1e-9))
    assert len(ar) == 2 * n  # no other link


def test_nvls_on_a_dgx_h100_node_takes_s_times_1_plus_1_over_n_over_b() -> None:
    check_h100_node_closed_forms()


@pytest.mark.parametrize("planted", ["sequential", "both_full", "rs_swapped"])
def test_closed_form_check_catches_wrong_link_loads(monkeypatch, planted) -> None:
    # Planted bugs: all-reduce's reduce and multicast not pipelined (2S each way), the switch
    # multicasting the whole buffer for each slice (S + S each way), reduce-scatter's directions
    # swapped.
    loads = dict(nvls_cost._LOAD)
    loads.update({"sequential": {"all_reduce": ((2, 0), (2, 0))},
                  "both_full": {"all_reduce": ((2, 0), (1, 1))},
                  "rs_swapped": {"reduce_scatter": ((0, 1), (1, 0))}}[planted])
    monkeypatch.setattr(nvls_cost, "_LOAD", loads)
    with pytest.raises(AssertionError):
        check_h100_node_closed_forms()


def test_closed_form_check_catches_the_ring_efficiency_kept(monkeypatch) -> None:
    # Planted bug: NVLS at the ring's 0.82 of the line rate instead of the switch's 0.69.
    monkeypatch.setattr(protocols, "nvls_share", lambda platform, group: 1.0)
    with pytest.raises(AssertionError):
        check_h100_node_closed_forms()


def test_sharp_efficiency_defaults_to_the_links(tmp_path: Path) -> None:
    # Without its own figure, NVLS runs at the NVLink's efficiency: S(1 + 1/N)/(nominal · efficiency).
    text = (Path(__file__).resolve().parents[3] / "topologies" / "dgx-h100-superpod.yaml").read_text()
    f = tmp_path / "h100.yaml"
    f.write_text(text.replace("  sharp_efficiency: 0.69\n", ""))
    p = build_platform(8, topology_file=str(f), collective_latency_us=0.0)
    c = collective_cost(p, range(8), "all_reduce", S, "nvls")
    assert c.seconds == pytest.approx(S * (1 + 1 / 8) / (450e9 * 0.82), rel=1e-12)
    assert c.link_bytes["gpu0->nvsw0"] == S * (1 + 1 / 8)


# ----------------------------------------------------------------------------- where it runs


def check_where_offered() -> None:
    """NVLS runs on GPUs of one SHARP switch under Simple; elsewhere ``nvls`` runs the ring."""
    p = h100(16)
    assert supported(p, tuple(range(8)), "all_reduce", "nvls")
    assert supported(p, (9, 12), "reduce_scatter", "nvls")
    assert not supported(p, tuple(range(16)), "all_reduce", "nvls")  # across nodes
    assert not supported(p, (0, 8), "all_reduce", "nvls")
    assert not supported(p, tuple(range(8)), "broadcast", "nvls")  # NCCL has no NVLS broadcast
    assert not supported(p.protocol_variant("ll"), tuple(range(8)), "all_reduce", "nvls")  # Simple only
    assert collective_cost(p, range(16), "all_reduce", S, "nvls").algo == "ring"
    a100 = build_platform(16, topology_file="dgx-a100-superpod", collective_latency_us=None)
    for op in NVLS_OPS:
        assert not supported(a100, tuple(range(8)), op, "nvls")
        assert collective_cost(a100, range(8), op, S, "nvls").algo == "ring"
        assert all(collective_cost(a100, range(8), op, s).algo != "nvls" for s in (2**10, 2**20, S))
    flag_built = build_platform(8, topology="nvlink-cluster", gpus_per_node=8, collective_latency_us=None)
    assert collective_cost(flag_built, range(8), "all_reduce", S, "nvls").algo == "ring"


def test_nvls_runs_only_on_one_sharp_switch() -> None:
    check_where_offered()


def test_where_offered_check_catches_a_switch_per_gpu_accepted(monkeypatch) -> None:
    # Planted bug: a group is taken as on one switch when its first GPU has a SHARP switch.
    import triosim.graph.collectives.groups as groups

    def first_only(platform, group):
        graph = platform.graph
        hubs = [s for s in graph.successors(f"gpu{group[0]}") if graph.nodes[s].get("sharp_efficiency")]
        return hubs[0] if hubs else None

    monkeypatch.setattr(groups, "sharp_switch", first_only)
    monkeypatch.setattr(nvls_cost, "sharp_switch", first_only)
    with pytest.raises(AssertionError):
        check_where_offered()


def check_auto_choice() -> None:
    """``auto`` (Simple, NCCL latencies) on 2 DGX H100 nodes: NVLS for an all-reduce inside a
    node (the ring's 2(N−1)/N · S/(0.82 · 450) loses to S(1 + 1/N)/(0.69 · 450)); no NVLS for
    one across the nodes, nor for a node's reduce-scatter of 1 GiB (S/(0.69 · 450) against the
    ring's (N−1)/N · S/(0.82 · 450)), nor on a pair of GPUs (S/(0.82 · 450) < 1.5 S/(0.69 · 450))."""
    p = h100(16, latency=None)
    assert collective_cost(p, range(8), "all_reduce", S).algo == "nvls"
    assert collective_cost(p, range(8, 16), "all_reduce", 2**24).algo == "nvls"
    assert collective_cost(p, range(16), "all_reduce", S).algo == "ring"
    assert collective_cost(p, range(8), "reduce_scatter", S).algo == "ring"
    assert collective_cost(p, range(8), "all_gather", S).algo == "ring"
    assert collective_cost(p, (0, 1), "all_reduce", S).algo == "ring"


def test_auto_picks_nvls_inside_a_node_and_ring_where_it_is_faster() -> None:
    check_auto_choice()


def test_auto_choice_check_catches_nvls_left_out(monkeypatch) -> None:
    # Planted bug: auto never compares NVLS.
    import triosim.graph.collectives.choice as choice

    real = choice.candidates
    monkeypatch.setattr(choice, "candidates", lambda *a: [x for x in real(*a) if x != "nvls"])
    with pytest.raises(AssertionError):
        check_auto_choice()


def test_auto_choice_check_catches_a_latency_step_per_gpu(monkeypatch) -> None:
    # Planted bug: NVLS pays its 25 µs once per GPU instead of once per call, so a 16 MiB
    # all-reduce inside a node would go to the ring.
    import triosim.graph.collectives.plans as plans
    from triosim.graph.collectives.phases import Phase as CPhase

    real = plans.nvls_phases

    def per_gpu(platform, group, op, nbytes):
        return [CPhase(ph.name, len(group), ph.step_latency, ph.link_load) for ph in real(platform, group, op, nbytes)]

    monkeypatch.setattr(plans, "nvls_phases", per_gpu)
    with pytest.raises(AssertionError):
        check_auto_choice()


# ----------------------------------------------------------------------------- DAG == closed form


@st.composite
def nvls_cases(draw):
    """(platform, op, group, S, detail): a generated cluster whose NVSwitch offers SHARP, and a
    group of ≥ 2 GPUs of one node, in any order."""
    per = draw(st.integers(2, 9))
    nodes = draw(st.integers(1, 2))
    eff = draw(st.sampled_from((0.8, 1.0)))
    spec = ClusterSpec(
        name="sharp", gpus_per_node=per, nics_per_gpu=1, nodes_per_leaf=4, oversubscription=1.0,
        nvlink=LinkSpec(draw(st.floats(1, 900)), draw(st.sampled_from((0.0, 0.5))), eff),
        nic=LinkSpec(50.0, 0.13, 0.92), spine_latency_us=0.13, remote_bandwidth_gbps=None, gpus=None,
        nvlink_sharp_efficiency=draw(st.sampled_from((eff, 0.6, 0.69))))
    p = build_cluster(spec, Path("sharp.yaml"), per * nodes, 40, 696, draw(st.sampled_from(("flow", "exclusive"))),
                      "auto", draw(st.sampled_from((None, 0.0, 2.5))))
    node = draw(st.integers(0, nodes - 1))
    members = draw(st.lists(st.integers(0, per - 1), min_size=2, max_size=per, unique=True))
    group = tuple(node * per + m for m in members)
    return p, draw(st.sampled_from(NVLS_OPS)), group, draw(st.integers(0, 2**33)), \
        draw(st.sampled_from(("expanded", "macro", "auto")))


def dag_property(case) -> None:
    p, op, group, nbytes, detail = case
    cost = collective_cost(p, group, op, nbytes, algo="nvls")
    assert cost.algo == "nvls"
    g = TaskGraph()
    done = ADD[op](g, p, group, nbytes, op, detail=detail, algo="nvls")
    attach_network(g, p)
    s = schedule(g)
    assert sorted(done) == sorted(group) and dag_violations(g) == []
    assert s.makespan == pytest.approx(cost.seconds, rel=1e-9, abs=1e-18)
    assert max(s.end[t] for t in done.values()) == pytest.approx(cost.seconds, rel=1e-9, abs=1e-18)
    _gpus, links = summarize(g, s, p)
    got = {k.link: k.bytes for k in links}
    assert set(got) <= set(cost.link_bytes)  # the task holds the closed form's links, no other
    for name, b in cost.link_bytes.items():  # and carries their bytes (the report counts whole bytes)
        assert got.get(name, 0) == pytest.approx(b, abs=64), name


test_nvls_dag_takes_its_closed_form = PROPS(given(nvls_cases())(dag_property))


def test_dag_property_catches_tasks_timed_without_the_latency(monkeypatch) -> None:
    # Planted bug: the DAG's phase task drops the phase's latency step.
    import triosim.graph.collectives.fragment as fragment
    from triosim.graph.collectives.phases import Phase as CPhase

    real = fragment.phase_macros

    def no_latency(graph, platform, group, op, nbytes, phases, *args):
        phases = [CPhase(ph.name, 0, 0.0, ph.link_load, 0.0, ph.fill) for ph in phases]
        return real(graph, platform, group, op, nbytes, phases, *args)

    monkeypatch.setattr(fragment, "phase_macros", no_latency)
    with pytest.raises(AssertionError):
        PLANTED(given(nvls_cases())(dag_property))()


def test_dag_property_catches_a_link_left_out(monkeypatch) -> None:
    # Planted bug: the last GPU's links to the switch are not held by the DAG's task.
    import triosim.graph.collectives.nvls_tasks as nvls_tasks
    from triosim.graph.collectives.phases import Phase as CPhase

    real = nvls_tasks.plans.plan

    def drop_last(platform, group, op, nbytes, algo, root=None):
        out = []
        for ph in real(platform, group, op, nbytes, algo, root):
            load = {k: v for k, v in ph.link_load.items() if f"gpu{group[-1]}" not in k}
            out.append(CPhase(ph.name, ph.steps, ph.step_latency, load, ph.base_latency, ph.fill))
        return out

    monkeypatch.setattr(nvls_tasks.plans, "plan", drop_last)
    with pytest.raises(AssertionError):
        PLANTED(given(nvls_cases())(dag_property))()


def test_a_run_records_nvls_for_its_collectives() -> None:
    g = TaskGraph()
    add_all_reduce(g, h100(), range(8), S, "grads", algo="auto")
    assert g.meta["collectives"] == {"all_reduce nvls": {"op": "all_reduce", "algo": "nvls", "calls": 1, "bytes": S}}


@pytest.mark.parametrize("name, sharp", [("dgx-h100-superpod", 0.69), ("dgx-b200-superpod", 0.60),
                                         ("gb200-nvl72", 0.60), ("dgx-a100-superpod", None)])
def test_shipped_switches_offer_sharp_from_hopper_on(name, sharp) -> None:
    p = build_platform(72 if name.startswith("gb200") else 8, topology_file=name)
    assert p.graph.nodes["nvsw0"].get("sharp_efficiency") == sharp
