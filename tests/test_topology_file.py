"""Topologies read from YAML files: the shipped ring (= the default platform) and DGX H100
SuperPOD files, closed-form cluster routes, and one-line errors naming the file and field."""

from __future__ import annotations

import builtins

import pytest

from triosim import build_platform
from triosim.cli.console import main
from triosim.errors import ConfigError
from triosim.graph.collectives.cost import collective_cost
from triosim.hardware.topology_file import packaged_dir

SUPERPOD = "dgx-h100-superpod"
# The file's achieved bandwidths: nominal × its link classes' efficiency (0.82 NVLink, 0.92 NIC/spine).
NV, NIC = 450e9 * 0.82, 50e9 * 0.92


def test_shipped_files_are_found_by_path_and_by_name():
    assert (packaged_dir() / "ring.yaml").is_file()
    a = build_platform(8, topology_file=str(packaged_dir() / "dgx-h100-superpod.yaml"))
    b = build_platform(8, topology_file="dgx-h100-superpod")
    assert a.links() == b.links() and a.topology == "dgx-h100-superpod"


def test_ring_file_is_the_default_platform():
    a = build_platform(6, topology_file="ring")
    b = build_platform(6)
    assert a.links() == b.links() and a.ring == b.ring and a.channel_style == b.channel_style
    for name in a.links():
        assert a.link(name) == b.link(name)


def test_superpod_routes():
    p = build_platform(512, topology_file="dgx-h100-superpod")  # 64 nodes = 2 scalable units
    assert p.route("gpu0", "gpu1") == ("gpu0->nvsw0", "nvsw0->gpu1")
    assert p.route("gpu0", "gpu8") == ("gpu0->leaf0r0", "leaf0r0->gpu8")  # same rail, same SU
    # Another rail: NVLink to the GPU on the destination's rail first (as NCCL's PXN).
    assert p.route("gpu0", "gpu9") == ("gpu0->nvsw0", "nvsw0->gpu1", "gpu1->leaf0r1", "leaf0r1->gpu9")
    assert p.route("gpu0", "gpu256") == ("gpu0->leaf0r0", "leaf0r0->spine", "spine->leaf1r0", "leaf1r0->gpu256")
    assert p.link_bandwidth("gpu0->nvsw0") == NV and p.link_bandwidth("gpu0->leaf0r0") == NIC
    assert p.link("gpu0->nvsw0")["nominal_bandwidth"] == 450e9
    assert p.link_bandwidth("leaf0r0->spine") == 32 * 50e9 * 0.92  # non-blocking: 32 nodes' ports
    assert p.route_kind(p.route("gpu0", "gpu8")) == "net" and p.route_kind(p.route("gpu0", "gpu1")) == "nvlink"
    assert p.node_of[255] == 31 and p.node_of[256] == 32


def test_superpod_oversubscription_narrows_the_spine(tmp_path):
    text = (packaged_dir() / "dgx-h100-superpod.yaml").read_text().replace("oversubscription: 1",
                                                                           "oversubscription: 2")
    f = tmp_path / "tapered.yaml"
    f.write_text(text)
    p = build_platform(512, topology_file=str(f))
    assert p.link_bandwidth("leaf0r0->spine") == 16 * 50e9 * 0.92


def test_two_nics_per_gpu_double_every_rail(tmp_path):
    # Two NICs per GPU, striped: the GPU's link to its rail's leaf and the leaf's uplink carry
    # twice the bandwidth, so cross-node collectives on the rails take half the bandwidth time.
    text = (packaged_dir() / "dgx-h100-superpod.yaml").read_text().replace("nics_per_gpu: 1", "nics_per_gpu: 2")
    f = tmp_path / "two-nics.yaml"
    f.write_text(text)
    one = build_platform(512, topology_file=SUPERPOD, collective_latency_us=0.0)
    two = build_platform(512, topology_file=str(f), collective_latency_us=0.0)
    assert two.link_bandwidth("gpu0->leaf0r0") == 100e9 * 0.92 and two.link_bandwidth("leaf0r0->gpu0") == 100e9 * 0.92
    assert two.link_bandwidth("leaf0r0->spine") == 32 * 100e9 * 0.92
    assert two.link_bandwidth("gpu0->nvsw0") == NV
    s = 10**9
    rail = (0, 8, 256, 264)  # local rank 0 of four nodes in two scalable units
    c1, c2 = (collective_cost(p, rail, "all_reduce", s, "ring") for p in (one, two))
    assert c2.latency_seconds == c1.latency_seconds > 0
    assert c2.seconds - c2.latency_seconds == pytest.approx((c1.seconds - c1.latency_seconds) / 2, rel=1e-12)
    bad = tmp_path / "no-nics.yaml"
    bad.write_text(text.replace("nics_per_gpu: 2", "nics_per_gpu: 0"))
    with pytest.raises(ConfigError, match="'nics_per_gpu' must be a positive integer"):
        build_platform(8, topology_file=str(bad))


def test_superpod_rings_use_every_rail():
    p = build_platform(16, topology_file=SUPERPOD, collective_latency_us=0.0)
    s = 10**9
    hop = 2 * 0.13e-6  # GPU -> leaf -> GPU: two links of the file's NIC latency
    # Of the 2 × 15 steps, a chunk leaves its node once per phase: 2 network steps (NCCL's count).
    assert collective_cost(p, range(16), "all_reduce", s, "ring").seconds == pytest.approx(
        2 * 1 * hop + 2 * 15 / 16 * s / (8 * NIC), rel=1e-12)
    assert collective_cost(p, range(16), "all_reduce", s, "hierarchical").seconds == pytest.approx(
        2 * 1 * hop + 2 * 7 / 8 * s / NV + 2 * 1 / 2 * (s / 8) / NIC, rel=1e-12)


@pytest.mark.parametrize("text, needle", [
    ("kind: mesh\n", "field 'kind'"),
    ("kind: cluster\ngpus_per_node: 8\nnic: {bandwidth_gbps: 50}\nleaf: {nodes_per_leaf: 4}\n", "'nvlink'"),
    ("kind: cluster\ngpus_per_node: -8\nnvlink: {bandwidth_gbps: 1}\nnic: {bandwidth_gbps: 1}\n"
     "leaf: {nodes_per_leaf: 1}\n", "'gpus_per_node' must be a positive integer"),
    ("kind: cluster\ngpus_per_node: 8\nnvlink: {bandwidth_gbps: .nan}\nnic: {bandwidth_gbps: 1}\n"
     "leaf: {nodes_per_leaf: 1}\n", "'bandwidth_gbps'"),
    ("kind: preset\ntopology: ring\nlinks: 3\n", "unknown field 'links'"),
    ("kind: [unclosed\n", "not valid YAML"),
    ("kind: preset\ngpus: 4\n", "-GPUnumber is 16"),
    ("kind: cluster\ngpus_per_node: 8\nnvlink: {bandwidth_gbps: 1, sharp: 1}\nnic: {bandwidth_gbps: 1}\n"
     "leaf: {nodes_per_leaf: 1}\n", "nvlink: field 'sharp' must be true or false, got 1"),
    ("kind: cluster\ngpus_per_node: 8\nnvlink: {bandwidth_gbps: 1, sharp_efficiency: 0.5}\nnic: {bandwidth_gbps: 1}\n"
     "leaf: {nodes_per_leaf: 1}\n", "field 'sharp_efficiency' needs 'sharp: true'"),
    ("kind: cluster\ngpus_per_node: 8\nnvlink: {bandwidth_gbps: 1, sharp: true, sharp_efficiency: 1.5}\n"
     "nic: {bandwidth_gbps: 1}\nleaf: {nodes_per_leaf: 1}\n", "'sharp_efficiency' must be <= 1"),
    ("kind: cluster\ngpus_per_node: 8\nnvlink: {bandwidth_gbps: 1}\nnic: {bandwidth_gbps: 1, sharp: true}\n"
     "leaf: {nodes_per_leaf: 1}\n", "nic: unknown field 'sharp'"),
])
def test_bad_files_name_the_file_and_field(tmp_path, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        build_platform(16, topology_file=str(f))
    assert needle in str(err.value) and str(f) in str(err.value) and "\n" not in str(err.value)


def test_whole_nodes_and_missing_files():
    with pytest.raises(ConfigError, match="whole number of nodes"):
        build_platform(12, topology_file="dgx-h100-superpod")
    with pytest.raises(ConfigError, match="file not found.*dgx-h100-superpod"):
        build_platform(8, topology_file="no-such-cluster.yaml")


def test_missing_pyyaml_is_a_clear_error(monkeypatch):
    real = builtins.__import__

    def no_yaml(name, *args, **kwargs):
        if name == "yaml":
            raise ImportError("no yaml")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_yaml)
    with pytest.raises(ConfigError, match="needs pyyaml"):
        build_platform(8, topology_file="ring")


def test_cli_topology_file(capsys, synthetic_dir):
    code = main(["run", "--trace-dir", str(synthetic_dir), "-case", "1", "-GPUnumber", "16",
                 "--topology-file", "dgx-h100-superpod", "--json", "-"])
    out, _ = capsys.readouterr()
    assert code == 0 and '"topology": "dgx-h100-superpod"' in out
    code = main(["run", "--trace-dir", str(synthetic_dir), "-case", "1", "--topology-file", "nope.yaml", "-q"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "nope.yaml" in err
