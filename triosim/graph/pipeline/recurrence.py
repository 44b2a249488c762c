"""The block-level pipeline recurrence: the iteration time of one partition, the reference
definition the planner's estimates are held to.

Each GPU runs its blocks (one stage's ops for one micro-batch) in the schedule's order; a block
waits for the previous block on its GPU and for the bytes from the neighbouring stage, which go
over the boundary route one micro-batch after another; plus each GPU's optimizer share at the
end. It is the task DAG at block granularity, without memory traffic. The searches call the
batched equivalent, :mod:`triosim.graph.pipeline.estimate`, which gives the same figures bit
for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ...hardware.platform import Platform, gpu_node
from .schedules import BACKWARD, FORWARD, Layout, schedule_blocks
from .stage_costs import StageCosts


@dataclass(frozen=True)
class PartitionEstimate:
    """Analytic iteration-time estimate of a partition, used only to choose one."""

    starts: tuple[int, ...]
    seconds: float
    max_stage_s: float
    crossing_bytes: int


def estimate_partition(starts: Sequence[int], costs: StageCosts, platform: Platform, schedule: str,
                       layout: Layout) -> PartitionEstimate:
    """Iteration time of a partition by the block-level pipeline recurrence (module docstring)."""
    n, sizes = len(starts), costs.sizes
    num_micro = len(sizes)
    bounds = [*starts, len(costs.optimizer_s)]
    fwd = {m: [sum(f[bounds[s] : bounds[s + 1]]) for s in range(n)] for m, f in costs.forward_s.items()}
    bwd = {m: [sum(b[bounds[s] : bounds[s + 1]]) for s in range(n)] for m, b in costs.backward_s.items()}
    opt = [0.0] * layout.ranks
    for s in range(n):
        opt[s % layout.ranks] += sum(costs.optimizer_s[bounds[s] : bounds[s + 1]])
    link_f, link_b, crossing = [], [], 0
    for j in range(1, n):
        k = starts[j] - 1
        a, b = gpu_node(layout.gpu_of(j - 1)), gpu_node(layout.gpu_of(j))
        link_f.append((platform.route(a, b), costs.cut_forward[k]))
        link_b.append((platform.route(b, a), costs.cut_backward[k]))
        crossing += costs.cut_forward[k] + costs.cut_backward[k]
    orders = [schedule_blocks(schedule, layout.ranks, num_micro, p, layout.virtual) for p in range(layout.ranks)]
    link_free: dict[tuple[str, ...], float] = {}  # when each route is next free
    arrived: dict[tuple[str, int, int], float] = {}  # data for (phase, stage, mb) is there
    done_forward: set[tuple[int, int]] = set()
    pos = [0] * layout.ranks
    clock = [0.0] * layout.ranks

    def send(route: tuple[str, ...], nbytes: float, ready: float) -> float:
        if not route:
            return ready
        start = max(link_free.get(route, 0.0), ready)
        link_free[route] = start + platform.route_time(route, nbytes)
        return link_free[route]

    progress = True
    while progress:
        progress = False
        for p in range(layout.ranks):
            while pos[p] < len(orders[p]):
                ph, r, v = orders[p][pos[p]]
                s = v * layout.ranks + p
                if ph == FORWARD:
                    need = None if s == 0 else (FORWARD, s, r)
                else:
                    need = None if s == n - 1 else (BACKWARD, s, r)
                if need is not None and need not in arrived:
                    break
                if ph == BACKWARD and s == n - 1 and (s, r) not in done_forward:
                    break
                start = max(clock[p], arrived.get(need, 0.0) if need else 0.0)
                m = sizes[r]
                clock[p] = start + (fwd[m][s] if ph == FORWARD else bwd[m][s])
                pos[p] += 1
                progress = True
                frac = m / costs.batch
                # Send this block's crossing bytes on to the neighbour.
                if ph == FORWARD:
                    done_forward.add((s, r))
                    if s < n - 1:
                        route, nbytes = link_f[s]
                        arrived[(FORWARD, s + 1, r)] = send(route, nbytes * frac, clock[p])
                elif s > 0:
                    route, nbytes = link_b[s - 1]
                    arrived[(BACKWARD, s - 1, r)] = send(route, nbytes * frac, clock[p])
    if any(pos[p] < len(orders[p]) for p in range(layout.ranks)):
        seconds = math.inf  # a block order that cannot run; never chosen
    else:
        seconds = max(clock[p] + opt[p] for p in range(layout.ranks))
    m0 = sizes[0]
    return PartitionEstimate(tuple(starts), seconds, max(f + b for f, b in zip(fwd[m0], bwd[m0])), crossing)
