"""GPU-to-GPU routes on the built-in ``ring`` topology, in closed form.

GPU i is linked to GPUs i ± 1 (mod N). The platform's route is the fewest-hops path that
networkx's bidirectional breadth-first search returns; on a ring that is the shorter arc. When
both arcs are equally long (N even, the GPUs N/2 apart) the search's order decides, and this
module reproduces it so that a run's numbers do not depend on which way a route was found:

- the search alternates a forward step from the source and a backward step from the target
  while their fringes are equally large, so with the fringes at two GPUs each after the first
  two steps, every later step is forward: arcs of N/2 = 2 hops meet on the backward step, longer
  ones on a forward step;
- a fringe keeps the order of its root's neighbours, and the arc of the first neighbour is found
  first. The link graph (remote memory removed) lists GPU i's successors as i − 1, i + 1 for
  0 < i (GPU N − 1: N − 2, 0) and GPU 0's as 1, N − 1; its predecessors in ascending order.

A search per pair costs O(N) (about 10 ms at N = 16,384), so runs on large rings used to spend
minutes finding routes; this is O(route length).
"""

from __future__ import annotations


def _forward(n: int, src: int, dst: int) -> bool:
    """Whether the route from ``src`` to ``dst`` goes up the ring (src, src + 1, …)."""
    up = (dst - src) % n
    if 2 * up != n:
        return 2 * up < n
    if up == 1:  # two GPUs: one link
        return True
    if up == 2:  # met on the backward step: the target's first predecessor (ascending order)
        first = 1 if dst == 0 else (0 if dst == n - 1 else dst - 1)
        return first == (dst - 1) % n
    return src == 0  # met on a forward step: the source's first successor


def ring_arc(n: int, src: int, dst: int) -> tuple[int, int]:
    """(step, hops) of the route from ``src`` to ``dst`` on a ring of ``n``: it goes ``hops``
    links up the ring (step 1: src, src + 1, …) or down it (step −1)."""
    if src == dst:
        return 1, 0
    step = 1 if _forward(n, src, dst) else -1
    return step, (dst - src) % n if step == 1 else (src - dst) % n


def ring_path(n: int, src: int, dst: int) -> list[int]:
    """GPU indices from ``src`` to ``dst`` (both included) along the route on a ring of ``n``."""
    step, hops = ring_arc(n, src, dst)
    return [(src + step * k) % n for k in range(hops + 1)]
