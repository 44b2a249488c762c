"""Chrome trace (Perfetto / chrome://tracing) of a schedule: one track per GPU stream and link.

Process "GPU g" holds the compute stream; process "links" holds one thread per directed link
with every memcpy, transfer and collective that occupies it. Times are in microseconds.
"""

from __future__ import annotations

import json
from typing import Any

from .graph.tasks import TaskGraph
from .result import _natural_key
from .scheduler import Schedule

LINKS_PID = 1_000_000


def timeline_events(graph: TaskGraph, sched: Schedule) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    link_tid: dict[str, int] = {}
    gpus: set[int] = set()
    names = graph.resource_names
    for rid in sorted(range(len(names)), key=lambda r: _natural_key(names[r])):
        if "->" in names[rid]:
            link_tid[names[rid]] = len(link_tid) + 1
    for t, kind in enumerate(graph.kind):
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
            gpus.add(g)
            events.append({**base, "pid": g, "tid": 0})
        elif kind == "sync":
            continue
        else:
            for rid in graph.resources[t]:
                events.append({**base, "pid": LINKS_PID, "tid": link_tid[names[rid]]})
    meta: list[dict[str, Any]] = []
    for g in sorted(gpus):
        meta.append({"name": "process_name", "ph": "M", "pid": g, "tid": 0, "args": {"name": f"GPU {g}"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": g, "tid": 0, "args": {"sort_index": g}})
        meta.append({"name": "thread_name", "ph": "M", "pid": g, "tid": 0, "args": {"name": "compute"}})
    if link_tid:
        meta.append({"name": "process_name", "ph": "M", "pid": LINKS_PID, "tid": 0, "args": {"name": "links"}})
        meta.append(
            {"name": "process_sort_index", "ph": "M", "pid": LINKS_PID, "tid": 0, "args": {"sort_index": LINKS_PID}}
        )
        for name, tid in link_tid.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": LINKS_PID, "tid": tid, "args": {"name": name}})
    events.sort(key=lambda ev: (ev["pid"], ev["tid"], ev["ts"], ev["args"]["task"]))
    return meta + events


def timeline_json(graph: TaskGraph, sched: Schedule) -> str:
    return json.dumps(
        {"traceEvents": timeline_events(graph, sched), "displayTimeUnit": "ms"}, separators=(",", ":")
    )
