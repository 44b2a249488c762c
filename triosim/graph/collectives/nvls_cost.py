"""Closed form of the ``nvls`` algorithm: NCCL's NVLS, collectives reduced and multicast inside
an NVLink switch that offers SHARP (NVLink SHARP: the third-generation NVSwitch of DGX/HGX
H100 and H200, the NVLink 5 switches of DGX B200 and GB200 NVL72; not the A100's NVSwitch).

It runs where every GPU of the group is linked to one such switch (a topology file's
``nvlink: {sharp: true}``; :func:`~triosim.graph.collectives.groups.sharp_switch`), under the
Simple protocol only, for all-reduce, reduce-scatter and all-gather. With S the payload (the
full buffer; reduce-scatter's input, all-gather's output) and N GPUs, per GPU and direction:

- reduce-scatter: each GPU loads its 1/N slice through the switch with ``multimem.ld_reduce``:
  the switch reads that slice from all N GPUs and returns the sum. Every slice of a GPU's
  buffer is read once, so its link to the switch carries S out and S/N in.
- all-gather: each GPU stores its slice to the multicast address (``multimem.st``); the switch
  writes it to all N GPUs: S/N out, S in.
- all-reduce: both, pipelined in one pass (NCCL: "AllReduce pipelines two operations"):
  S(1 + 1/N) each way, so it takes ``S(1 + 1/N)/B`` (B: the GPU↔switch rate NVLS reaches),
  against the ring's ``2(N − 1)/N · S/B``.

Each is one phase of one latency step: NCCL's NVLS latency is its NVLink hardware latency alone
(25 µs, base latency 0). B is the switch's ``sharp_efficiency`` of the nominal NVLink rate,
applied as a payload share (:func:`~triosim.graph.collectives.protocols.nvls_share`) on links
that run at the ring's efficiency.

Sources (NVIDIA/nccl, 2.30): ``src/device/all_reduce.h`` (``runRing`` moves point-to-point
chunks; the NVLS all-reduce's reduce warps read and write through the multicast address,
``ProtoSimple<…, MultimemSrcs = 1, MultimemDsts = 1>``, i.e. ``multimem.ld_reduce`` then
``multimem.st``, each GPU on its own slice ``headRank``), ``src/transport/nvls.cc`` (NVLS runs
where the device reports ``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`` and ≥ 2 GPUs share the
switch), ``src/graph/tuning.cc`` (NVLS Simple only; for all-reduce, reduce-scatter and
all-gather, inside one node unless CollNet; all-reduce bandwidth doubled for the pipelined
pass; ``nvlsEfficiency`` 0.85 on Hopper, 0.74 on Blackwell; latency
``hwLat[NVLINK][NVLS][SIMPLE]`` = 25 µs, ``baseLat`` 0). nccl-tests report an NVLS all-reduce's
bus bandwidth as algbw · 2(N−1)/N while the links carry algbw · (N+1)/N (NVIDIA/nccl-tests
issue 212, pull request 239).
"""

from __future__ import annotations

from ...hardware.platform import Platform, gpu_node, link_name
from .groups import sharp_switch
from .phases import Phase
from .protocols import protocol, route_latency, step_latency_s

OPS = ("all_reduce", "reduce_scatter", "all_gather")
# Bytes per GPU as multiples of (S, S/N): (out to the switch, in from the switch).
_LOAD = {
    "reduce_scatter": ((1, 0), (0, 1)),
    "all_gather": ((0, 1), (1, 0)),
    "all_reduce": ((1, 1), (1, 1)),
}


def nvls_supported(platform: Platform, group: tuple[int, ...], op: str) -> bool:
    """Whether NVLS can run ``op`` on ``group``: the operation is one NVLS has, the protocol is
    Simple, and every GPU hangs off one SHARP switch."""
    return op in OPS and protocol(platform) == "simple" and len(group) > 1 and \
        sharp_switch(platform, group) is not None


def nvls_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float) -> list[Phase]:
    """NVLS as one phase: the bytes of every GPU↔switch link (module docstring), one step of
    the switch route's latency plus NCCL's NVLS λ."""
    switch = sharp_switch(platform, group)
    n = len(group)
    (out_s, out_n), (in_s, in_n) = _LOAD[op]
    out_b = out_s * nbytes + out_n * nbytes / n
    in_b = in_s * nbytes + in_n * nbytes / n
    load: dict[str, float] = {}
    lat = 0.0
    for g in group:
        up, down = link_name(gpu_node(g), switch), link_name(switch, gpu_node(g))
        load[up] = out_b
        load[down] = in_b
        route = (up, down)
        lat = max(lat, route_latency(platform, route) + step_latency_s(platform, "nvls", route))
    return [Phase(f"nvls {op}", 1, lat, load)]
