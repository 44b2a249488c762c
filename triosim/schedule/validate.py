"""Invariant checks of a task DAG and its schedule, used by the property tests.

Each check returns a list of human-readable violations; an empty list means the invariant holds.
"""

from __future__ import annotations

import networkx as nx

from .list_scheduler import Schedule
from .tasks import KINDS, TaskGraph

EPS = 1e-12


def dag_violations(graph: TaskGraph) -> list[str]:
    """Acyclic, no dangling task, known kinds, non-negative durations, compute on exactly one GPU."""
    out = []
    if not nx.is_directed_acyclic_graph(graph.to_networkx()):
        out.append("the task graph has a cycle")
    has_pred = [False] * len(graph)
    for vs in graph.succ:
        for v in vs:
            has_pred[v] = True
    for t, kind in enumerate(graph.kind):
        if len(graph) > 1 and not graph.succ[t] and not has_pred[t]:
            out.append(f"task {t} ({graph.label[t]}) is dangling: no predecessor and no successor")
        if kind not in KINDS:
            out.append(f"task {t} has unknown kind {kind!r}")
        if graph.duration[t] < 0:
            out.append(f"task {t} has negative duration")
        if kind == "compute" and len(graph.devices[t]) != 1:
            out.append(f"compute task {t} is not on exactly one GPU")
        if kind == "sync" and graph.duration[t] != 0:
            out.append(f"sync task {t} has a duration")
    return out


def critical_path(graph: TaskGraph) -> float:
    """Longest chain of durations through the DAG (ignoring resources)."""
    finish = [0.0] * len(graph)
    indeg = list(graph.npred)
    stack = [t for t in range(len(graph)) if indeg[t] == 0]
    for t in stack:
        finish[t] = graph.duration[t]
    while stack:
        u = stack.pop()
        for v in graph.succ[u]:
            finish[v] = max(finish[v], finish[u] + graph.duration[v])
            indeg[v] -= 1
            if indeg[v] == 0:
                stack.append(v)
    return max(finish, default=0.0)


def schedule_violations(graph: TaskGraph, sched: Schedule) -> list[str]:
    """Precedence, exclusive resources, durations, and the two makespan lower bounds."""
    out = []
    tol = EPS * max(1.0, sched.makespan)
    for u, vs in enumerate(graph.succ):
        for v in vs:
            if sched.start[v] < sched.end[u] - tol:
                out.append(f"task {v} starts at {sched.start[v]} before predecessor {u} ends at {sched.end[u]}")
    busy: dict[int, list[tuple[float, float, int]]] = {}
    # Under the flow network model link tasks share links and stretch; they may not run faster
    # than alone. Everything else keeps exclusive resources and exact durations.
    shared = set(graph.meta.get("link_bandwidth", {})) if graph.meta.get("network") == "flow" else set()
    shared_ids = {r for r, name in enumerate(graph.resource_names) if name in shared}
    for t in range(len(graph)):
        is_flow = bool(shared_ids) and any(r in shared_ids for r in graph.resources[t])
        took = sched.end[t] - sched.start[t]
        if (took < graph.duration[t] - tol) if is_flow else abs(took - graph.duration[t]) > tol:
            out.append(f"task {t} runs {took} s, not its duration {graph.duration[t]}")
        if sched.start[t] < -tol:
            out.append(f"task {t} starts before time 0")
        for r in graph.resources[t]:
            if r not in shared_ids:
                busy.setdefault(r, []).append((sched.start[t], sched.end[t], t))
    for r, spans in busy.items():
        spans.sort()
        for (s1, e1, t1), (s2, e2, t2) in zip(spans, spans[1:]):
            if s2 < e1 - tol and e2 > s2 and e1 > s1:
                out.append(f"resource {graph.resource_names[r]} runs tasks {t1} and {t2} at once")
    if sched.makespan < critical_path(graph) - tol:
        out.append("makespan is shorter than the critical path")
    for r, spans in busy.items():
        total = sum(e - s for s, e, _ in spans)
        if sched.makespan < total - tol * len(spans):
            out.append(f"makespan is shorter than resource {graph.resource_names[r]}'s busy time")
    if abs(sched.makespan - max(sched.end, default=0.0)) > tol:
        out.append("makespan is not the last task's end")
    return out
