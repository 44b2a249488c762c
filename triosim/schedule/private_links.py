"""Which link tasks of a DAG hold links that no other kind of link task holds.

Builders hand every task of one collective charge (a tensor-parallel all-reduce repeated per
layer and micro-batch) the same tuple of links. When no task with another tuple holds any of
those links, two flows can only ever share a link when both hold that very tuple: the flow
network then needs to know a lone flow's links only once a second flow of its tuple joins
(:meth:`triosim.hardware.flow_network.ActiveFlows.add_alone`).
"""

from __future__ import annotations

from collections.abc import Iterable


def private_tuples(resources: Iterable[tuple[int, ...]], links: frozenset[int]) -> set[tuple[int, ...]]:
    """The distinct tuples of ``resources`` that hold at least one of ``links`` and whose links
    appear in no other tuple."""
    holding = [rs for rs in set(resources) if not links.isdisjoint(rs)]
    users: dict[int, int] = {}
    for rs in holding:
        for r in set(rs):
            if r in links:
                users[r] = users.get(r, 0) + 1
    return {rs for rs in holding if all(users[r] == 1 for r in rs if r in links)}


__all__ = ["private_tuples"]
