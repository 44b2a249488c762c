"""The ``direct`` algorithm as a task-DAG fragment (closed form:
:mod:`triosim.graph.collectives.direct_cost`): every GPU sends its S/N share straight to each
peer, one round per phase; a GPU's next round waits for all it received and its own sends.
"""

from __future__ import annotations

from typing import Any

from ...hardware.platform import Platform, gpu_node
from ...schedule.tasks import TaskGraph
from . import fragment, plans
from .direct_cost import direct_pairs, direct_peers, direct_round_names
from .protocols import step_latency_s


def direct(graph: TaskGraph, platform: Platform, group: tuple[int, ...], op: str, nbytes: int, label: str,
           pre: dict[int, list[int]], detail: str, attrs: dict[str, Any], base: float,
           root: int | None) -> dict[int, int]:
    """Every GPU sends its S/N share straight to each peer; a GPU's next phase waits for all it receives."""
    rounds = direct_pairs(group, op, root)
    if fragment.resolve_detail(detail, sum(len(r) for r in rounds)) == "macro":
        phases = plans.plan(platform, group, op, nbytes, "direct", root)
        return fragment.phase_macros(graph, platform, group, op, nbytes, phases, label, pre, attrs)
    n = len(group)
    chunks = fragment.chunk_sizes(nbytes, n)
    pos = {g: i for i, g in enumerate(group)}
    names = direct_round_names(op)
    ready = {g: list(pre[g]) for g in group}  # what a GPU's sends of the next round wait for
    touched: dict[int, list[int]] = {g: [] for g in group}
    for k, pairs in enumerate(rounds):
        received: dict[int, list[int]] = {g: [] for g in group}
        sent: dict[int, list[int]] = {}
        peers = direct_peers(pairs)
        # NCCL runs a GPU's sends of one round as one kernel on its channels: the SMs a
        # collective takes are split over them (schedule.sm_sharing), not taken once per peer
        sends = {}
        for s, _ in pairs:
            sends[s] = sends.get(s, 0) + 1
        nth: dict[int, int] = {}
        for s, d in pairs:
            k_of_s = nth[s] = nth.get(s, -1) + 1
            route = platform.route(gpu_node(s), gpu_node(d))
            lam = peers * step_latency_s(platform, "ring", route)
            first = base if k == 0 else 0.0
            c = pos[d] if names[k] in ("rs", "scatter") else pos[s]  # the chunk s sends to d
            t = graph.add_task(
                "transfer", f"{label} {names[k]} gpu{s}->gpu{d}", platform.route_time(route, nbytes / n) + lam + first,
                route, (s, d), chunks[c], after=ready[s], latency_s=platform.route_time(route, 0.0) + lam + first,
                src=gpu_node(s), dst=gpu_node(d), collective=label, phase=names[k], step=k, chunk=c,
                sm_part=(k_of_s, sends[s]), **attrs,
            )
            received[d].append(t)
            touched[s].append(t)
            touched[d].append(t)
            sent.setdefault(s, []).append(t)
        # A GPU's next round waits for all it received (to reduce or forward) and its own sends.
        ready = {g: (received[g] + sent.get(g, [])) or ready[g] for g in group}
    return fragment.done_syncs(graph, label, attrs, {g: touched[g] or pre[g] for g in group})
