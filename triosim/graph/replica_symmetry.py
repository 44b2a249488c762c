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


def replicas_alike(platform: Platform, ranks: RankMap) -> bool:
    """True when every replica meets the topology as replica (dp 0, tp 0) does (see the module
    docstring); topologies other than ``nvlink-cluster`` are taken as they are."""
    if platform.topology != "nvlink-cluster" or platform.router is not None or platform.node_of is None:
        return True
    dp, tp, pp = ranks.data, ranks.tp, ranks.pp  # data ranks: dp × cp
    gpu = np.array([[[ranks.rank(d, t, s) for s in range(pp)] for t in range(tp)] for d in range(dp)],
                   dtype=np.int64)
    nodes = np.asarray(platform.node_of, dtype=np.int64)[gpu]  # (dp, tp, pp)
    pipelines = nodes.reshape(1, dp * tp, pp)  # every replica's stages
    tp_groups = nodes.transpose(2, 0, 1)  # per stage: every replica's TP group
    dp_groups = nodes.transpose(2, 1, 0)  # per stage: every TP rank's DP group
    # per stage: every (replica, TP rank)'s context-parallel ring
    cp_groups = nodes.reshape(ranks.dp, ranks.cp, tp, pp).transpose(3, 0, 2, 1).reshape(pp, ranks.dp * tp, ranks.cp)
    return _alike(pipelines) and _alike(tp_groups) and _alike(dp_groups) and _alike(cp_groups)
