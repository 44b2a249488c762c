"""NCCL's protocols (Simple, LL, LL128): every algorithm's expanded and macro forms still take
their closed form under each protocol; the latency constants and bandwidth shares per protocol;
``auto`` picking LL for small messages and Simple for large ones; the command-line flag."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from triosim import build_platform
from triosim.cli.console import main
from triosim.graph.collectives import protocols as cc
from triosim.graph.collectives import ring_tasks
from triosim.graph.collectives.cost import collective_cost

from .test_collective_cost import PLANTED, PROPS, closed_form_property, symmetric_cases


@st.composite
def protocol_cases(draw):
    p, op, group, nbytes, algo, detail, root = draw(symmetric_cases())
    p = p.with_network(collective_protocol=draw(st.sampled_from(("ll", "ll128", "auto"))))
    return p, op, group, nbytes, algo, detail, root


test_protocols_keep_the_closed_form = PROPS(given(protocol_cases())(closed_form_property))


def test_protocol_property_catches_rings_sending_the_payload(monkeypatch):
    # Planted bug: the expanded and macro rings move the payload, not the protocol's bytes.
    real = ring_tasks.multi_ring

    def payload_only(graph, platform, group, op, nbytes, *args, **kwargs):
        eff = cc.protocol_efficiency(platform, "ring", group, op)
        return real(graph, platform, group, op, int(nbytes * eff), *args, **kwargs)

    monkeypatch.setattr(ring_tasks, "multi_ring", payload_only)
    with pytest.raises(AssertionError):
        PLANTED(given(protocol_cases())(closed_form_property))()


@pytest.mark.parametrize("proto, base_us, step_us, share", [
    ("simple", 8.4, 3.4, 1.0), ("ll", 6.6, 0.6, 1 / 4), ("ll128", 14.0, 1.9, 0.92)])
def test_ring_latency_and_bandwidth_per_protocol(proto, base_us, step_us, share):
    # 8 fully connected GPUs (NVLink): NCCL's per-call and per-step latencies of the protocol,
    # and the payload at the protocol's share of the links.
    p = build_platform(8, topology="fully-connected", ptp_bandwidth_gbps=100, collective_latency_us=None)
    s = 10**9
    c = collective_cost(p.with_network(collective_protocol=proto), range(8), "all_reduce", s, "ring")
    assert c.protocol == proto and c.nbytes == s
    assert c.latency_seconds == pytest.approx((base_us + 2 * 7 * step_us) * 1e-6, rel=1e-12)
    simple = collective_cost(p, range(8), "all_reduce", s, "ring")
    assert c.seconds - c.latency_seconds == pytest.approx(
        (simple.seconds - simple.latency_seconds) / share, rel=1e-9)


def test_tree_protocol_shares():
    one_node = build_platform(8, topology_file="dgx-h100-superpod", collective_latency_us=None)
    two_nodes = build_platform(16, topology_file="dgx-h100-superpod", collective_latency_us=None)
    ll128 = "ll128"
    assert cc.protocol_efficiency(one_node.protocol_variant(ll128), "tree", tuple(range(8)), "all_reduce") == 7 / 9
    assert cc.protocol_efficiency(two_nodes.protocol_variant(ll128), "tree", tuple(range(16)),
                                  "all_reduce") == 120 / 128
    assert cc.protocol_efficiency(two_nodes.protocol_variant("ll"), "ring", tuple(range(16)), "all_gather") == 1 / 4
    assert cc.protocol_efficiency(one_node.protocol_variant("ll"), "ring", tuple(range(8)), "all_gather") == 1 / 3
    assert cc.wire_bytes(one_node.protocol_variant("ll"), "tree", tuple(range(8)), "all_reduce", 19) == 73


def test_auto_protocol_picks_ll_for_small_messages_and_simple_for_large():
    p = build_platform(8, topology_file="dgx-h100-superpod", collective_latency_us=None)
    auto = p.with_network(collective_protocol="auto")
    small, large = (collective_cost(auto, range(8), "all_reduce", s) for s in (1024, 2**30))
    assert (small.algo, small.protocol) == ("ring", "ll")
    assert (large.algo, large.protocol) == ("nvls", "simple")  # the node's NVSwitch offers SHARP
    assert small.seconds < collective_cost(p, range(8), "all_reduce", 1024).seconds
    assert large.seconds == collective_cost(p, range(8), "all_reduce", 2**30).seconds
    assert p.protocol_variant("ll").route("gpu0", "gpu1") is p.route("gpu0", "gpu1")  # shares the routes


def test_cli_collective_protocol(capsys, synthetic_dir):
    args = ["run", "--trace-dir", str(synthetic_dir), "-case", "1", "-GPUnumber", "8", "--json", "-"]
    assert main(args + ["--collective-protocol", "ll"]) == 0
    out = capsys.readouterr()[0]
    json.loads(out)
    assert '"algo": "ring/ll"' in out and '"protocol": "ll"' in out
    assert main(args + ["--collective-protocol", "ll", "--reference-compat"]) == 0
    assert '/ll"' not in capsys.readouterr()[0]  # the original had Simple only
    with pytest.raises(SystemExit) as stop:
        main(args + ["--collective-protocol", "ll64"])
    assert stop.value.code == 2 and "--collective-protocol" in capsys.readouterr()[1]
