"""Collective groups on the built-in ``ring`` topology that are alike up to a rotation of the ring.

On ``ring`` every GPU i is linked to i ± 1 by links of one bandwidth and latency, so a group
moved round the ring by r GPUs has the same routes, moved by r, and the same closed-form cost:
the data-parallel groups of every pipeline stage and TP rank (and the TP groups of every
replica) are each other's rotations, because ranks are a linear function of the mesh
coordinates. A representative build (:mod:`triosim.graph.composition`) therefore finds each
collective's closed form once per rotation class, not once per group: on a 16,384-GPU ring a
group's double binary tree walks routes of thousands of links, and doing that for every stage's
groups took minutes.

One detail keeps it exact: when two GPUs are exactly N/2 apart, both arcs are shortest and the
route's direction depends on whether the source is GPU 0 (:mod:`triosim.hardware.ring_routes`),
which a rotation does not preserve. So on an even ring a group holding GPU 0 is its own class,
and every other group is moved so that its lowest GPU is GPU 1 (never 0); on an odd ring no route
is a tie and the lowest GPU moves to 0. Rings of 4 GPUs or fewer (where the target decides a
tie too) are left as they are.
"""

from __future__ import annotations

from ..hardware.platform import Platform
from .collectives.group_comm import GroupComm


def rotation_class(num_gpus: int, group: tuple[int, ...]) -> tuple[int, ...]:
    """The group that stands for ``group``'s rotations on a ring of ``num_gpus`` with the same
    routes up to renaming (see the module docstring): itself when it holds GPU 0 or spans the
    ring, else moved so that its lowest GPU is 1 (0 on an odd ring, where no route is a tie)."""
    n = num_gpus
    if len(group) < 2 or len(group) == n or n <= 4:
        return group
    if n % 2:
        low = min(group)
    elif 0 in group:
        return group
    else:
        low = min(group) - 1
    return group if low == 0 else tuple(g - low for g in group)


class RingComm(GroupComm):
    """:class:`GroupComm` whose closed forms are found once per rotation class of a group."""

    def canonical(self, group: tuple[int, ...]) -> tuple[int, ...]:
        return rotation_class(self.platform.num_gpus, group)


def group_comm(graph, platform: Platform, detail: str, exact: bool) -> GroupComm:
    """The collectives' builder for ``platform``: :class:`RingComm` on the built-in ring."""
    if platform.topology == "ring" and platform.router is None:
        return RingComm(graph, platform, detail, exact)
    return GroupComm(graph, platform, detail, exact)
