"""Collective communication over a group of GPUs: all-reduce, reduce-scatter, all-gather,
broadcast and all-to-all, as task-DAG fragments, with the algorithms of
:mod:`triosim.graph.collectives.cost` (one-way ring, multi-channel ring, direct, hierarchical,
double binary tree, NVLS; ``algo="auto"`` picks the fastest closed form, as NCCL's tuner does).

This module checks the call, resolves the algorithm and protocol
(:mod:`~triosim.graph.collectives.choice`), records it for the summary and hands the fragment
to the algorithm's builder: :mod:`~triosim.graph.collectives.ring_tasks` (one-way and
multi-channel ring), :mod:`~triosim.graph.collectives.direct_tasks`,
:mod:`~triosim.graph.collectives.hierarchical_tasks`,
:mod:`~triosim.graph.collectives.tree_tasks` and :mod:`~triosim.graph.collectives.nvls_tasks`;
what they share is
:mod:`~triosim.graph.collectives.fragment`.

Every collective comes in two forms that give the same time when run in isolation:

- **expanded**: one ``transfer`` task per chunk and hop, each holding the links of its route,
  with the data dependencies of the algorithm (a GPU forwards a chunk only after it has
  received it). Exact under contention with other traffic; O(N²) tasks for a ring.
- **macro**: one ``collective`` task (per phase) that holds the links for the closed-form time.
  O(1) tasks, used for large groups.

The payload S is split into chunks whose integer sizes sum to S exactly; transfer durations use
the nominal chunk, so the expanded form reproduces the closed form exactly and the byte counts
stay integral and conserved. For the original ``one-way-ring``, with W and α the bandwidth and
total latency of the slowest ring hop (the one whose transfer of S/N bytes takes longest):

- all-reduce (reduce-scatter then all-gather): ``2(N−1)(α + S/(N·W))``
- reduce-scatter, all-gather (S = the full, gathered size): ``(N−1)(α + S/(N·W))``
- broadcast (pipelined chain from the root in ring order, N chunks): ``2(N−1)(α + S/(N·W))``

Each builder returns ``{gpu: sync task}``; the sync ends when that GPU holds the result and its
own sends are done, so a caller chains the GPU's next work after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...hardware.platform import Platform
from ...schedule.tasks import TaskGraph
from . import fragment, ring_tasks
from .choice import resolve
from .direct_tasks import direct
from .fragment import After
from .groups import check_group
from .hierarchical_tasks import hierarchical
from .nvls_tasks import nvls
from .protocols import base_latency_s, latency_family, protocol, wire_bytes
from .tree_tasks import tree


def record_collective(graph: TaskGraph, op: str, algo: str, nbytes: int, proto: str = "simple") -> dict[str, Any]:
    """Which algorithm (and protocol, when not Simple) ran each collective, for the summary and
    the JSON result (``collectives``); ``bytes`` is the payload. A representative build records
    the collectives of the GPUs it builds. Returns the row counted in."""
    stats = graph.meta.setdefault("collectives", {})
    label = algo if proto == "simple" else f"{algo}/{proto}"
    extra = {} if proto == "simple" else {"protocol": proto}
    row = stats.setdefault(f"{op} {label}", {"op": op, "algo": label, **extra, "calls": 0, "bytes": 0})
    row["calls"] += 1
    row["bytes"] += int(nbytes)
    return row


def _collective(graph: TaskGraph, platform: Platform, op: str, group: Sequence[int], nbytes: int, label: str,
                after: After, detail: str, algo: str | None, attrs: dict[str, Any],
                root: int | None = None) -> dict[int, int]:
    if nbytes < 0:
        raise ValueError(f"{label}: negative payload {nbytes}")
    fragment.resolve_detail(detail, 0)
    order = check_group(platform, group)
    if root is not None and root not in order:
        raise ValueError(f"{label}: broadcast root {root} is not in the group {order}")
    pre = fragment.preds(graph, order, after, label)
    if len(order) < 2:
        return fragment.done_syncs(graph, label, attrs, {g: pre[g] for g in order})
    platform, chosen = resolve(platform, order, op, nbytes, algo, root)
    proto = protocol(platform)
    record_collective(graph, op, chosen, nbytes, proto)
    tags = {**attrs, "algo": chosen} if proto == "simple" else {**attrs, "algo": chosen, "protocol": proto}
    nbytes = wire_bytes(platform, chosen, order, op, nbytes)  # what the links carry under the protocol
    base = base_latency_s(platform, latency_family(chosen))
    if chosen == "one-way-ring":
        ring = ring_tasks.make_ring(platform, order)
        if op == "broadcast":
            return ring_tasks.one_way_broadcast(graph, platform, ring, nbytes, label, root, pre, detail, tags, base)
        return ring_tasks.one_way_ring(graph, platform, ring, op, nbytes, label, pre, detail, tags, base)
    if chosen == "ring":
        return ring_tasks.multi_ring(graph, platform, order, op, nbytes, label, pre, detail, tags, base, root)
    if chosen == "direct":
        return direct(graph, platform, order, op, nbytes, label, pre, detail, tags, base, root)
    if chosen == "hierarchical":
        return hierarchical(graph, platform, order, op, nbytes, label, pre, detail, tags, base, root)
    if chosen == "nvls":
        return nvls(graph, platform, order, op, nbytes, label, pre, tags)
    return tree(graph, platform, order, nbytes, label, pre, detail, tags)


# ----------------------------------------------------------------------------- public API


def add_all_reduce(graph: TaskGraph, platform: Platform, group: Sequence[int], nbytes: int, label: str,
                   after: After = (), detail: str = "auto", algo: str | None = None, **attrs: Any) -> dict[int, int]:
    """All-reduce of ``nbytes`` on every GPU of ``group``.

    ``after``: common predecessors, or ``{gpu: predecessors}`` (a GPU's first send waits for
    its own). ``algo``: auto, ring, one-way-ring, tree, hierarchical, direct or nvls (default: the
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
    "add_all_gather",
    "add_all_reduce",
    "add_all_to_all",
    "add_broadcast",
    "add_reduce_scatter",
]
