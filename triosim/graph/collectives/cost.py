"""Closed-form cost of a collective on a group's own links, per algorithm, and NCCL-style choice.

A collective is planned as a sequence of **phases**. A phase has a number of latency-carrying
steps on its critical path, a per-step latency (the slowest route's link latency plus the
collective's per-step latency λ), and the bytes every directed link carries during the phase.
Its time is ``steps · step_latency + max over links (bytes / bandwidth)``: the links of a phase
work in parallel and the busiest one, relative to its bandwidth, sets the pace. A collective's
time is its per-call latency plus the sum of its phases. This is the fluid (max-min) limit the
flow network model reaches, and for link-disjoint symmetric channels it is exactly what the
expanded task DAG gives under either network model.

Algorithms (``algo``):

- ``one-way-ring``: the original: one ring in the group's order, N chunks; kept bit for bit.
- ``ring``: the rings the topology offers (``Platform.channel_style``): both directions of a
  ring, one ring per stride of a fully connected group, one ring per NIC rail of a cluster.
  The payload is split evenly over the channels.
- ``direct``: every GPU sends its share straight to every peer in one step per phase
  (reduce-scatter, all-gather, all-to-all; all-reduce = both; broadcast = scatter + all-gather).
- ``hierarchical``: node-structured groups: reduce-scatter inside each node, all-reduce of 1/L
  across nodes over each local rank's rail, all-gather inside each node (L GPUs per node).
- ``tree``: NCCL's double binary tree for all-reduce: two binary trees, each carrying half the
  payload in chunks, reduce up and broadcast down, pipelined (:mod:`triosim.graph.collectives.double_tree`;
  its time is the longest path of that pipeline). Other operations fall back to ``ring``.

Latency: with ``Platform.collective_latency_us`` None, NCCL's published constants for its
Simple protocol (``src/graph/tuning.cc``, NCCL 2.18): a per-call base latency (ring 8.4 µs,
tree 0) and a per-step hardware latency by link kind (ring: NVLink 3.4 µs, PCIe 5.7 µs,
network 14 µs; tree: 28 µs on all kinds). A number instead is λ per step for every algorithm,
with no per-call latency; 0 turns the model off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...hardware.platform import Platform, gpu_node
from . import double_tree

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")
ALGOS = ("ring", "one-way-ring", "tree", "hierarchical", "direct")
# NCCL 2.18 src/graph/tuning.cc (µs): baseLat and hwLat, Simple protocol.
NCCL_BASE_LATENCY_US = {"ring": 8.4, "tree": 0.0}
NCCL_STEP_LATENCY_US = {
    ("ring", "nvlink"): 3.4, ("ring", "pcie"): 5.7, ("ring", "net"): 14.0,
    ("tree", "nvlink"): 28.0, ("tree", "pcie"): 28.0, ("tree", "net"): 28.0,
}
# The same for the LL and LL128 protocols.
NCCL_PROTOCOL_BASE_LATENCY_US = {
    "ll": {"ring": 6.6, "tree": 6.8}, "ll128": {"ring": 14.0, "tree": 14.0}, "simple": NCCL_BASE_LATENCY_US,
}
NCCL_PROTOCOL_STEP_LATENCY_US = {
    "ll": {("ring", "nvlink"): 0.6, ("ring", "pcie"): 1.0, ("ring", "net"): 2.7,
           ("tree", "nvlink"): 0.6, ("tree", "pcie"): 1.0, ("tree", "net"): 5.0},
    "ll128": {("ring", "nvlink"): 1.9, ("ring", "pcie"): 2.5, ("ring", "net"): 4.0,
              ("tree", "nvlink"): 1.25, ("tree", "pcie"): 1.9, ("tree", "net"): 8.5},
    "simple": NCCL_STEP_LATENCY_US,
}
# "auto" tries the protocols in this order; a tie keeps the earlier one.
PROTOCOL_ORDER = ("simple", "ll128", "ll")
# A pipelined ring broadcast cuts the payload into at least this many chunks, so it takes
# ≈ S/W (k + N − 2 chunk times of S/k), as NCCL's chunked broadcast does.
BROADCAST_CHUNKS = 64


@dataclass(frozen=True)
class Phase:
    """Part of a collective whose links work in parallel (see the module docstring)."""

    name: str
    steps: int
    step_latency: float
    link_load: dict[str, float]
    base_latency: float = 0.0
    # A pipelined chain of k chunks over h hops needs k + h − 1 chunk times for k chunks of
    # bytes: its links are busy only k / (k + h − 1) of the phase.
    fill: float = 1.0
    # A pipelined schedule whose time is its plan's longest path (the tree), not the formula.
    fixed_seconds: float | None = None

    def seconds(self, platform: Platform) -> float:
        if self.fixed_seconds is not None:
            return self.base_latency + self.fixed_seconds
        return self.base_latency + self.steps * self.step_latency + self.bandwidth_seconds(platform)

    def bandwidth_seconds(self, platform: Platform) -> float:
        busiest = max((b / platform.link_bandwidth(name) for name, b in self.link_load.items()), default=0.0)
        return busiest * self.fill

    def latency_seconds(self) -> float:
        return self.base_latency + self.steps * self.step_latency


@dataclass(frozen=True)
class CollectiveCost:
    """The closed-form time of one collective and the bytes it puts on each directed link."""

    op: str
    algo: str
    group: tuple[int, ...]
    nbytes: int
    seconds: float
    latency_seconds: float
    link_bytes: dict[str, float] = field(default_factory=dict)  # what the links carry (protocol bytes)
    phases: tuple[Phase, ...] = ()
    protocol: str = "simple"

    @property
    def algbw(self) -> float:
        """nccl-tests' algorithm bandwidth S / t (B/s)."""
        return self.nbytes / self.seconds if self.seconds > 0 else math.inf

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth: algbw · 2(N−1)/N for all-reduce, · (N−1)/N for the others."""
        n = len(self.group)
        factor = {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(self.op, (n - 1) / n)
        return self.algbw * factor


# ----------------------------------------------------------------------------- latency


def protocol(platform: Platform) -> str:
    """The platform's protocol, ``simple`` for ``auto`` (resolved per collective by :func:`resolve`)."""
    p = platform.collective_protocol
    return "simple" if p == "auto" else p


def step_latency_s(platform: Platform, family: str, route: tuple[str, ...]) -> float:
    """λ for one step of ``family`` ("ring" or "tree") over ``route``."""
    lat = platform.collective_latency_us
    if lat is not None:
        return lat * 1e-6
    return NCCL_PROTOCOL_STEP_LATENCY_US[protocol(platform)][(family, platform.route_kind(route))] * 1e-6


def base_latency_s(platform: Platform, family: str) -> float:
    if platform.collective_latency_us is not None:
        return 0.0
    return NCCL_PROTOCOL_BASE_LATENCY_US[protocol(platform)][family] * 1e-6


def protocol_efficiency(platform: Platform, algo: str, group: tuple[int, ...], op: str) -> float:
    """The share of a link's bandwidth that carries payload under the platform's protocol.

    NCCL's tuner (``src/graph/tuning.cc``): Simple 1; LL (8-byte lines of 4 data bytes and a
    flag, and slower polling) 1/4 on rings for all-reduce or across nodes, else 1/3, and 1/3.8
    on trees; LL128 (120 data bytes per 128-byte line) 0.92 on rings, 0.7 when each node has
    one GPU of the group, and on trees 120/128 across nodes, 7/9 inside one.
    """
    proto = protocol(platform)
    if proto == "simple":
        return 1.0
    nodes = node_groups(platform, group)
    multi_node = nodes is not None and len(nodes) > 1
    tree = algo == "tree"
    if proto == "ll":
        return 1 / 3.8 if tree else (1 / 4 if multi_node or op == "all_reduce" else 1 / 3)
    if tree:
        return 120 / 128 if multi_node else 7 / 9
    return 0.7 if nodes is not None and all(len(x) == 1 for x in nodes) and multi_node else 0.92


def wire_bytes(platform: Platform, algo: str, group: tuple[int, ...], op: str, nbytes: float) -> int:
    """The bytes a collective of ``nbytes`` payload puts through its links under the protocol:
    the payload divided by :func:`protocol_efficiency`, rounded up to whole bytes."""
    eff = protocol_efficiency(platform, algo, group, op)
    return int(nbytes) if eff == 1.0 else math.ceil(nbytes / eff)


def route_latency(platform: Platform, route: tuple[str, ...]) -> float:
    return sum(platform.link(name)["latency"] for name in route)


# ----------------------------------------------------------------------------- group shapes


def check_group(platform: Platform, group: Sequence[int]) -> tuple[int, ...]:
    order = tuple(int(g) for g in group)
    if len(set(order)) != len(order):
        raise ValueError(f"collective group has repeated GPUs: {order}")
    for g in order:
        if not 0 <= g < platform.num_gpus:
            raise ValueError(f"GPU {g} is not on the platform ({platform.num_gpus} GPUs)")
    return order


def node_groups(platform: Platform, group: tuple[int, ...]) -> list[list[int]] | None:
    """The group split by node (in order of first appearance), or None if the platform is flat."""
    if platform.node_of is None:
        return None
    nodes: dict[int, list[int]] = {}
    for g in group:
        nodes.setdefault(platform.node_of[g], []).append(g)
    return list(nodes.values())


def ring_orders(platform: Platform, group: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The channels (ring orders) the ``ring`` algorithm uses for ``group``."""
    n = len(group)
    style = platform.channel_style
    if n < 3 or style == "single":
        return [group]
    if style == "bidirectional":
        return [group, group[::-1]]
    if style == "strides":
        return [tuple(group[(i * k) % n] for i in range(n)) for k in range(1, n) if math.gcd(k, n) == 1]
    nodes = node_groups(platform, group)
    if nodes is None or len(nodes) < 2 or len({len(x) for x in nodes}) != 1 or len(nodes[0]) < 2:
        return [tuple(g for x in (nodes or [list(group)]) for g in x)]
    per = len(nodes[0])
    # Channel c enters every node at local rank c+1 and leaves it from local rank c, so each
    # GPU's NIC carries exactly one channel in each direction.
    return [tuple(x[(c + 1 + k) % per] for x in nodes for k in range(per)) for c in range(per)]


def tree_edges(order: tuple[int, ...]) -> list[list[tuple[int, int]]]:
    """NCCL-style double binary tree: (child, parent) edges of two trees over ``order``.

    Tree 1 is the heap-ordered binary tree over positions (parent of i is (i−1)//2); tree 2 is
    the same over the reversed order, so the leaves of one are mostly inner nodes of the other.
    """
    n = len(order)
    trees = []
    for seq in (order, order[::-1]):
        trees.append([(seq[i], seq[(i - 1) // 2]) for i in range(1, n)])
    return trees


# ----------------------------------------------------------------------------- plans


def _add_load(load: dict[str, float], route: tuple[str, ...], nbytes: float) -> None:
    for name in route:
        load[name] = load.get(name, 0.0) + nbytes


def _ring_phase(platform: Platform, orders: list[tuple[int, ...]], nbytes: float, steps: int, name: str,
                chunks_per_channel: int | None = None, hops: list[list[int]] | None = None) -> Phase:
    """``steps`` ring steps on every channel; each step a hop carries its channel's chunk.

    With ``hops`` (a chain broadcast) each hop carries all ``chunks_per_channel`` chunks once.
    """
    n = len(orders[0])
    share = nbytes / len(orders)
    k = chunks_per_channel or n
    load: dict[str, float] = {}
    lat = 0.0
    per_hop = share if hops is not None else steps * share / k
    for ci, order in enumerate(orders):
        idx = hops[ci] if hops is not None else range(n)
        for i in idx:
            route = platform.route(gpu_node(order[i]), gpu_node(order[(i + 1) % n]))
            _add_load(load, route, per_hop)
            lat = max(lat, route_latency(platform, route) + step_latency_s(platform, "ring", route))
    return Phase(name, steps, lat, load, fill=steps / k if hops is not None else 1.0)


def direct_peers(pairs: list[tuple[int, int]]) -> int:
    """The most sends one GPU posts in a direct round: each pays the per-step latency λ."""
    count: dict[int, int] = {}
    for s, _d in pairs:
        count[s] = count.get(s, 0) + 1
    return max(count.values(), default=0)


def _pairs_phase(platform: Platform, pairs: list[tuple[int, int]], chunk: float, name: str) -> Phase:
    """One direct round: all transfers at once; a GPU's sends to its peers are posted one after
    another, so the round's latency is α + (peers)·λ (NCCL's point-to-point operations)."""
    load: dict[str, float] = {}
    lat = 0.0
    peers = direct_peers(pairs)
    for s, d in pairs:
        route = platform.route(gpu_node(s), gpu_node(d))
        _add_load(load, route, chunk)
        lat = max(lat, route_latency(platform, route) + peers * step_latency_s(platform, "ring", route))
    return Phase(name, 1 if pairs else 0, lat, load)


def _merge(phases: list[Phase], name: str) -> Phase:
    """Concurrent phases of the same shape on disjoint groups, as one phase."""
    load: dict[str, float] = {}
    for ph in phases:
        for link, b in ph.link_load.items():
            load[link] = load.get(link, 0.0) + b
    return Phase(name, max(p.steps for p in phases), max(p.step_latency for p in phases), load,
                 fill=max(p.fill for p in phases))


def one_way_ring_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float,
                        root: int | None = None) -> list[Phase]:
    n = len(group)
    if op == "broadcast":
        r = group.index(group[0] if root is None else root)
        return [_ring_phase(platform, [group], nbytes, 2 * (n - 1), "chain",
                            hops=[[(r + p) % n for p in range(n - 1)]])]
    steps = {"all_reduce": 2 * (n - 1)}.get(op, n - 1)
    return [_ring_phase(platform, [group], nbytes, steps, "ring")]


def ring_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float,
                root: int | None = None) -> list[Phase]:
    n = len(group)
    orders = ring_orders(platform, group)
    if op == "broadcast":
        k = max(n, BROADCAST_CHUNKS)
        r = group[0] if root is None else root
        hops = [[(o.index(r) + p) % n for p in range(n - 1)] for o in orders]
        return [_ring_phase(platform, orders, nbytes, k + n - 2, "chain", chunks_per_channel=k, hops=hops)]
    if op == "all_reduce":
        return [_ring_phase(platform, orders, nbytes, n - 1, "rs"), _ring_phase(platform, orders, nbytes, n - 1, "ag")]
    return [_ring_phase(platform, orders, nbytes, n - 1, op)]


def direct_pairs(group: tuple[int, ...], op: str, root: int | None = None) -> list[list[tuple[int, int]]]:
    """The (src, dst) transfers of each direct phase; every transfer carries S/N."""
    allpairs = [(s, d) for s in group for d in group if s != d]
    if op == "all_reduce":
        return [allpairs, allpairs]
    if op == "broadcast":
        r = group[0] if root is None else root
        return [[(r, d) for d in group if d != r], [(s, d) for s, d in allpairs if d != r]]
    return [allpairs]


def direct_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float,
                  root: int | None = None) -> list[Phase]:
    n = len(group)
    names = {"all_reduce": ["rs", "ag"], "broadcast": ["scatter", "ag"]}.get(op, [op])
    return [_pairs_phase(platform, pairs, nbytes / n, nm)
            for pairs, nm in zip(direct_pairs(group, op, root), names)]


def tree_link_load(platform: Platform, group: tuple[int, ...], nbytes: float) -> dict[str, float]:
    """Bytes per directed link of a double binary tree all-reduce: every edge carries S/2 up and S/2 down."""
    load: dict[str, float] = {}
    for edges in tree_edges(group):
        for child, parent in edges:
            _add_load(load, platform.route(gpu_node(child), gpu_node(parent)), nbytes / 2)
            _add_load(load, platform.route(gpu_node(parent), gpu_node(child)), nbytes / 2)
    return load


def tree_plan(platform: Platform, group: tuple[int, ...], nbytes: float) -> double_tree.TreePlan:
    """The pipelined transfers of the tree all-reduce (the expanded form's tasks)."""
    return double_tree.build_plan(platform, group, nbytes, lambda route: step_latency_s(platform, "tree", route),
                                  base_latency_s(platform, "tree"))


def tree_seconds(platform: Platform, group: tuple[int, ...], nbytes: float) -> float:
    """The tree all-reduce's time alone: the longest path of its pipeline.

    Not linear in the payload (the chunk count and the critical path change with it), so it is
    kept per payload size rather than scaled from one byte.
    """
    key = ("tree", group, float(nbytes), platform.collective_latency_us)
    hit = platform._plans.get(key)
    if hit is None:
        hit = platform._plans[key] = double_tree.plan_seconds(
            platform, group, nbytes, lambda route: step_latency_s(platform, "tree", route),
            base_latency_s(platform, "tree"))
    return hit


def tree_phases(platform: Platform, group: tuple[int, ...], nbytes: float) -> list[Phase]:
    """Double binary tree all-reduce as one phase: its links' bytes and its pipeline's time.

    The phase's latency is what the time has beyond its busiest link's bytes, so a macro task
    under the flow model moves those bytes at the busiest link's full bandwidth when alone.
    """
    seconds = tree_seconds(platform, group, nbytes)
    load = tree_link_load(platform, group, nbytes)
    busiest = max((b / platform.link_bandwidth(name) for name, b in load.items()), default=0.0)
    return [Phase("tree", 1, max(0.0, seconds - busiest), load, fixed_seconds=seconds)]


def hierarchical_split(platform: Platform, group: tuple[int, ...]) -> tuple[list[list[int]], list[list[int]]] | None:
    """(node groups, rail groups) when the group spans ≥ 2 nodes with the same ≥ 2 GPUs each."""
    nodes = node_groups(platform, group)
    if nodes is None or len(nodes) < 2 or len({len(x) for x in nodes}) != 1 or len(nodes[0]) < 2:
        return None
    rails = [[x[i] for x in nodes] for i in range(len(nodes[0]))]
    return nodes, rails


def sub_root(nodes: list[list[int]], root: int, sub_group: Sequence[int]) -> int:
    """A broadcast's root inside one sub-group: the root itself, or the GPU on the root's rail."""
    if root in sub_group:
        return root
    local = next(x.index(root) for x in nodes if root in x)
    return next(x[local] for x in nodes if x[local] in sub_group)


def hierarchical_steps(op: str) -> list[tuple[str, str, bool]]:
    """(sub-operation, level, payload divided by L) of each hierarchical phase."""
    return {
        "all_reduce": [("reduce_scatter", "node", False), ("all_reduce", "rail", True),
                       ("all_gather", "node", False)],
        "reduce_scatter": [("reduce_scatter", "node", False), ("reduce_scatter", "rail", True)],
        "all_gather": [("all_gather", "rail", True), ("all_gather", "node", False)],
        "broadcast": [("broadcast", "rail", False), ("broadcast", "node", False)],
    }[op]


def hierarchical_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float,
                        root: int | None = None) -> list[Phase]:
    split = hierarchical_split(platform, group)
    assert split is not None
    nodes, rails = split
    per = len(nodes[0])
    r = group[0] if root is None else root
    out = []
    for sub, level, divided in hierarchical_steps(op):
        groups = nodes if level == "node" else rails
        if op == "broadcast" and level == "rail":
            groups = [g for g in rails if r in g]
        size = nbytes / per if divided else nbytes
        parts = []
        for g in groups:
            parts.extend(ring_phases(platform, tuple(g), sub, size,
                                     sub_root(nodes, r, g) if sub == "broadcast" else None))
        if sub == "all_reduce":  # two ring phases per group: merge rs with rs and ag with ag
            out.append(_merge(parts[0::2], f"{level} rs"))
            out.append(_merge(parts[1::2], f"{level} ag"))
        else:
            out.append(_merge(parts, f"{level} {sub}"))
    return out


# ----------------------------------------------------------------------------- choice


def supported(platform: Platform, group: tuple[int, ...], op: str, algo: str) -> bool:
    if op == "all_to_all":
        return algo == "direct"
    if algo == "tree":
        return op == "all_reduce"
    if algo == "hierarchical":
        return hierarchical_split(platform, group) is not None
    return algo in ALGOS


def fallback(platform: Platform, group: tuple[int, ...], op: str, algo: str) -> str:
    """The algorithm actually run when ``algo`` cannot run ``op`` on this group."""
    if supported(platform, group, op, algo):
        return algo
    return "direct" if op == "all_to_all" else "ring"


# "auto" leaves out the direct algorithm above this group size: its plan has N² transfers.
DIRECT_AUTO_LIMIT = 64


def _build_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str,
                  root: int | None) -> list[Phase]:
    if algo == "one-way-ring":
        return one_way_ring_phases(platform, group, op, nbytes, root)
    if algo == "ring":
        return ring_phases(platform, group, op, nbytes, root)
    if algo == "direct":
        return direct_phases(platform, group, op, nbytes, root)
    return hierarchical_phases(platform, group, op, nbytes, root)


def _unit(platform: Platform, group: tuple[int, ...], op: str, algo: str, root: int | None,
          ) -> tuple[list[Phase], list[tuple[float, float]]]:
    """The phases for a 1-byte payload and, per phase, (latency s, bandwidth s per byte).

    Every plan is linear in the payload, so it is computed once per group, operation,
    algorithm and root and scaled (a DDP run calls the same collective once per bucket).
    """
    key = (group, op, algo, root, platform.collective_latency_us)
    hit = platform._plans.get(key)
    if hit is None:
        phases = _build_phases(platform, group, op, 1.0, algo, root)
        hit = (phases, [(p.latency_seconds(), p.bandwidth_seconds(platform)) for p in phases])
        platform._plans[key] = hit
    return hit


def plan(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str,
         root: int | None = None) -> list[Phase]:
    """The phases of ``op`` with ``algo`` (already resolved and supported); base latency on the first."""
    if algo == "tree":  # its pipeline's time is not linear in the payload; no per-call latency
        return tree_phases(platform, group, nbytes)
    unit, _times = _unit(platform, group, op, algo, root)
    phases = [Phase(p.name, p.steps, p.step_latency, {k: v * nbytes for k, v in p.link_load.items()}, 0.0, p.fill)
              for p in unit]
    base = base_latency_s(platform, "tree" if algo == "tree" else "ring")
    if phases and base:
        first = phases[0]
        phases[0] = Phase(first.name, first.steps, first.step_latency, first.link_load, base, first.fill)
    return phases


def plan_seconds(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str,
                 root: int | None = None) -> float:
    """``sum(p.seconds(platform) for p in plan(...))`` without building the scaled phases."""
    if algo == "tree":
        return tree_seconds(platform, group, nbytes)
    _unit_phases, times = _unit(platform, group, op, algo, root)
    base = base_latency_s(platform, "tree" if algo == "tree" else "ring") if times else 0.0
    return base + sum(lat + nbytes * per_byte for lat, per_byte in times)


def candidates(platform: Platform, group: tuple[int, ...], op: str) -> list[str]:
    out = [a for a in ("ring", "tree", "hierarchical", "direct") if supported(platform, group, op, a)]
    if len(group) > DIRECT_AUTO_LIMIT and op != "all_to_all":
        out = [a for a in out if a != "direct"]
    return out


def resolve_algo(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str | None = None,
                 root: int | None = None) -> str:
    """``algo`` (default: the platform's) made concrete: ``auto`` picks the fastest closed form
    under the platform's protocol (``nbytes``: the payload)."""
    return _resolve_algo(platform, group, op, nbytes, algo, root)[0]


def _resolve_algo(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str | None,
                  root: int | None) -> tuple[str, float | None]:
    """(algorithm, its time when ``auto`` computed it)."""
    algo = platform.collective_algo if algo is None else algo
    if algo == "auto":
        best = None
        for a in candidates(platform, group, op):
            t = plan_seconds(platform, group, op, wire_bytes(platform, a, group, op, nbytes), a, root)
            if best is None or t < best[0] * (1 - 1e-12):  # ties keep the earlier (simpler) algorithm
                best = (t, a)
        return (best[1], best[0]) if best else ("ring", None)
    if algo not in ALGOS:
        raise ValueError(f"unknown collective algorithm {algo!r}; choose from auto, {', '.join(ALGOS)}")
    return fallback(platform, group, op, algo), None


def resolve(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str | None = None,
            root: int | None = None) -> tuple[Platform, str]:
    """(the platform with the collective's protocol, the algorithm): with the protocol ``auto``,
    the fastest (protocol, algorithm) pair by the closed forms, as NCCL's tuner picks both."""
    if platform.collective_protocol != "auto":
        return platform, resolve_algo(platform, group, op, nbytes, algo, root)
    best = None
    for proto in PROTOCOL_ORDER:
        variant = platform.protocol_variant(proto)
        a, t = _resolve_algo(variant, group, op, nbytes, algo, root)
        if t is None:
            t = plan_seconds(variant, group, op, wire_bytes(variant, a, group, op, nbytes), a, root)
        if best is None or t < best[0] * (1 - 1e-12):
            best = (t, variant, a)
    return best[1], best[2]


def collective_cost(platform: Platform, group: Sequence[int], op: str, nbytes: float, algo: str = "auto",
                    root: int | None = None) -> CollectiveCost:
    """Closed-form time of ``op`` of ``nbytes`` over ``group`` with ``algo`` on the group's own links,
    under the platform's protocol (``auto``: the fastest protocol too).

    ``nbytes``: the full buffer (all-reduce, broadcast; reduce-scatter's input; all-gather's
    output; all-to-all: each GPU's whole send buffer). ``algo="auto"`` picks the fastest.
    """
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; choose from {', '.join(OPS)}")
    order = check_group(platform, group)
    if len(order) < 2:
        return CollectiveCost(op, "none", order, int(nbytes), 0.0, 0.0)
    platform, chosen = resolve(platform, order, op, nbytes, algo, root)
    payload = nbytes
    nbytes = wire_bytes(platform, chosen, order, op, nbytes)
    phases = plan(platform, order, op, nbytes, chosen, root)
    link_bytes: dict[str, float] = {}
    for ph in phases:
        for name, b in ph.link_load.items():
            link_bytes[name] = link_bytes.get(name, 0.0) + b
    if chosen == "one-way-ring":
        seconds = one_way_ring_seconds(platform, order, op, nbytes, root)
    else:
        seconds = plan_seconds(platform, order, op, nbytes, chosen, root)
    return CollectiveCost(op, chosen, order, int(payload), seconds, sum(p.latency_seconds() for p in phases),
                          link_bytes, tuple(phases), protocol(platform))


def one_way_ring_seconds(platform: Platform, group: tuple[int, ...], op: str, nbytes: float,
                         root: int | None = None) -> float:
    """The original ring's closed form, bit for bit: steps × the slowest hop's time for S/N."""
    n = len(group)
    hops = list(range(n))
    if op == "broadcast":
        r = group.index(group[0] if root is None else root)
        hops = [(r + p) % n for p in range(n - 1)]
    steps = {"all_reduce": 2 * (n - 1), "broadcast": 2 * (n - 1)}.get(op, n - 1)
    best = -1.0
    for i in hops:
        route = platform.route(gpu_node(group[i]), gpu_node(group[(i + 1) % n]))
        lat = route_latency(platform, route) + step_latency_s(platform, "ring", route)
        bw = min(platform.link_bandwidth(x) for x in route)
        # The same arithmetic as the original's macro step, so numbers stay bit for bit.
        t = lat + nbytes / (n * bw)
        if t > best:
            best = t
    return base_latency_s(platform, "ring") + steps * best


__all__ = [
    "ALGOS", "BROADCAST_CHUNKS", "NCCL_BASE_LATENCY_US", "NCCL_STEP_LATENCY_US", "OPS", "PROTOCOL_ORDER",
    "CollectiveCost", "Phase", "collective_cost", "protocol_efficiency", "resolve", "resolve_algo", "ring_orders",
    "tree_edges", "wire_bytes",
]
