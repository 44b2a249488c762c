"""Whether one representative pipeline can stand for every data- and tensor-parallel replica.

A representative hybrid build (:mod:`triosim.graph.composition`) simulates replica (dp 0, tp 0) and
charges each collective on that replica's groups; it is exact when every replica meets the
topology the same way. On ``switch`` every GPU is alike. On ``nvlink-cluster`` a route's cost
depends only on whether its two GPUs share a node, so the replicas are alike when every
replica's pipeline, every stage's TP group and every stage's DP group has the same pattern of
shared nodes, member for member, as the representative's. A mesh whose tp × pp neither divides
nor is a multiple of the GPUs per node can break that: with 4 GPUs a node, dp 2 × pp 3 puts
replica 0's pipeline inside node 0 and replica 1's across nodes 0 and 1.
"""

from __future__ import annotations

import numpy as np

from ..hardware.platform import Platform
from .rank_map import RankMap


def _node_patterns(nodes: np.ndarray) -> np.ndarray:
    """Each row's nodes relabelled by first appearance (``[5, 5, 6]`` and ``[0, 0, 1]`` alike):
    per element, the position in its row of the first element on the same node."""
    rows, k = nodes.shape
    order = np.argsort(nodes, axis=1, kind="stable")
    ordered = np.take_along_axis(nodes, order, axis=1)
    starts = np.ones((rows, k), dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    # The first position of each run of equal nodes (stable sort: the smallest position first).
    first = np.maximum.accumulate(np.where(starts, np.arange(k), 0), axis=1)
    first = np.take_along_axis(order, first, axis=1)
    out = np.empty_like(first)
    np.put_along_axis(out, order, first, axis=1)
    return out


def _alike(nodes: np.ndarray) -> bool:
    """``nodes``: (blocks, members of a block, group size); True when, in every block, every
    group's pattern is the first group's."""
    blocks, groups, k = nodes.shape
    if k < 2 or groups < 2:
        return True
    patterns = _node_patterns(nodes.reshape(blocks * groups, k)).reshape(blocks, groups, k)
    return bool((patterns == patterns[:, :1, :]).all())


def _alike_by(labels: np.ndarray, cp: int = 1) -> bool:
    """``labels``: (dp × cp, tp, pp) of a per-GPU label (its node, its rail); every replica's
    pipeline, every stage's TP groups, DP groups and context-parallel rings have the
    representative's pattern of it."""
    data, tp, pp = labels.shape
    pipelines = labels.reshape(1, data * tp, pp)  # every replica's stages
    tp_groups = labels.transpose(2, 0, 1)  # per stage: every replica's TP group
    dp_groups = labels.transpose(2, 1, 0)  # per stage: every TP rank's DP group
    # per stage: every (replica, TP rank)'s context-parallel ring
    cp_groups = labels.reshape(data // cp, cp, tp, pp).transpose(3, 0, 2, 1).reshape(pp, data // cp * tp, cp)
    return _alike(pipelines) and _alike(tp_groups) and _alike(dp_groups) and _alike(cp_groups)


def replicas_alike(platform: Platform, ranks: RankMap) -> bool:
    """True when every replica meets the topology as replica (dp 0, tp 0) does (see the module
    docstring). On a cluster file (rails of NICs, routed in closed form) a route's cost depends
    on whether its GPUs share a node and whether they share a rail (the same local rank), so
    both patterns must be alike; a mesh of dp 4 × pp 6 on nodes of 8 was 2.8 % off --exact
    before. Other topologies (switch, fully connected) are taken as they are."""
    if platform.node_of is None or platform.topology in ("switch", "fully-connected"):
        return True
    if platform.topology != "nvlink-cluster" and platform.router is None:
        return True
    dp, tp, pp = ranks.data, ranks.tp, ranks.pp  # data ranks: dp × cp
    gpu = np.array([[[ranks.rank(d, t, s) for s in range(pp)] for t in range(tp)] for d in range(dp)],
                   dtype=np.int64)
    node_of = np.asarray(platform.node_of, dtype=np.int64)
    if not _alike_by(node_of[gpu], ranks.cp):
        return False
    if platform.router is None:
        return True
    first = np.searchsorted(node_of, node_of)  # each node's first GPU (nodes are contiguous)
    rails = np.arange(len(node_of)) - first
    return _alike_by(rails[gpu], ranks.cp)


# Topologies whose GPUs share links with other GPUs' traffic: a group's collective crosses the
# links of GPUs outside it (the ring's neighbours, the mesh's rows), where the groups that a
# representative build does not build meet it. One representative pipeline was 24-40 % off
# --exact there (GPT-3 layers, dp 2 × tp 2 × pp 2 on 8 GPUs).
SHARED_LINK_TOPOLOGIES = {"ring": "ring", "optical-mesh": "mesh"}


def representatives_refused(platform: Platform, ranks: RankMap) -> str | None:
    """Why one representative pipeline cannot stand for the others of ``ranks`` on ``platform``
    (None: it can). On a topology of shared links it can only where one group spans every GPU
    (data or tensor parallelism alone, in the ring's order): then no other group exists to meet."""
    name = SHARED_LINK_TOPOLOGIES.get(platform.topology) if platform.router is None else None
    axes = [degree for degree in (ranks.dp, ranks.cp, ranks.tp) if degree > 1]
    if name is None or not axes or (ranks.pp == 1 and len(axes) == 1):
        return None
    return (f"on the {name} topology the groups' collectives cross other GPUs' links, where the groups "
            "that are not built meet them (one representative was 24-40 % off --exact there)")
