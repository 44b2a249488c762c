"""Chrome trace (Perfetto / chrome://tracing) of a schedule: GPU streams, links, dependencies, memory.

Process "GPU g" holds the compute stream (thread 0) and a ``memory`` counter track: the bytes
resident on the GPU while each of its steps runs, from the memory planner. Process "links" holds
one thread per directed link with every memcpy, transfer and collective that occupies it (more
lanes where transfers share the link at the same time).
Dependencies between tasks on different tracks are flow arrows (``ph`` ``s`` → ``f``): a
gradient all-reduce waiting for the backward pass, a pipeline stage waiting for its
activations. Zero-length joins (sync tasks) and zero-length transfers are not drawn; arrows pass
through them. Times are in microseconds.

A timeline can keep only some tasks (``keep``, :mod:`triosim.report.timeline_filter`: some GPUs'
work, the first micro-batches) and only the links of some GPUs (``gpus``): the memory counters
are sampled at the kept steps, and arrows join kept tasks only, never through a task left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from typing import Any

from ..schedule.list_scheduler import Schedule
from ..schedule.tasks import TaskGraph
from .result import _natural_key

LINKS_PID = 1_000_000
MEMORY_COUNTER = "memory (bytes)"
_GPU_END = re.compile(r"^gpu(\d+)$")
_HOST_LINK = re.compile(r"^host(\d+):(?:d2h|h2d)$")  # a GPU's link to host memory (activation offload)


def link_gpus(name: str) -> frozenset[int]:
    """The GPUs at either end of a link resource (``gpu0->nvsw0`` → {0}, a GPU's host link
    ``host0:d2h`` → {0}); none for a switch link."""
    if m := _HOST_LINK.match(name):
        return frozenset({int(m.group(1))})
    return frozenset(int(m.group(1)) for end in name.split("->") if (m := _GPU_END.match(end)))


def _drawn(graph: TaskGraph, sched: Schedule, t: int) -> bool:
    """Compute tasks always; communication only when it takes time; syncs never."""
    kind = graph.kind[t]
    if kind == "compute":
        return True
    return kind != "sync" and sched.end[t] > sched.start[t] and bool(graph.resources[t])


def shown_links(graph: TaskGraph, gpus: Collection[int] | None) -> list[bool]:
    """Per resource: whether its track is drawn (every link, or those with an end at ``gpus``)."""
    if gpus is None:
        return [True] * len(graph.resource_names)
    return [bool(link_gpus(name) & set(gpus)) for name in graph.resource_names]


def link_lanes(graph: TaskGraph, sched: Schedule, drawn: list[bool],
               shown: Sequence[bool] | None = None) -> tuple[dict[tuple[int, int], int], list[str]]:
    """A thread per directed link (of those ``shown``), and more where transfers share a link at
    the same time (the flow network model lets them): Chrome traces need the slices of one thread
    to nest, so overlapping transfers go to the link's next lane. Returns (task, link resource) ->
    tid and the thread names (tid i + 1 is names[i])."""
    names = graph.resource_names
    uses: dict[int, list[tuple[float, float, int]]] = {}
    for t, kind in enumerate(graph.kind):
        if drawn[t] and kind != "compute":
            for rid in graph.resources[t]:
                if shown is None or shown[rid]:
                    uses.setdefault(rid, []).append((sched.start[t], sched.end[t], t))
    lanes: dict[tuple[int, int], int] = {}
    thread_names: list[str] = []
    for rid in sorted(uses, key=lambda r: _natural_key(names[r])):
        lane_end: list[float] = []  # per lane of this link: when its last slice ends
        lane_tid: list[int] = []
        for s, e, t in sorted(uses[rid]):
            i = next((k for k, end in enumerate(lane_end) if end <= s), len(lane_end))
            if i == len(lane_end):
                lane_end.append(0.0)
                thread_names.append(names[rid] if i == 0 else f"{names[rid]} ({i + 1})")
                lane_tid.append(len(thread_names))
            lane_end[i] = e
            lanes[(t, rid)] = lane_tid[i]
    return lanes, thread_names


def flow_pairs(graph: TaskGraph, drawn: list[bool], keep: Sequence[bool] | None = None) -> list[tuple[int, int]]:
    """(u, v) for every dependency between drawn tasks, through undrawn ones (syncs, zero-length
    transfers) but never through a task left out of the timeline (not ``keep``), without repeats."""
    n = len(graph)
    # Nearest drawn ancestors of each undrawn task, in topological (id-independent) order.
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, vs in enumerate(graph.succ):
        for v in vs:
            preds[v].append(u)
    order = _topological(graph)
    via: dict[int, tuple[int, ...]] = {}
    pairs: set[tuple[int, int]] = set()
    for v in order:
        sources: list[int] = []
        for u in preds[v]:
            sources.extend((u,) if drawn[u] else via.get(u, ()))
        if drawn[v]:
            pairs.update((u, v) for u in sources)
        elif keep is None or keep[v]:
            via[v] = tuple(dict.fromkeys(sources))
    return sorted(pairs)


def _topological(graph: TaskGraph) -> list[int]:
    indeg = list(graph.npred)
    ready = [t for t in range(len(graph)) if indeg[t] == 0]
    out: list[int] = []
    while ready:
        t = ready.pop()
        out.append(t)
        for v in graph.succ[t]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return out


def timeline_events(graph: TaskGraph, sched: Schedule, flows: bool = True, memory: bool = True,
                    keep: Sequence[bool] | None = None, gpus: Collection[int] | None = None) -> list[dict[str, Any]]:
    """The trace events: every task, or those ``keep`` says, on the GPU tracks and on the links
    (every link, or those with an end at one of ``gpus``)."""
    events: list[dict[str, Any]] = []
    shown = shown_links(graph, gpus)
    drawn = [_drawn(graph, sched, t) and (keep is None or keep[t]) for t in range(len(graph))]
    # A task none of whose links is shown has no track: drawn nowhere, arrows pass it by.
    for t, kind in enumerate(graph.kind):
        if drawn[t] and kind != "compute" and not any(shown[r] for r in graph.resources[t]):
            drawn[t] = False
    lanes, thread_names = link_lanes(graph, sched, drawn, shown)
    compute_gpus: set[int] = set()
    for t, kind in enumerate(graph.kind):
        if not drawn[t]:
            continue
        s, e = sched.start[t], sched.end[t]
        args = {"task": t, "kind": kind}
        if graph.nbytes[t]:
            args["bytes"] = graph.nbytes[t]
        attrs = graph.attrs[t] or {}
        for key in ("op", "stage", "microbatch", "stage_index", "bucket"):
            if key in attrs:
                args[key] = attrs[key]
        base = {"name": graph.label[t], "cat": kind, "ph": "X", "ts": s * 1e6, "dur": (e - s) * 1e6, "args": args}
        if kind == "compute":
            g = graph.devices[t][0]
            compute_gpus.add(g)
            events.append({**base, "pid": g, "tid": 0})
        else:
            for rid in graph.resources[t]:
                if shown[rid]:
                    events.append({**base, "pid": LINKS_PID, "tid": lanes[(t, rid)]})
    if memory:
        events.extend(_memory_counters(graph, sched, compute_gpus, keep))
    if flows:
        events.extend(_flow_events(graph, sched, drawn, lanes, keep))
    meta: list[dict[str, Any]] = []
    for g in sorted(compute_gpus):
        meta.append({"name": "process_name", "ph": "M", "pid": g, "tid": 0, "args": {"name": f"GPU {g}"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": g, "tid": 0, "args": {"sort_index": g}})
        meta.append({"name": "thread_name", "ph": "M", "pid": g, "tid": 0, "args": {"name": "compute"}})
    if thread_names:
        meta.append({"name": "process_name", "ph": "M", "pid": LINKS_PID, "tid": 0, "args": {"name": "links"}})
        meta.append(
            {"name": "process_sort_index", "ph": "M", "pid": LINKS_PID, "tid": 0, "args": {"sort_index": LINKS_PID}}
        )
        for tid, name in enumerate(thread_names, start=1):
            meta.append({"name": "thread_name", "ph": "M", "pid": LINKS_PID, "tid": tid, "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": LINKS_PID, "tid": tid,
                         "args": {"sort_index": tid}})
    order = {"X": 0, "C": 1, "s": 2, "f": 3}
    events.sort(key=lambda ev: (ev["pid"], ev["tid"], ev["ts"], order[ev["ph"]], ev.get("id", 0),
                                ev["args"].get("task", 0) if "args" in ev else 0))
    return meta + events


def _memory_counters(graph: TaskGraph, sched: Schedule, gpus: set[int],
                     keep: Sequence[bool] | None = None) -> list[dict[str, Any]]:
    """A counter per GPU: bytes resident from the start of each (kept) step, a value only where
    it changes."""
    out: list[dict[str, Any]] = []
    for dev, info in sorted(graph.meta.get("memory", {}).items()):
        tasks, occ = info.get("occupancy", ((), None))
        if occ is None or not len(tasks) or dev not in gpus:
            continue
        last = None
        for t, b in sorted(zip(tasks, (int(x) for x in occ)), key=lambda tb: (sched.start[tb[0]], tb[0])):
            if keep is not None and not keep[t]:
                continue
            if b == last:
                continue
            last = b
            out.append({"name": MEMORY_COUNTER, "ph": "C", "pid": dev, "tid": 0, "ts": sched.start[t] * 1e6,
                        "args": {"bytes": b}})
        out.append({"name": MEMORY_COUNTER, "ph": "C", "pid": dev, "tid": 0, "ts": sched.makespan * 1e6,
                    "args": {"bytes": last or 0}})
    return out


def _first_lane(graph: TaskGraph, t: int, lanes: dict[tuple[int, int], int]) -> tuple[int, int]:
    """(pid, tid) of the first drawn track of task ``t`` (its first shown link, for communication)."""
    if graph.kind[t] == "compute":
        return graph.devices[t][0], 0
    return LINKS_PID, next(lanes[(t, r)] for r in graph.resources[t] if (t, r) in lanes)


def _flow_events(graph: TaskGraph, sched: Schedule, drawn: list[bool],
                 lanes: dict[tuple[int, int], int], keep: Sequence[bool] | None = None) -> list[dict[str, Any]]:
    """An arrow per dependency that crosses tracks: ``s`` inside the source slice, ``f`` at the
    start of the destination slice (bound to it: ``bp: e``)."""
    out: list[dict[str, Any]] = []
    for fid, (u, v) in enumerate(
        (u, v) for u, v in flow_pairs(graph, drawn, keep)
        if _first_lane(graph, u, lanes) != _first_lane(graph, v, lanes)
    ):
        pu, tu = _first_lane(graph, u, lanes)
        pv, tv = _first_lane(graph, v, lanes)
        # The start event sits at the source's end, nudged inside it when it has length, so
        # viewers bind it to the source slice rather than the next one on that track.
        end_u, start_u = sched.end[u] * 1e6, sched.start[u] * 1e6
        ts_u = end_u - min(1e-3, (end_u - start_u) / 2)
        out.append({"name": "dependency", "cat": "flow", "ph": "s", "id": fid + 1, "pid": pu, "tid": tu,
                    "ts": ts_u})
        out.append({"name": "dependency", "cat": "flow", "ph": "f", "bp": "e", "id": fid + 1, "pid": pv,
                    "tid": tv, "ts": sched.start[v] * 1e6})
    return out


def timeline_text(events: list[dict[str, Any]]) -> str:
    """The Chrome trace JSON document of ``events``, compact."""
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, separators=(",", ":"))


def timeline_json(graph: TaskGraph, sched: Schedule, flows: bool = True, memory: bool = True,
                  keep: Sequence[bool] | None = None, gpus: Collection[int] | None = None) -> str:
    return timeline_text(timeline_events(graph, sched, flows, memory, keep, gpus))
