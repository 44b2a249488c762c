"""Collective communication over a group of GPUs: all-reduce, reduce-scatter, all-gather,
broadcast and all-to-all, as task-DAG fragments, with the algorithms of
:mod:`triosim.graph.collectives.cost` (one-way ring, multi-channel ring, direct, hierarchical,
double binary tree; ``algo="auto"`` picks the fastest closed form, as NCCL's tuner does).

What follows describes the ``one-way-ring`` algorithm, the original; the other algorithms
build the same two forms from their phases (the tree from its pipelined chunk transfers, the
hierarchical one by composing ring collectives on node and rail sub-groups).

Every collective comes in two forms that give the same time when run in isolation:

- **expanded**: one ``transfer`` task per ring step and GPU, each holding the links of its ring
  hop, with the data dependencies of the algorithm (a GPU forwards a chunk only after it has
  received it). Exact under contention with other traffic; O(N²) tasks.
- **macro**: one ``collective`` task that holds every link of the ring for the closed-form time.
  O(1) tasks, used for large groups.

The payload S is split into N chunks whose integer sizes sum to S exactly (the first ``S mod N``
chunks get one byte more). Transfer durations use the nominal chunk S/N, so the expanded form
reproduces the closed form exactly; the byte counts stay integral and conserved.

With W and α the bandwidth and total latency of the slowest ring hop (the one whose transfer of
S/N bytes takes longest) the closed forms are

- all-reduce (reduce-scatter then all-gather): ``2(N−1)(α + S/(N·W))``
- reduce-scatter, all-gather (S = the full, gathered size): ``(N−1)(α + S/(N·W))``
- broadcast (pipelined chain from the root in ring order, N chunks): ``2(N−1)(α + S/(N·W))``

Each builder returns ``{gpu: sync task}``; the sync ends when that GPU holds the result and its
own sends are done, so a caller chains the GPU's next work after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...hardware.platform import Platform, gpu_node
from ..tasks import TaskGraph
from . import cost as cc
from . import double_tree
from .cost import CollectiveCost, collective_cost

DETAILS = ("auto", "expanded", "macro")
# "auto" expands a collective while it needs at most this many transfer tasks.
EXPAND_LIMIT = 512

After = Iterable[int] | Mapping[int, Iterable[int]]


# ----------------------------------------------------------------------------- closed forms


def ring_step_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """One ring step: a chunk of ``nbytes / n`` over a hop of ``bandwidth`` B/s, ``latency`` s."""
    return latency + nbytes / (n * bandwidth)


def ring_all_reduce_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` GPUs: ``2(n−1)(α + S/(n·W))``."""
    if n < 2:
        return 0.0
    return 2 * (n - 1) * ring_step_time(nbytes, n, bandwidth, latency)


def ring_reduce_scatter_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Ring reduce-scatter of ``nbytes`` (each GPU keeps 1/n): ``(n−1)(α + S/(n·W))``."""
    if n < 2:
        return 0.0
    return (n - 1) * ring_step_time(nbytes, n, bandwidth, latency)


def ring_all_gather_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Ring all-gather to ``nbytes`` in total (each GPU brings 1/n): ``(n−1)(α + S/(n·W))``."""
    return ring_reduce_scatter_time(n, nbytes, bandwidth, latency)


def ring_broadcast_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Pipelined chain broadcast in n chunks over n−1 hops: ``2(n−1)(α + S/(n·W))``."""
    return ring_all_reduce_time(n, nbytes, bandwidth, latency)


def chunk_sizes(nbytes: int, n: int) -> list[int]:
    """``n`` integer chunk sizes summing to ``nbytes``; the first ``nbytes mod n`` get one more."""
    base, extra = divmod(int(nbytes), n)
    return [base + (1 if c < extra else 0) for c in range(n)]


# ----------------------------------------------------------------------------- the ring


@dataclass(frozen=True)
class Ring:
    """A group in ring order with the route of each hop ``group[i] -> group[i+1]``."""

    group: tuple[int, ...]
    hops: tuple[tuple[str, ...], ...]

    @property
    def n(self) -> int:
        return len(self.group)

    def links(self, hops: Iterable[int] | None = None) -> tuple[str, ...]:
        """Distinct directed links of the given hops (default all), in first-use order."""
        idx = range(self.n) if hops is None else hops
        return tuple(dict.fromkeys(link for i in idx for link in self.hops[i]))


def make_ring(platform: Platform, group: Sequence[int]) -> Ring:
    order = cc.check_group(platform, group)
    n = len(order)
    hops = tuple(
        platform.route(gpu_node(order[i]), gpu_node(order[(i + 1) % n])) for i in range(n)
    ) if n > 1 else ()
    return Ring(order, hops)


def slowest_hop(platform: Platform, ring: Ring, nbytes: float, hops: Iterable[int] | None = None) -> tuple[float, float]:
    """(bandwidth W, latency α) of the hop whose transfer of S/N bytes takes longest."""
    idx = list(range(ring.n) if hops is None else hops)
    best_t, best = -1.0, (float("inf"), 0.0)
    chunk = nbytes / ring.n
    for i in idx:
        route = ring.hops[i]
        t = platform.route_time(route, chunk)
        if t > best_t:
            lat = sum(platform.link(name)["latency"] for name in route)
            bw = min(platform.link(name)["bandwidth"] for name in route)
            best_t, best = t, (bw, lat)
    return best


def _resolve_detail(detail: str, transfers: int) -> str:
    if detail not in DETAILS:
        raise ValueError(f"collective detail must be one of {DETAILS}, got {detail!r}")
    if detail == "auto":
        return "expanded" if transfers <= EXPAND_LIMIT else "macro"
    return detail


def _preds(graph: TaskGraph, group: tuple[int, ...], after: After, label: str) -> dict[int, list[int]]:
    """Per-GPU predecessors; common predecessors are joined once so edges stay O(N)."""
    if isinstance(after, Mapping):
        return {g: list(after.get(g, ())) for g in group}
    common = list(after)
    if len(common) > 1 and len(group) > 1:
        common = [graph.add_sync(f"{label} start", common, devices=group)]
    return {g: common for g in group}


def _trivial(graph: TaskGraph, group: tuple[int, ...], pre: dict[int, list[int]], label: str,
             attrs: dict[str, Any]) -> dict[int, int]:
    tags = {"collective": label, **attrs}
    return {g: graph.add_sync(f"{label} done gpu{g}", pre[g], devices=(g,), **tags) for g in group}


def _hop_transfer(graph: TaskGraph, platform: Platform, ring: Ring, pos: int, nbytes: int,
                  duration: float, label: str, after: list[int], attrs: dict[str, Any], latency: float = 0.0) -> int:
    """A transfer of ``nbytes`` from ring position ``pos`` to ``pos + 1`` taking ``duration``."""
    src = ring.group[pos]
    dst = ring.group[(pos + 1) % ring.n]
    return graph.add_task(
        "transfer", label, duration, ring.hops[pos], (src, dst), nbytes, after=after, latency_s=latency,
        src=gpu_node(src), dst=gpu_node(dst), **attrs,
    )


def _macro(graph: TaskGraph, ring: Ring, op: str, nbytes: int, duration: float, link_bytes: int,
           label: str, pre: dict[int, list[int]], attrs: dict[str, Any], hops: Iterable[int] | None = None,
           latency: float = 0.0) -> dict[int, int]:
    deps = list(dict.fromkeys(p for g in ring.group for p in pre[g]))
    tags = {"collective": label, **attrs}
    task = graph.add_task(
        "collective", label, duration, ring.links(hops), ring.group, nbytes, after=deps, latency_s=latency,
        **{"op": op, **tags, "link_bytes": link_bytes},
    )
    return {g: graph.add_sync(f"{label} done gpu{g}", [task], devices=(g,), **tags) for g in ring.group}


def _ring_steps(graph: TaskGraph, platform: Platform, ring: Ring, nbytes: int, label: str,
                pre: dict[int, list[int]], attrs: dict[str, Any], phases: Sequence[tuple[str, int]],
                nominal: float | None = None, lam: float = 0.0, base: float = 0.0,
                ) -> dict[int, int]:
    """Expanded ring phases, back to back. ``phases``: (name, chunk offset) per phase of N−1 steps.

    In step k of a phase with offset o, the GPU at ring position i sends chunk (i + o − k) mod N
    to position i+1: that is the chunk it received in the previous step, so following one chunk
    around the ring visits every GPU. Reduce-scatter has o = 0, all-gather after it o = 1
    (position i then owns the reduced chunk i+1), a standalone all-gather o = 0.

    ``nominal``: the payload durations are computed from (default ``nbytes``: a channel's share
    of a multi-channel ring is fractional); ``lam``: per-step collective latency; ``base``: the
    per-call latency, added to every GPU's first send.
    """
    n = ring.n
    chunks = chunk_sizes(nbytes, n)
    size = nbytes if nominal is None else nominal
    step_s = [platform.route_time(ring.hops[i], size / n) + lam for i in range(n)]
    step_lat = [platform.route_time(ring.hops[i], 0.0) + lam for i in range(n)]
    last = [list(pre[g]) for g in ring.group]  # position i's latest send (or its predecessors)
    sent: list[int | None] = [None] * n
    k_total = 0
    for phase, offset in phases:
        for k in range(n - 1):
            new: list[int] = []
            for i in range(n):
                deps = list(last[i])
                prev = sent[(i - 1) % n]
                if prev is not None:
                    deps.append(prev)  # the chunk position i forwards arrived in the last step
                c = (i + offset - k) % n
                src, dst = ring.group[i], ring.group[(i + 1) % n]
                first = base if k_total == 0 else 0.0
                new.append(_hop_transfer(
                    graph, platform, ring, i, chunks[c], step_s[i] + first,
                    f"{label} {phase}{k} gpu{src}->gpu{dst}", deps,
                    {"collective": label, "phase": phase, "step": k_total, "chunk": c, **attrs},
                    latency=step_lat[i] + first,
                ))
            for i in range(n):
                sent[i] = new[i]
                last[i] = [new[i]]
            k_total += 1
    tags = {"collective": label, **attrs}
    return {
        g: graph.add_sync(f"{label} done gpu{g}", [sent[i], sent[(i - 1) % n]], devices=(g,), **tags)
        for i, g in enumerate(ring.group)
    }


def _one_way_ring(graph: TaskGraph, platform: Platform, ring: Ring, op: str, nbytes: int, label: str,
                  pre: dict[int, list[int]], detail: str, attrs: dict[str, Any], base: float) -> dict[int, int]:
    """The original single ring in the group's order (reduce-scatter, all-gather, all-reduce)."""
    phases = {"all_reduce": (("rs", 0), ("ag", 1)), "reduce_scatter": (("rs", 0),),
              "all_gather": (("ag", 0),)}[op]
    n = ring.n
    steps = len(phases) * (n - 1)
    lam = max(cc.step_latency_s(platform, "ring", hop) for hop in ring.hops)
    if _resolve_detail(detail, steps * n) == "expanded":
        return _ring_steps(graph, platform, ring, nbytes, label, pre, attrs, phases, lam=lam, base=base)
    bw, lat = slowest_hop(platform, ring, nbytes)
    duration = steps * ring_step_time(nbytes, n, bw, lat + lam) + base
    return _macro(graph, ring, op, nbytes, duration, steps * nbytes // n, label, pre, attrs,
                  latency=steps * (lat + lam) + base)


def _chain(graph: TaskGraph, platform: Platform, ring: Ring, nbytes: int, nominal: float, k: int, root: int,
           label: str, pre: dict[int, list[int]], attrs: dict[str, Any], lam: float, base: float,
           ) -> dict[int, int]:
    """Pipelined chain broadcast from ``root`` in ring order, in ``k`` chunks.

    Chunk c crosses hop p (p = 1 … N−1 from the root) after it crossed hop p−1 and after chunk
    c−1 crossed hop p, so the last chunk arrives after k + N − 2 chunk times.
    """
    n = ring.n
    r = ring.group.index(root)
    hop_idx = [(r + p) % n for p in range(n - 1)]  # ring position sending over the p-th hop
    chunks = chunk_sizes(nbytes, k)
    prev_hop: list[int] | None = None
    last_send: dict[int, int] = {}
    last_recv: dict[int, int] = {}
    for pos in hop_idx:
        src, dst = ring.group[pos], ring.group[(pos + 1) % n]
        dur = platform.route_time(ring.hops[pos], nominal / k) + lam
        lat = platform.route_time(ring.hops[pos], 0.0) + lam
        row: list[int] = []
        for c in range(k):
            deps = list(pre[src]) if c == 0 else [row[-1]]
            if prev_hop is not None:
                deps.append(prev_hop[c])
            first = base if (c == 0 and prev_hop is None) else 0.0
            row.append(_hop_transfer(
                graph, platform, ring, pos, chunks[c], dur + first, f"{label} bc{c} gpu{src}->gpu{dst}", deps,
                {"collective": label, "phase": "bc", "chunk": c, **attrs}, latency=lat + first,
            ))
        last_send[src] = row[-1]
        last_recv[dst] = row[-1]
        prev_hop = row
    out = {}
    for g in ring.group:
        deps = [t for t in (last_send.get(g), last_recv.get(g)) if t is not None]
        if g not in last_send:
            deps.extend(pre[g])  # the chain's end sends nothing: still respect its predecessors
        out[g] = graph.add_sync(f"{label} done gpu{g}", deps, devices=(g,), **{"collective": label, **attrs})
    return out


def _phase_macros(graph: TaskGraph, platform: Platform, group: tuple[int, ...], op: str, nbytes: int,
                  phases: Sequence[cc.Phase], label: str, pre: dict[int, list[int]], attrs: dict[str, Any],
                  ) -> dict[int, int]:
    """One ``collective`` task per phase holding the phase's links for its closed-form time."""
    deps = list(dict.fromkeys(p for g in group for p in pre[g]))
    tags = {"collective": label, **attrs}
    for ph in phases:
        load = dict(ph.link_load)  # bytes per link, fractional: the flow model's shares use them
        task = graph.add_task(
            "collective", f"{label} {ph.name}", ph.seconds(platform), tuple(load), group, nbytes, after=deps,
            latency_s=ph.latency_seconds(), **{"op": op, **tags, "phase": ph.name, "link_load": load},
        )
        deps = [task]
    return {g: graph.add_sync(f"{label} done gpu{g}", deps, devices=(g,), **tags) for g in group}


def _join(graph: TaskGraph, parts: list[dict[int, int]], group: tuple[int, ...], label: str,
          attrs: dict[str, Any]) -> dict[int, int]:
    if len(parts) == 1:
        return parts[0]
    tags = {"collective": label, **attrs}
    return {g: graph.add_sync(f"{label} done gpu{g}", [p[g] for p in parts], devices=(g,), **tags) for g in group}


def _ring_transfers(platform: Platform, group: tuple[int, ...], op: str) -> int:
    """How many transfer tasks the expanded ``ring`` algorithm needs for ``op`` on ``group``."""
    n = len(group)
    nch = len(cc.ring_orders(platform, group))
    if op == "broadcast":
        return nch * max(n, cc.BROADCAST_CHUNKS) * (n - 1)
    return nch * n * (2 * (n - 1) if op == "all_reduce" else n - 1)


def _multi_ring(graph: TaskGraph, platform: Platform, group: tuple[int, ...], op: str, nbytes: int, label: str,
                pre: dict[int, list[int]], detail: str, attrs: dict[str, Any], base: float,
                root: int | None, nominal: float | None = None) -> dict[int, int]:
    """The ``ring`` algorithm: the payload split evenly over the topology's channels.

    ``nominal``: the (possibly fractional) payload times are computed from; default ``nbytes``.
    """
    size = float(nbytes) if nominal is None else nominal
    orders = cc.ring_orders(platform, group)
    n, nch = len(group), len(orders)
    k = max(n, cc.BROADCAST_CHUNKS)
    if _resolve_detail(detail, _ring_transfers(platform, group, op)) == "macro":
        phases = cc.plan(platform, group, op, size, "ring", root)
        if not base:  # a sub-collective of a hierarchical one: the call's latency is charged once
            phases = [cc.Phase(p.name, p.steps, p.step_latency, p.link_load, 0.0, p.fill) for p in phases]
        return _phase_macros(graph, platform, group, op, nbytes, phases, label, pre, attrs)
    shares = chunk_sizes(nbytes, nch)
    parts = []
    for ci, order in enumerate(orders):
        ring = make_ring(platform, order)
        lam = max(cc.step_latency_s(platform, "ring", hop) for hop in ring.hops)
        tags = {**attrs, "channel": ci} if nch > 1 else attrs
        if op == "broadcast":
            parts.append(_chain(graph, platform, ring, shares[ci], size / nch, k, group[0] if root is None else root,
                                label, pre, tags, lam, base))
        else:
            phases = {"all_reduce": (("rs", 0), ("ag", 1)), "reduce_scatter": (("rs", 0),),
                      "all_gather": (("ag", 0),)}[op]
            parts.append(_ring_steps(graph, platform, ring, shares[ci], label, pre, tags, phases,
                                     nominal=size / nch, lam=lam, base=base))
    return _join(graph, parts, group, label, attrs)


def _direct(graph: TaskGraph, platform: Platform, group: tuple[int, ...], op: str, nbytes: int, label: str,
            pre: dict[int, list[int]], detail: str, attrs: dict[str, Any], base: float,
            root: int | None) -> dict[int, int]:
    """Every GPU sends its S/N share straight to each peer; a GPU's next phase waits for all it receives."""
    rounds = cc.direct_pairs(group, op, root)
    if _resolve_detail(detail, sum(len(r) for r in rounds)) == "macro":
        phases = cc.plan(platform, group, op, nbytes, "direct", root)
        return _phase_macros(graph, platform, group, op, nbytes, phases, label, pre, attrs)
    n = len(group)
    chunks = chunk_sizes(nbytes, n)
    pos = {g: i for i, g in enumerate(group)}
    names = {"all_reduce": ["rs", "ag"], "broadcast": ["scatter", "ag"]}.get(op, [op])
    ready = {g: list(pre[g]) for g in group}  # what a GPU's sends of the next round wait for
    touched: dict[int, list[int]] = {g: [] for g in group}
    for k, pairs in enumerate(rounds):
        received: dict[int, list[int]] = {g: [] for g in group}
        sent: dict[int, list[int]] = {}
        peers = cc.direct_peers(pairs)
        for s, d in pairs:
            route = platform.route(gpu_node(s), gpu_node(d))
            lam = peers * cc.step_latency_s(platform, "ring", route)
            first = base if k == 0 else 0.0
            c = pos[d] if names[k] in ("rs", "scatter") else pos[s]  # the chunk s sends to d
            t = graph.add_task(
                "transfer", f"{label} {names[k]} gpu{s}->gpu{d}", platform.route_time(route, nbytes / n) + lam + first,
                route, (s, d), chunks[c], after=ready[s], latency_s=platform.route_time(route, 0.0) + lam + first,
                src=gpu_node(s), dst=gpu_node(d), collective=label, phase=names[k], step=k, chunk=c, **attrs,
            )
            received[d].append(t)
            touched[s].append(t)
            touched[d].append(t)
            sent.setdefault(s, []).append(t)
        # A GPU's next round waits for all it received (to reduce or forward) and its own sends.
        ready = {g: (received[g] + sent.get(g, [])) or ready[g] for g in group}
    tags = {"collective": label, **attrs}
    return {g: graph.add_sync(f"{label} done gpu{g}", touched[g] or pre[g], devices=(g,), **tags) for g in group}


def _hierarchical(graph: TaskGraph, platform: Platform, group: tuple[int, ...], op: str, nbytes: int, label: str,
                  pre: dict[int, list[int]], detail: str, attrs: dict[str, Any], base: float,
                  root: int | None) -> dict[int, int]:
    """Ring collectives inside every node and across every rail, one level after the other."""
    split = cc.hierarchical_split(platform, group)
    assert split is not None
    nodes, rails = split
    per = len(nodes[0])
    r = group[0] if root is None else root
    done = {g: list(pre[g]) for g in group}
    levels = []
    for sub, level, divided in cc.hierarchical_steps(op):
        groups = nodes if level == "node" else rails
        if op == "broadcast" and level == "rail":
            groups = [g for g in rails if r in g]
        levels.append((sub, level, divided, groups))
    # "auto" decides for the whole collective (all its sub-rings together), not per sub-ring.
    detail = _resolve_detail(detail, sum(_ring_transfers(platform, tuple(g), sub)
                                         for sub, _lv, _dv, groups in levels for g in groups))
    for i, (sub, level, divided, groups) in enumerate(levels):
        size = nbytes // per if divided else nbytes
        for sg in groups:
            sub_pre = {g: done[g] for g in sg}
            out = _multi_ring(graph, platform, tuple(sg), sub, size, f"{label} {level}", sub_pre, detail,
                              {**attrs, "level": level}, base if i == 0 else 0.0,
                              cc.sub_root(nodes, r, sg) if sub == "broadcast" else None,
                              nominal=nbytes / per if divided else float(nbytes))
            for g, t in out.items():
                done[g] = [t]
    tags = {"collective": label, **attrs}
    return {g: graph.add_sync(f"{label} done gpu{g}", done[g], devices=(g,), **tags) for g in group}


def _record(graph: TaskGraph, op: str, algo: str, nbytes: int, proto: str = "simple") -> None:
    """Which algorithm (and protocol, when not Simple) ran each collective, for the summary and
    the JSON result; ``bytes`` is the payload."""
    stats = graph.meta.setdefault("collectives", {})
    label = algo if proto == "simple" else f"{algo}/{proto}"
    extra = {} if proto == "simple" else {"protocol": proto}
    row = stats.setdefault(f"{op} {label}", {"op": op, "algo": label, **extra, "calls": 0, "bytes": 0})
    row["calls"] += 1
    row["bytes"] += int(nbytes)


def _collective(graph: TaskGraph, platform: Platform, op: str, group: Sequence[int], nbytes: int, label: str,
                after: After, detail: str, algo: str | None, attrs: dict[str, Any],
                root: int | None = None) -> dict[int, int]:
    if nbytes < 0:
        raise ValueError(f"{label}: negative payload {nbytes}")
    _resolve_detail(detail, 0)
    order = cc.check_group(platform, group)
    if root is not None and root not in order:
        raise ValueError(f"{label}: broadcast root {root} is not in the group {order}")
    pre = _preds(graph, order, after, label)
    if len(order) < 2:
        return _trivial(graph, order, pre, label, attrs)
    platform, chosen = cc.resolve(platform, order, op, nbytes, algo, root)
    proto = cc.protocol(platform)
    _record(graph, op, chosen, nbytes, proto)
    tags = {**attrs, "algo": chosen} if proto == "simple" else {**attrs, "algo": chosen, "protocol": proto}
    nbytes = cc.wire_bytes(platform, chosen, order, op, nbytes)  # what the links carry under the protocol
    base = cc.base_latency_s(platform, "tree" if chosen == "tree" else "ring")
    if chosen == "one-way-ring":
        ring = make_ring(platform, order)
        if op == "broadcast":
            return _legacy_broadcast(graph, platform, ring, nbytes, label, root, pre, detail, tags, base)
        return _one_way_ring(graph, platform, ring, op, nbytes, label, pre, detail, tags, base)
    if chosen == "ring":
        return _multi_ring(graph, platform, order, op, nbytes, label, pre, detail, tags, base, root)
    if chosen == "direct":
        return _direct(graph, platform, order, op, nbytes, label, pre, detail, tags, base, root)
    if chosen == "hierarchical":
        return _hierarchical(graph, platform, order, op, nbytes, label, pre, detail, tags, base, root)
    return _tree(graph, platform, order, nbytes, label, pre, detail, tags)


def _tree(graph: TaskGraph, platform: Platform, group: tuple[int, ...], nbytes: int, label: str,
          pre: dict[int, list[int]], detail: str, attrs: dict[str, Any]) -> dict[int, int]:
    """Double binary tree all-reduce: the pipelined chunk transfers of
    :mod:`triosim.graph.collectives.double_tree`, each after the data it needs and after the earlier users of
    its links, or one macro task for the plan's longest path."""
    n = len(group)
    k = double_tree.chunks_per_tree(n, nbytes)
    if _resolve_detail(detail, 4 * (n - 1) * k) == "macro":
        phases = cc.plan(platform, group, "all_reduce", nbytes, "tree")
        return _phase_macros(graph, platform, group, "all_reduce", nbytes, phases, label, pre, attrs)
    plan = cc.tree_plan(platform, group, nbytes)
    tasks: list[int] = []
    finals: dict[int, list[int]] = {g: [] for g in group}
    for x in range(len(plan)):
        src, dst, c = plan.src[x], plan.dst[x], plan.chunk[x]
        deps = [tasks[p] for p in plan.data_preds[x] + plan.link_preds[x]]
        if c == 0:
            deps.extend(pre[src])  # a GPU's first send of a tree waits for its own predecessors
        phase = "up" if plan.up[x] else "down"
        t = graph.add_task(
            "transfer", f"{label} tree{plan.tree[x]} {phase}{c} gpu{src}->gpu{dst}", plan.duration[x], plan.route[x],
            (src, dst), plan.nbytes[x], after=list(dict.fromkeys(deps)), latency_s=plan.latency[x],
            src=gpu_node(src), dst=gpu_node(dst), collective=label, phase=phase, chunk=c, tree=plan.tree[x], **attrs,
        )
        tasks.append(t)
        if c == plan.k - 1:  # a GPU is done when its last chunks are sent and received
            finals[src].append(t)
            finals[dst].append(t)
    tags = {"collective": label, **attrs}
    return {g: graph.add_sync(f"{label} done gpu{g}", finals[g], devices=(g,), **tags) for g in group}


def _legacy_broadcast(graph: TaskGraph, platform: Platform, ring: Ring, nbytes: int, label: str, root: int | None,
                      pre: dict[int, list[int]], detail: str, attrs: dict[str, Any], base: float) -> dict[int, int]:
    n = ring.n
    root = ring.group[0] if root is None else root
    r = ring.group.index(root)
    hop_idx = [(r + p) % n for p in range(n - 1)]
    lam = max(cc.step_latency_s(platform, "ring", ring.hops[i]) for i in hop_idx)
    if _resolve_detail(detail, n * (n - 1)) == "macro":
        bw, lat = slowest_hop(platform, ring, nbytes, hop_idx)
        return _macro(graph, ring, "broadcast", nbytes, ring_broadcast_time(n, nbytes, bw, lat + lam) + base, nbytes,
                      label, pre, attrs, hops=hop_idx, latency=2 * (n - 1) * (lat + lam) + base)
    return _chain(graph, platform, ring, nbytes, nbytes, n, root, label, pre, attrs, lam, base)


# ----------------------------------------------------------------------------- public API


def add_all_reduce(graph: TaskGraph, platform: Platform, group: Sequence[int], nbytes: int, label: str,
                   after: After = (), detail: str = "auto", algo: str | None = None, **attrs: Any) -> dict[int, int]:
    """All-reduce of ``nbytes`` on every GPU of ``group``.

    ``after``: common predecessors, or ``{gpu: predecessors}`` (a GPU's first send waits for
    its own). ``algo``: auto, ring, one-way-ring, tree, hierarchical or direct (default: the
    platform's ``collective_algo``). Returns ``{gpu: sync}``: the GPU holds the reduced buffer
    when the sync ends.
    """
    return _collective(graph, platform, "all_reduce", group, nbytes, label, after, detail, algo, attrs)


def add_reduce_scatter(graph: TaskGraph, platform: Platform, group: Sequence[int], nbytes: int, label: str,
                       after: After = (), detail: str = "auto", algo: str | None = None,
                       **attrs: Any) -> dict[int, int]:
    """Reduce-scatter of an ``nbytes`` buffer; each GPU ends with a reduced 1/N of it."""
    return _collective(graph, platform, "reduce_scatter", group, nbytes, label, after, detail, algo, attrs)


def add_all_gather(graph: TaskGraph, platform: Platform, group: Sequence[int], nbytes: int, label: str,
                   after: After = (), detail: str = "auto", algo: str | None = None, **attrs: Any) -> dict[int, int]:
    """All-gather into an ``nbytes`` buffer; each GPU brings 1/N of it."""
    return _collective(graph, platform, "all_gather", group, nbytes, label, after, detail, algo, attrs)


def add_all_to_all(graph: TaskGraph, platform: Platform, group: Sequence[int], nbytes: int, label: str,
                   after: After = (), detail: str = "auto", algo: str | None = None, **attrs: Any) -> dict[int, int]:
    """All-to-all: each GPU sends ``nbytes / N`` of its ``nbytes`` buffer to every GPU (direct)."""
    return _collective(graph, platform, "all_to_all", group, nbytes, label, after, detail, algo, attrs)


def add_broadcast(graph: TaskGraph, platform: Platform, group: Sequence[int], nbytes: int, label: str,
                  root: int, after: After = (), detail: str = "auto", algo: str | None = None,
                  **attrs: Any) -> dict[int, int]:
    """Broadcast ``nbytes`` from ``root``: a pipelined chain per ring channel (one-way ring: N
    chunks, 2(N−1) chunk times; ring: ≥ 64 chunks, ≈ S/W), or scatter + all-gather (direct)."""
    return _collective(graph, platform, "broadcast", group, nbytes, label, after, detail, algo, attrs, root=root)


__all__ = [
    "DETAILS",
    "EXPAND_LIMIT",
    "CollectiveCost",
    "add_all_gather",
    "add_all_reduce",
    "add_all_to_all",
    "add_broadcast",
    "add_reduce_scatter",
    "chunk_sizes",
    "collective_cost",
    "ring_all_gather_time",
    "ring_all_reduce_time",
    "ring_broadcast_time",
    "ring_reduce_scatter_time",
]
