"""GPU-to-GPU routes on star-like topologies, in closed form.

On ``switch`` every GPU reaches every other through the one switch; on ``nvlink-cluster``
through its node's NVSwitch when both GPUs share a node, else through the cluster network (each
GPU's own NIC). These are exactly the shortest paths the platform would search for; knowing them
avoids a graph search per pair, which over 10^4 GPUs costs longer than the whole simulation.
:func:`prime_routes` puts them in the platform's route cache; other topologies are left to the
platform's own search.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...hardware.platform import Platform, gpu_node, link_name


def star_route(platform: Platform, a: int, b: int) -> tuple[str, ...] | None:
    """The route from GPU ``a`` to GPU ``b`` when the topology has a closed form, else None."""
    if a == b:
        return ()
    src, dst = gpu_node(a), gpu_node(b)
    if platform.topology == "switch":
        hub = "switch"
    elif platform.topology == "nvlink-cluster":
        hub = _nvswitch_of(platform, src)
        if hub is None or hub != _nvswitch_of(platform, dst):
            hub = "net"
    else:
        return None
    if hub is None:
        return None
    return (link_name(src, hub), link_name(hub, dst))


def _nvswitch_of(platform: Platform, gpu: str) -> str | None:
    for nb in platform.graph.successors(gpu):
        if nb.startswith("nvsw"):
            return nb
    return None


def prime_routes(platform: Platform, pairs: Iterable[tuple[int, int]]) -> None:
    """Fill the platform's route cache for ``pairs`` of GPUs where the route is known in closed form.

    Where :meth:`~triosim.hardware.platform.Platform.route` finds the same route in closed form
    itself (``switch``; ``nvlink-cluster`` knowing each GPU's node) nothing is filled: a route is
    then found when asked for, and priming every pair of a group of N GPUs only held N² routes
    (1.6 GB for one group of 2,048) that the ring and tree algorithms never ask for."""
    if platform.topology not in ("switch", "nvlink-cluster") or platform.router is not None:
        return
    if platform.topology == "switch" or platform.node_of is not None:
        return
    cache = platform._routes  # the platform's own memo of route(); same keys, same values
    hubs: dict[int, str | None] = {}  # GPU -> its NVSwitch, looked up once per call
    switch = platform.topology == "switch"
    for a, b in pairs:
        src, dst = gpu_node(a), gpu_node(b)
        key = (src, dst)
        if key in cache:
            continue
        if a == b:
            cache[key] = ()
            continue
        if switch:
            hub = "switch"
        else:
            ha = hubs[a] if a in hubs else hubs.setdefault(a, _nvswitch_of(platform, src))
            hb = hubs[b] if b in hubs else hubs.setdefault(b, _nvswitch_of(platform, dst))
            hub = ha if ha is not None and ha == hb else "net"
        cache[key] = (link_name(src, hub), link_name(hub, dst))
