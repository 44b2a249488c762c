"""Closed form of the ``direct`` algorithm: every GPU sends its share straight to every peer.

One round per phase: reduce-scatter, all-gather and all-to-all are one round each, all-reduce
is both, broadcast is a scatter from the root then an all-gather. Every transfer carries S/N.
A GPU posts its sends to its peers one after another (NCCL's point-to-point operations), so a
round's latency is α + (peers)·λ, on the round's slowest route.

A round of N GPUs has N(N − 1) transfers. Routing each (and keeping every route) cost O(N²)
memory, O(N³) on a ring where a route has up to N/2 links: a 1,024-GPU ring took gigabytes. On
the built-in ``ring``, ``switch`` and ``nvlink-cluster`` with links of one kind and latency, a
round's bytes per link and its latency are counted instead (:func:`_ring_round`,
:func:`_star_round`): per source, its destinations as an array, the links each route covers
summed with a difference array (ring) or counted per switch (star) — the same links, counts and
slowest route as routing every pair, in O(N) memory. Other topologies route every pair.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ...hardware.platform import Platform, gpu_node, link_name
from ...hardware.ring_routes import ring_arc
from .phases import Phase, add_load
from .protocols import route_latency, step_latency_s

# A round: every member to every other ("all"), the root to every other ("from_root"), or every
# member to every other but the root ("not_to_root").
_ROUNDS = {"all_reduce": ("all", "all"), "broadcast": ("from_root", "not_to_root")}


def _round_kinds(op: str) -> tuple[str, ...]:
    return _ROUNDS.get(op, ("all",))


def _root(group: tuple[int, ...], root: int | None) -> int:
    return group[0] if root is None else root


def _destinations(group: tuple[int, ...], kind: str, root: int) -> Iterator[tuple[int, list[int]]]:
    """(source, its destinations in group order) of one round, sources in group order."""
    for s in group:
        if kind == "from_root" and s != root:
            continue
        yield s, [d for d in group if d != s and (kind != "not_to_root" or d != root)]


def direct_pairs(group: tuple[int, ...], op: str, root: int | None = None) -> list[list[tuple[int, int]]]:
    """The (src, dst) transfers of each direct phase; every transfer carries S/N."""
    r = _root(group, root)
    return [[(s, d) for s, dests in _destinations(group, kind, r) for d in dests] for kind in _round_kinds(op)]


def direct_transfers(group: tuple[int, ...], op: str) -> int:
    """How many transfers :func:`direct_pairs` holds, counted without listing them."""
    n = len(group)
    counts = {"all": n * (n - 1), "from_root": n - 1, "not_to_root": (n - 1) * (n - 1)}
    return sum(counts[kind] for kind in _round_kinds(op)) if n > 1 else 0


def direct_round_names(op: str) -> list[str]:
    """The name of each round of :func:`direct_pairs`."""
    return {"all_reduce": ["rs", "ag"], "broadcast": ["scatter", "ag"]}.get(op, [op])


def direct_peers(pairs: list[tuple[int, int]]) -> int:
    """The most sends one GPU posts in a direct round: each pays the per-step latency λ."""
    count: dict[int, int] = {}
    for s, _d in pairs:
        count[s] = count.get(s, 0) + 1
    return max(count.values(), default=0)


def _pairs_phase(platform: Platform, pairs: list[tuple[int, int]], chunk: float, name: str) -> Phase:
    """One direct round, every pair routed: all transfers at once; a GPU's sends to its peers
    are posted one after another, so the round's latency is α + (peers)·λ (NCCL's
    point-to-point operations)."""
    load: dict[str, float] = {}
    lat = 0.0
    peers = direct_peers(pairs)
    for s, d in pairs:
        route = platform.route(gpu_node(s), gpu_node(d))
        add_load(load, route, chunk)
        lat = max(lat, route_latency(platform, route) + peers * step_latency_s(platform, "ring", route))
    return Phase(name, 1 if pairs else 0, lat, load)


def _uniform(platform: Platform, names: list[str]) -> bool:
    """Whether the links ``names`` share one latency and one kind (then a route's latency and
    λ depend only on its hop count and switch: the slowest route is found by counting)."""
    seen = {(platform.link(n)["latency"], platform.link(n).get("kind", "nvlink")) for n in names}
    return len(seen) <= 1


def _round_latency(platform: Platform, examples: list[tuple[int, int]], peers: int) -> float:
    """α + peers·λ of the slowest of ``examples`` (one pair per kind of route the round has)."""
    lat = 0.0
    for s, d in examples:
        route = platform.route(gpu_node(s), gpu_node(d))
        lat = max(lat, route_latency(platform, route) + peers * step_latency_s(platform, "ring", route))
    return lat


def _ring_round(platform: Platform, group: tuple[int, ...], kind: str, root: int,
                chunk: float) -> tuple[dict[str, float], float] | None:
    """(bytes per link, latency) of one round on the built-in ring, counted (module docstring);
    None where it cannot be."""
    n = platform.num_gpus
    up_names = [link_name(gpu_node(i), gpu_node((i + 1) % n)) for i in range(n)]
    down_names = [link_name(gpu_node(i), gpu_node((i - 1) % n)) for i in range(n)]
    if not _uniform(platform, up_names + down_names):
        return None
    # Each route covers a run of consecutive links: up-links s … s + h − 1 or down-links
    # s − h + 1 … s; runs are counted on [0, 2n) with a difference array, then folded mod n.
    up_diff = np.zeros(2 * n + 1, dtype=np.int64)
    down_diff = np.zeros(2 * n + 1, dtype=np.int64)
    longest, peers = None, 0
    for s, dests in _destinations(group, kind, root):
        if not dests:
            continue
        peers = max(peers, len(dests))
        d = np.asarray(dests, dtype=np.int64)
        up = (d - s) % n
        forward = 2 * up < n
        for k in np.flatnonzero(2 * up == n):  # both arcs shortest: the platform's own choice
            forward[k] = ring_arc(n, s, int(d[k]))[0] == 1
        hops = np.where(forward, up, (s - d) % n)
        f_hops, b_hops = hops[forward], hops[~forward]
        up_diff[s] += len(f_hops)
        np.subtract.at(up_diff, s + f_hops, 1)
        np.add.at(down_diff, s - b_hops + 1 + n, 1)
        down_diff[s + n + 1] -= len(b_hops)
        far = int(np.argmax(hops))
        if longest is None or hops[far] > longest[0]:
            longest = (int(hops[far]), s, int(d[far]))
    load: dict[str, float] = {}
    for names, diff in ((up_names, up_diff), (down_names, down_diff)):
        cover = np.cumsum(diff[:2 * n])
        counts = cover[:n] + cover[n:]
        for i in np.flatnonzero(counts):
            load[names[i]] = load.get(names[i], 0.0) + int(counts[i]) * chunk
    if longest is None:
        return load, 0.0
    return load, _round_latency(platform, [longest[1:]], peers)


def _star_round(platform: Platform, group: tuple[int, ...], kind: str, root: int,
                chunk: float) -> tuple[dict[str, float], float] | None:
    """(bytes per link, latency) of one round on the built-in switch or nvlink-cluster: every
    route is GPU → its switch (the node's NVSwitch, or the network) → GPU, so a link carries one
    chunk per route through it (module docstring); None where it cannot be counted."""
    switch = platform.topology == "switch"
    node_of = platform.node_of
    if not switch and node_of is None:
        return None

    def hub(g: int, same: bool) -> str:
        return "switch" if switch else (f"nvsw{node_of[g]}" if same else "net")

    members = np.asarray(group, dtype=np.int64)
    nodes = np.zeros(len(group), dtype=np.int64) if switch else np.asarray(node_of, dtype=np.int64)[members]
    pos = {g: i for i, g in enumerate(group)}
    sent: dict[str, int] = {}
    received_same = np.zeros(len(group), dtype=np.int64)
    received_other = np.zeros(len(group), dtype=np.int64)
    examples: dict[bool, tuple[int, int]] = {}  # one pair per kind of route: inside a node or not
    peers = 0
    for s, dests in _destinations(group, kind, root):
        if not dests:
            continue
        peers = max(peers, len(dests))
        idx = np.fromiter((pos[d] for d in dests), dtype=np.int64, count=len(dests))
        same = switch | (nodes[idx] == nodes[pos[s]])
        for flag, count in ((True, int(same.sum())), (False, int((~same).sum()))):
            if count:
                name = link_name(gpu_node(s), hub(s, flag))
                sent[name] = sent.get(name, 0) + count
                examples.setdefault(flag, (s, dests[int(np.argmax(same == flag))]))
        np.add.at(received_same, idx[same], 1)
        np.add.at(received_other, idx[~same], 1)
    names = list(sent)
    load = {name: count * chunk for name, count in sent.items()}
    for flag, received in ((True, received_same), (False, received_other)):
        for i in np.flatnonzero(received):
            name = link_name(hub(group[i], flag), gpu_node(group[i]))
            names.append(name)
            load[name] = load.get(name, 0.0) + int(received[i]) * chunk
    by_kind = {flag: [n for n in names if (("net" not in n) == flag or switch)] for flag in (True, False)}
    if not all(_uniform(platform, links) for links in by_kind.values()):
        return None
    return load, _round_latency(platform, list(examples.values()), peers)


def _counted_round(platform: Platform, group: tuple[int, ...], kind: str, root: int,
                   chunk: float) -> tuple[dict[str, float], float] | None:
    if platform.router is not None or len(group) < 2:
        return None
    if platform.topology == "ring" and platform.num_gpus > 1:
        return _ring_round(platform, group, kind, root, chunk)
    if platform.topology in ("switch", "nvlink-cluster"):
        return _star_round(platform, group, kind, root, chunk)
    return None


def direct_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float,
                  root: int | None = None) -> list[Phase]:
    """The direct algorithm as phases, one per round (counted where the topology allows, else
    every pair routed: the same phases)."""
    n = len(group)
    r = _root(group, root)
    out = []
    for kind, name in zip(_round_kinds(op), direct_round_names(op)):
        counted = _counted_round(platform, group, kind, r, nbytes / n)
        if counted is None:
            pairs = [(s, d) for s, dests in _destinations(group, kind, r) for d in dests]
            out.append(_pairs_phase(platform, pairs, nbytes / n, name))
        else:
            load, lat = counted
            out.append(Phase(name, 1 if load else 0, lat, load))
    return out
