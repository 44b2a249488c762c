"""Closed-form cost of a collective on a group's own links, per algorithm, and NCCL-style choice.

A collective is planned as a sequence of **phases** (:class:`~triosim.graph.collectives.phases.Phase`).
A phase has a number of latency-carrying steps on its critical path, a per-step latency (the
slowest route's link latency plus the collective's per-step latency λ), and the bytes every
directed link carries during the phase. Its time is ``steps · step_latency + max over links
(bytes / bandwidth)``: the links of a phase work in parallel and the busiest one, relative to
its bandwidth, sets the pace. A collective's time is its per-call latency plus the sum of its
phases. This is the fluid (max-min) limit the flow network model reaches, and for link-disjoint
symmetric channels it is exactly what the expanded task DAG gives under either network model.

Algorithms (``algo``), one module each for their phases:

- ``one-way-ring``: the original: one ring in the group's order, N chunks; kept bit for bit.
- ``ring``: the rings the topology offers (``Platform.channel_style``): both directions of a
  ring, one ring per stride of a fully connected group, one ring per NIC rail of a cluster.
  The payload is split evenly over the channels (both: :mod:`~triosim.graph.collectives.ring_cost`).
- ``direct``: every GPU sends its share straight to every peer in one step per phase
  (reduce-scatter, all-gather, all-to-all; all-reduce = both; broadcast = scatter + all-gather;
  :mod:`~triosim.graph.collectives.direct_cost`).
- ``hierarchical``: node-structured groups: reduce-scatter inside each node, all-reduce of 1/L
  across nodes over each local rank's rail, all-gather inside each node (L GPUs per node;
  :mod:`~triosim.graph.collectives.hierarchical_cost`).
- ``tree``: NCCL's double binary tree for all-reduce: two binary trees, each carrying half the
  payload in chunks, reduce up and broadcast down, pipelined (:mod:`triosim.graph.collectives.double_tree`;
  its time is the longest path of that pipeline; :mod:`~triosim.graph.collectives.tree_cost`).
  Other operations fall back to ``ring``.
- ``nvls``: NCCL's NVLink SHARP: all-reduce, reduce-scatter and all-gather reduced and
  multicast in an NVLink switch that offers SHARP, one phase of GPU↔switch link loads
  (:mod:`~triosim.graph.collectives.nvls_cost`). Elsewhere it falls back to ``ring``.

Latency and protocols (:mod:`~triosim.graph.collectives.protocols`): with
``Platform.collective_latency_us`` None, NCCL's published constants for its Simple protocol
(``src/graph/tuning.cc``, NCCL 2.18): a per-call base latency (ring 8.4 µs, tree 0) and a
per-step hardware latency by link kind (ring: NVLink 3.4 µs, PCIe 5.7 µs, network 14 µs; tree:
28 µs on all kinds). A number instead is λ per step for every algorithm, with no per-call
latency; 0 turns the model off. The choice of ``auto`` is :mod:`~triosim.graph.collectives.choice`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...hardware.platform import Platform
from .choice import resolve
from .groups import check_group
from .phases import Phase, summed_load
from .plans import plan, plan_seconds
from .protocols import protocol, wire_bytes
from .ring_cost import one_way_ring_seconds

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")


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
    link_bytes = summed_load(phases)
    if chosen == "one-way-ring":
        seconds = one_way_ring_seconds(platform, order, op, nbytes, root)
    else:
        seconds = plan_seconds(platform, order, op, nbytes, chosen, root)
    return CollectiveCost(op, chosen, order, int(payload), seconds, sum(p.latency_seconds() for p in phases),
                          link_bytes, tuple(phases), protocol(platform))


__all__ = ["OPS", "CollectiveCost", "collective_cost"]
