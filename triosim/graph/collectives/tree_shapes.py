"""Which binary trees NCCL's tree all-reduce runs over a group: built over nodes, with a chain
through each node's GPUs, one pair of trees per channel.

NCCL builds its double binary tree over **nodes**, not GPUs (``src/graph/trees.cc``,
``connect.cc``): inside a node the GPUs form a chain, the chain's head talks to the head of the
parent node and of up to two child nodes over the network, and every channel runs its own
trees, entering each node at another GPU so that each GPU's NIC carries one channel's share.
So the tree reaches the bandwidth of the ring (every NIC and NVLink port busy) instead of
funnelling all of a node's traffic through one GPU.

- A group whose nodes each hold the same L ≥ 1 GPUs (:func:`~.groups.node_groups`): L
  channels; channel c enters each node at its c-th GPU (a chain x[c], x[c+1], …, x[c−1]); per
  channel two trees over the nodes, heap-ordered over the nodes' order and over its reverse (so
  the inner nodes of one are mostly leaves of the other). One node: each tree is a chain, as
  NCCL's tree inside one node. One GPU per node: the heap trees over the GPUs.
- The ``switch`` topology (every GPU on one switch) is one node.
- A flat platform (no nodes) or uneven nodes: the two heap-ordered trees over the group's
  order and its reverse.

Every tree carries 1/T of the payload (T trees).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...hardware.platform import Platform
from .groups import node_groups


@dataclass(frozen=True)
class TreeShape:
    """A tree over the group: ``gpu[i]`` sits at position i, ``parent[i]`` is its parent's
    position (−1 at the root). A parent's position is always smaller than its children's."""

    gpu: tuple[int, ...]
    parent: tuple[int, ...]

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.gpu]
        for i, p in enumerate(self.parent):
            if p >= 0:
                out[p].append(i)
        return out

    def height_depth(self) -> tuple[list[int], list[int]]:
        """(height: 0 at leaves, depth: 0 at the root) of every position."""
        n = len(self.gpu)
        height = [0] * n
        for i in range(n - 1, -1, -1):
            p = self.parent[i]
            if p >= 0 and height[p] < height[i] + 1:
                height[p] = height[i] + 1
        depth = [0] * n
        for i in range(n):
            p = self.parent[i]
            if p >= 0:
                depth[i] = depth[p] + 1
        return height, depth

    def edges(self) -> list[tuple[int, int]]:
        """(child GPU, parent GPU) of every edge."""
        return [(self.gpu[i], self.gpu[p]) for i, p in enumerate(self.parent) if p >= 0]


def heap_tree(order: tuple[int, ...]) -> TreeShape:
    """The heap-ordered binary tree over ``order``: the parent of position i is (i − 1) // 2."""
    return TreeShape(tuple(order), tuple((i - 1) // 2 if i else -1 for i in range(len(order))))


def chained_tree(chains: list[tuple[int, ...]]) -> TreeShape:
    """A heap-ordered binary tree over nodes in the order of ``chains``; inside a node its GPUs
    form a chain from its head ``chain[0]``, and a node's head hangs from its parent node's head."""
    gpu: list[int] = []
    parent: list[int] = []
    heads: list[int] = []
    for j, chain in enumerate(chains):
        heads.append(len(gpu))
        for m, g in enumerate(chain):
            gpu.append(g)
            if m:
                parent.append(len(gpu) - 2)
            else:
                parent.append(heads[(j - 1) // 2] if j else -1)
    return TreeShape(tuple(gpu), tuple(parent))


def tree_shapes(platform: Platform, group: tuple[int, ...]) -> list[TreeShape]:
    """The trees the ``tree`` all-reduce runs over ``group`` (see the module doc), kept per
    group on the platform (``auto``'s bounds, the walk and the link load all ask)."""
    key = ("tree-shapes", group)
    hit = platform._plans.get(key)
    if hit is None:
        hit = platform._plans[key] = _shapes(platform, group)
    return hit


def _shapes(platform: Platform, group: tuple[int, ...]) -> list[TreeShape]:
    nodes = node_groups(platform, group)
    if nodes is None and platform.topology == "switch":
        nodes = [list(group)]  # every GPU on one switch: one node, whose tree is a chain
    if nodes is None or len({len(x) for x in nodes}) != 1:
        return [heap_tree(group), heap_tree(group[::-1])]
    per = len(nodes[0])
    shapes = []
    for c in range(per):
        chains = [tuple(x[(c + j) % per] for j in range(per)) for x in nodes]
        shapes.append(chained_tree(chains))
        shapes.append(chained_tree(chains[::-1]))
    return shapes


__all__ = ["TreeShape", "chained_tree", "heap_tree", "tree_shapes"]
