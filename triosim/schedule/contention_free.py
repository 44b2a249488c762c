"""The flow loop's schedule of a DAG in which no two tasks ever meet, found in one pass.

When no two tasks of a resource overlap, no two flows share a link while both move and no
communication kernel takes SMs from a running compute task, every task starts when its last
predecessor ends, and a flow ends its latency plus its bytes at its rate alone after that: the
event-driven loop of :mod:`triosim.schedule.list_scheduler` would place each task at those very
times. Most large runs are like that (a 1F1B pipeline with blocking sends and its tensor-parallel
collectives, each after the compute before it), so :func:`earliest_schedule` finds those times in
one pass over the DAG in dependency order (a stack, no event heap), with each time computed as the
loop computes it, and then checks, with numpy over every resource, that nothing met. Anything the
loop would have handled differently makes it return None, and the caller runs the loop:

- two tasks on one exclusive resource or one compute stream overlap (a stream's task ready at
  the instant another starts counts: it would wait);
- two moving flows on one link overlap or touch (the loop re-rates flows that meet at an
  instant);
- a communication task holding SMs overlaps a compute task on its GPU (the loop slows it);
- two flows join their links at the same instant with different rates (the loop rates them
  together, and max-min filling then rounds the faster one's rate), or end within the loop's
  finishing tolerance of each other without being equal (the loop ends them together).

The checks are sufficient, not necessary: a graph they refuse may still have had nothing meet,
and then the loop gives the same times more slowly.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from ..hardware.flow_network import alone_rate
from .flows import flow_of
from .tasks import TaskGraph

# The flow loop ends together the flows that finish within this factor of the first (ActiveFlows.due).
FINISH_TOLERANCE = 1e-13
# The pass itself looks for a compute task and an SM-holding one of a GPU that overlap among the
# first this many tasks it places, to give up at once on a graph whose every layer has them (it
# would run the loop anyway); beyond, only _sms_apart's check after the pass finds them (the
# bookkeeping took a sixth of a 1T pass).
SM_CHECKS_IN_PASS = 1 << 16


def earliest_schedule(graph: TaskGraph, route: list[int], sms: list[int] | None, bandwidth: dict[int, float],
                      alike: frozenset[int] = frozenset()
                      ) -> tuple[list[float], list[float], tuple[np.ndarray, np.ndarray]] | None:
    """Start and end of every task when nothing meets (see the module docstring), else None;
    third, both as read-only float64 arrays.
    ``route``: per task 1 for a flow, 2 for a compute task on a shared stream, 0 otherwise (the
    loop's own); ``sms``: the SMs each task holds (None: no SM sharing); ``alike``: links left
    out of the flows' links (:func:`~triosim.schedule.flows.alike_links`: the same sizes and rates)."""
    times = _earliest_times(graph, route, sms, bandwidth, alike)
    if times is None:
        return None
    start, end, flows, rates = times
    starts = np.asarray(start, dtype=np.float64)
    ends = np.asarray(end, dtype=np.float64)
    joins = starts + np.asarray(graph.latency, dtype=np.float64)  # the loop's t + latency
    moving = np.zeros(len(start), dtype=bool)
    if flows:
        moving[np.asarray(flows, dtype=np.int64)] = True
    if not _flows_apart(joins, ends, flows, rates):
        return None
    groups = _groups(graph.resources)
    if not _resources_apart(graph, route, starts, ends, joins, moving, bandwidth, groups):
        return None
    if sms is not None and not _sms_apart(graph, route, sms, starts, ends, groups):
        return None
    starts.flags.writeable = ends.flags.writeable = False
    return start, end, (starts, ends)


def _earliest_times(graph: TaskGraph, route: list[int], sms: list[int] | None, bandwidth: dict[int, float],
                    alike: frozenset[int]):
    """Every task's start and end if each starts when its last predecessor ends (in
    dependency order), with the task ids and rates of the flows that move bytes; None
    as soon as two flows of one tuple of links overlap or touch, or a compute task and an
    SM-holding task of one GPU placed one after the other overlap (they would meet)."""
    n = len(graph)
    succ, dur, latency, res, attrs = graph.succ, graph.duration, graph.latency, graph.resources, graph.attr_rows
    indeg = list(graph.npred)
    ready = [0.0] * n
    start = [0.0] * n
    end = [0.0] * n
    flows: list[int] = []
    rates: list[float] = []
    memo: dict = {}
    params: dict[tuple, tuple[float, float, bool]] = {}  # as the loop's `lone`: one flow per key
    # id of a links tuple -> its moving flows' joins and ends so far, in order (they never meet:
    # two that would end the pass at once)
    on_tuple: dict[int, tuple[list[float], list[float]]] = {}
    # GPU -> the last compute task and the last SM-holding task placed there (a communication
    # kernel beside the compute after the op it follows is found here at once)
    sm_on = sms is not None
    kind, devices = graph.kind, graph.devices
    last_compute: dict[int, int] = {}
    last_comm: dict[int, int] = {}
    stack = [i for i in range(n) if indeg[i] == 0]
    pop, push = stack.pop, stack.append
    placed = 0
    while stack:
        i = pop()
        t = ready[i]
        how = route[i]
        if how == 1:
            rs = res[i]
            # What makes two link tasks' flows the same but for the task (as the loop's memo of
            # lone flows): its links tuple's identity (the graph's own object), its uniform bytes
            # per link, its transfer time and its per-link load's identity (a missing load's is
            # id(None), no live dict's). Inline: a 1T run's pass meets 7 * 10^5 flows.
            a = attrs[i]
            key = ((id(rs), a.get("link_bytes"), dur[i] - latency[i], id(a.get("link_load"))) if a
                   else (id(rs), None, dur[i] - latency[i], id(None)))
            hit = params.get(key)
            if hit is None:
                f = flow_of(graph, i, bandwidth, memo, alike)
                hit = params[key] = (f.remaining, f.alone if f.alone > 0 else alone_rate(f),
                                     f.remaining > 0 and bool(f.coefs))
            size, rate, moves = hit
            t_in = t + latency[i]
            if moves:
                e = t_in + size / rate
                held = on_tuple.get(id(rs))
                if held is None:
                    on_tuple[id(rs)] = ([t_in], [e])
                elif t_in > held[1][-1]:  # after every flow of its tuple so far (the common case)
                    held[0].append(t_in)
                    held[1].append(e)
                else:  # the tuple's flows so far are apart and in order: only its neighbours can meet it
                    ins, ens = held
                    k = bisect_left(ins, t_in)
                    if (k and ens[k - 1] >= t_in) or (k < len(ins) and ins[k] <= e):
                        return None
                    ins.insert(k, t_in)
                    ens.insert(k, e)
                flows.append(i)
                rates.append(rate)
            else:
                e = t_in
        else:
            e = t + dur[i]
        start[i] = t
        end[i] = e
        if sm_on:  # a compute task and an SM-holding one of its GPU placed one after the other that overlap
            if placed >= SM_CHECKS_IN_PASS:
                sm_on = False  # from here on left to _sms_apart
            elif how == 2:
                gpu = devices[i][0]
                other = last_comm.get(gpu)
                if other is not None and start[other] < e and t < end[other]:
                    return None
                last_compute[gpu] = i
            elif sms[i]:
                for gpu in (devices[i] if kind[i] != "transfer" else devices[i][:1]):
                    other = last_compute.get(gpu)
                    if other is not None and t < end[other] and start[other] < e:
                        return None
                    last_comm[gpu] = i
        for j in succ[i]:
            if e > ready[j]:
                ready[j] = e
            indeg[j] -= 1
            if indeg[j] == 0:
                push(j)
        placed += 1
    if placed != n:
        return None  # a cycle: the loop reports it
    return start, end, flows, rates


def _flows_apart(joins: np.ndarray, ends: np.ndarray, flows: list[int], rates: list[float]) -> bool:
    """Whether no two of ``flows`` (those that move bytes) join at one instant with different
    rates, and none end within the finishing tolerance of each other without ending together."""
    if not flows:
        return True
    ids = np.asarray(flows, dtype=np.int64)
    rate = np.asarray(rates, dtype=np.float64)
    t_in = joins[ids]
    order = np.lexsort((rate, t_in))
    t_sorted, r_sorted = t_in[order], rate[order]
    if np.any((t_sorted[1:] == t_sorted[:-1]) & (r_sorted[1:] != r_sorted[:-1])):
        return False
    x = np.sort(ends[ids])
    return not np.any((x[1:] > x[:-1]) & (x[1:] <= x[:-1] * (1 + FINISH_TOLERANCE)))


def _groups(res: list[tuple[int, ...]]) -> tuple[list[np.ndarray], list[tuple[int, ...]]]:
    """The tasks of each distinct resources tuple (tuples are the graph's own objects: one per
    distinct value), and the tuples."""
    keys = np.fromiter(map(id, res), dtype=np.int64, count=len(res))
    order = np.argsort(keys, kind="stable")
    cuts = np.flatnonzero(keys[order][1:] != keys[order][:-1]) + 1
    parts = np.split(order, cuts)
    return parts, [res[int(p[0])] for p in parts]


def _resources_apart(graph: TaskGraph, route: list[int], starts: np.ndarray, ends: np.ndarray,
                     joins: np.ndarray, moving: np.ndarray, bandwidth: dict[int, float],
                     groups: tuple[list[np.ndarray], list[tuple[int, ...]]]) -> bool:
    """Whether no two tasks overlap on a resource the loop keeps exclusive (route 0 and 2: ready
    at the instant another starts counts) and no two moving flows overlap or touch on a link."""
    parts, tuples = groups
    # resource -> the groups holding it, per kind of holder; one check per distinct set of groups
    holders: dict[tuple[int, int], list[int]] = {}
    for k, (rs, part) in enumerate(zip(tuples, parts)):
        if route[int(part[0])] == 1:
            for r in set(rs):
                if r in bandwidth:
                    holders.setdefault((1, r), []).append(k)
        else:
            for r in set(rs):
                holders.setdefault((0, r), []).append(k)
    checked: set[tuple[int, tuple[int, ...]]] = set()
    for (is_flow, _r), ks in holders.items():
        sig = (is_flow, tuple(ks))
        if sig in checked or (is_flow and len(ks) == 1):  # one tuple's flows: checked as they were placed
            continue
        checked.add(sig)
        idx = parts[ks[0]] if len(ks) == 1 else np.concatenate([parts[k] for k in ks])
        if is_flow:
            idx = idx[moving[idx]]
            s, e = joins[idx], ends[idx]
        else:
            s, e = starts[idx], ends[idx]
        if len(idx) < 2:
            continue
        order = np.lexsort((-e, s))
        s, e = s[order], np.maximum.accumulate(e[order])
        if is_flow:
            if np.any(s[1:] <= e[:-1]):
                return False
        elif np.any(s[1:] < e[:-1]):
            return False
    return True


def _sms_apart(graph: TaskGraph, route: list[int], sms: list[int], starts: np.ndarray, ends: np.ndarray,
               groups: tuple[list[np.ndarray], list[tuple[int, ...]]]) -> bool:
    """Whether no task holding SMs runs while a compute task on a shared stream of its GPU does
    (touching is fine, except an off-link task starting as the compute ends: its SMs change first)."""
    kind, devices = graph.kind, graph.devices
    routes = np.asarray(route, dtype=np.int8)
    holders = np.flatnonzero(np.asarray(sms, dtype=np.int64))
    if not len(holders):
        return True
    # a task's GPUs are those of its devices tuple (a transfer's sending GPU only): grouped by
    # the tuple (the graph's own objects) and whether it is a transfer
    sends = np.fromiter(map("transfer".__eq__, map(kind.__getitem__, holders.tolist())), dtype=bool,
                        count=len(holders))
    comm: dict[int, list[np.ndarray]] = {}
    for ids in _split_by(holders, devices, sends):
        i = int(ids[0])
        for gpu in (devices[i] if kind[i] != "transfer" else devices[i][:1]):
            comm.setdefault(gpu, []).append(ids)
    compute: dict[int, np.ndarray] = {}
    for ids in groups[0]:  # a shared stream's tasks are among those of its one-resource tuple
        ids = ids[routes[ids] == 2]
        if len(ids):
            gpu = devices[int(ids[0])][0]
            compute[gpu] = ids if gpu not in compute else np.concatenate([compute[gpu], ids])
    for gpu, parts in comm.items():
        c = compute.get(gpu)
        if c is None:
            continue
        order = np.argsort(starts[c], kind="stable")
        s, e = starts[c][order], ends[c][order]
        m = parts[0] if len(parts) == 1 else np.concatenate(parts)
        a, b = starts[m], ends[m]
        at = np.searchsorted(s, b, side="left") - 1  # the last compute starting before b
        if np.any((at >= 0) & (e[np.maximum(at, 0)] > a)):
            return False
        off_links = routes[m] == 0
        if off_links.any() and np.any(np.isin(a[off_links], e)):
            return False
    return True


def _split_by(ids: np.ndarray, devices: list[tuple[int, ...]], flag: np.ndarray) -> list[np.ndarray]:
    """``ids`` grouped by their devices tuple (by identity: the graph interns them) and ``flag``."""
    keys = np.fromiter(map(id, map(devices.__getitem__, ids.tolist())), dtype=np.int64, count=len(ids))
    keys = keys * 2 + flag  # ids of objects are even-aligned addresses: no two keys collide
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    cuts = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    return np.split(ids[order], cuts)


__all__ = ["FINISH_TOLERANCE", "earliest_schedule"]
