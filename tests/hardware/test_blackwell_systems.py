"""Blackwell systems as data: the gb200 device (the GPU of a GB200 NVL72 rack) and the DGX B200 and
GB200 NVL72 topology files, each number as its file states and sources it."""

from __future__ import annotations

import pytest

from triosim import build_platform
from triosim.errors import ConfigError
from triosim.hardware.device_db import get_device


def test_gb200_peaks_are_the_racks_over_72_gpus_dense() -> None:
    gb200, b200 = get_device("gb200"), get_device("b200")
    # GB200 NVL72 datasheet: 720 PF FP8 and 360 PF BF16 per rack with sparsity, 576 TB/s, 13.4 TB
    assert gb200.matrix_flops["fp8"] == pytest.approx(720e15 / 72 / 2)
    assert gb200.matrix_flops["bf16"] == pytest.approx(360e15 / 72 / 2)
    assert gb200.hbm_bytes_per_s == pytest.approx(8e12) and gb200.memory_bytes == pytest.approx(186e9)
    # the NVL72 GPU runs at a higher power than a DGX B200's, so its peaks are higher
    assert gb200.matrix_flops["bf16"] > b200.matrix_flops["bf16"]
    assert gb200.node_fabric == "gb200-nvl72" and b200.node_fabric == "dgx-b200-superpod"
    for field in ("matrix_tflops", "vector_tflops", "hbm_gbps", "memory_gb", "node_fabric"):
        assert gb200.sources[field].strip()


def test_a_gb200_rack_is_one_nvlink_domain_of_72_gpus() -> None:
    p = build_platform(144, topology_file="gb200-nvl72")  # two racks
    assert p.route("gpu0", "gpu71") == ("gpu0->nvsw0", "nvsw0->gpu71")  # one switch hop inside the rack
    assert p.route_kind(p.route("gpu0", "gpu71")) == "nvlink"
    assert p.route_kind(p.route("gpu0", "gpu72")) == "net"  # the next rack: the NIC
    assert p.link_bandwidth("gpu0->nvsw0") == pytest.approx(900e9 * 0.85)
    assert p.link_bandwidth("gpu0->leaf0r0") == pytest.approx(50e9 * 0.92)
    assert p.node_of[71] == 0 and p.node_of[72] == 1


def test_dgx_b200_nodes_are_8_gpus_on_nvlink_5() -> None:
    p = build_platform(16, topology_file="dgx-b200-superpod")
    assert p.route("gpu0", "gpu7") == ("gpu0->nvsw0", "nvsw0->gpu7")
    assert p.route("gpu0", "gpu8") == ("gpu0->leaf0r0", "leaf0r0->gpu8")
    assert p.link_bandwidth("gpu0->nvsw0") == pytest.approx(900e9 * 0.85)


def test_part_of_one_node_and_whole_nodes_beyond_it() -> None:
    p = build_platform(4, topology_file="dgx-h100-superpod")
    assert p.route("gpu0", "gpu3") == ("gpu0->nvsw0", "nvsw0->gpu3")
    with pytest.raises(ConfigError, match="not a whole number of nodes of 72 GPUs"):
        build_platform(100, topology_file="gb200-nvl72")
