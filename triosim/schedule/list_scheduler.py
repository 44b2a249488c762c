"""List scheduling of a task DAG over exclusive resources (GPU compute streams, directed links).

A task becomes ready when all its predecessors have ended. Among ready tasks the earliest-ready
is placed first (ties: lower task id, i.e. creation order, which builders use for program
order); it starts at ``max(ready time, free time of each of its resources)`` and holds all of
them until it ends. Resources are not back-filled: a task never starts before the last task
placed on the same resource ends. The hot loop runs on plain lists — O((V + E) log V), no
networkx.

Under the flow network model (``graph.meta["network"] == "flow"``, set by ``build_graph`` from
the platform) tasks that hold links are flows instead (:mod:`triosim.hardware.flow_network`): a flow starts
when it is ready, never waits for a link, and shares every link max-min fairly with the other
active flows; its end is known only when its last byte is through. The loop is then
event-driven: the next event is the earlier of the next ready task and the next flow to finish.
Compute streams stay exclusive resources, placed as above. The loop runs the common cases inline
(a flow alone on links only its own kind of task holds, a compute task on a free stream) and
takes an event it has just made at once when it is the next one anyway: the events, their order
and every time are those of the general path (``AT_ONCE`` off; the tests compare the two).
Before the loop, a graph in which no two tasks would ever meet (on a resource, a link or a GPU's
SMs) is placed in one pass in dependency order with the loop's own arithmetic
(:mod:`triosim.schedule.contention_free`, ``EARLIEST``); where anything would meet, the pass
steps aside and the loop places the graph.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import TriosimError
from ..hardware.flow_network import ActiveFlows, Flow, SeenComponents, alone_rate, maxmin_rates
from ..trace.load import collector_paused
from .contention_free import earliest_schedule
from .flows import alike_links, flow_of
from .network import BANDWIDTH_META, NETWORK_META
from .private_links import private_tuples
from .sm_sharing import SharedStreams, task_sms
from .tasks import KINDS, TaskGraph


@dataclass
class Schedule:
    """Start and end time (seconds) of every task, and the makespan.

    ``rates`` (flow model, when asked for): every interval between flow events with the rate
    (B/s) of each active flow's task, to check link capacities.
    """

    start: list[float]
    end: list[float]
    makespan: float
    rates: list[tuple[float, float, dict[int, float]]] | None = None
    # start and end as float64 arrays, once made (see times; not carried by dataclasses.replace)
    _arrays: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.start)

    def times(self) -> tuple[np.ndarray, np.ndarray]:
        """Start and end as float64 arrays (read-only; made once)."""
        if self._arrays is None or len(self._arrays[0]) != len(self.start):
            starts = np.fromiter(self.start, dtype=np.float64, count=len(self.start))  # twice asarray's speed
            ends = np.fromiter(self.end, dtype=np.float64, count=len(self.end))
            starts.flags.writeable = ends.flags.writeable = False
            self._arrays = (starts, ends)
        return self._arrays


# Whether the flow loop takes an event it has just made at once when it is the next one (the
# loop's next turn would take it): a compute task made ready, begun on its free shared stream; a
# flow's start with no latency, joining the links. Off, the next turn does (the reference the
# tests compare with).
AT_ONCE = True

# Whether the flow loop first tries the one-pass schedule of a DAG in which nothing meets
# (schedule.contention_free): the same times when it applies. Off, the loop places every graph.
EARLIEST = True

# Flows holding more links than this have their alike links found before the one pass.
ALIKE_BEFORE_PASS = 256

# A schedule a builder found to check its graph (graph.builder.mirrors_hold), handed to the
# next caller instead of placing the same tasks again.
SCHEDULED_META = "scheduled"


def schedule(graph: TaskGraph, progress: Callable[[int], None] | None = None,
             record_rates: bool = False) -> Schedule:
    """Place every task of ``graph``; raises if the graph has a cycle. The cyclic collector is
    paused meanwhile (the start and end lists and the flows are no cyclic garbage)."""
    done = graph.meta.pop(SCHEDULED_META, None)
    if done is not None and not record_rates and len(done) == len(graph):
        if progress is not None:
            progress(len(graph))
        return done
    with collector_paused():
        return _schedule(graph, progress, record_rates)


def _schedule(graph: TaskGraph, progress: Callable[[int], None] | None, record_rates: bool) -> Schedule:
    if graph.meta.get(NETWORK_META) == "flow":
        distinct = set(graph.resources)
        if _has_link_tasks(graph, distinct):
            return _schedule_flows(graph, progress, record_rates, distinct)
    # Without link tasks the flow model's event loop places every task exactly as this one
    # does (ready events in (time, task) order, each on its own resources), only slower.
    chain = _chain_schedule(graph)
    if chain is not None:
        if progress is not None:
            progress(len(graph))
        return replace(chain, rates=[] if record_rates and graph.meta.get(NETWORK_META) == "flow" else None)
    n = len(graph)
    succ = graph.succ
    dur = graph.duration
    res = graph.resources
    indeg = list(graph.npred)
    ready_at = [0.0] * n
    start = [0.0] * n
    end = [0.0] * n
    free = [0.0] * len(graph.resource_names)
    heap = [(0.0, i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    placed = 0
    tick = max(1, n // 100)
    while heap:
        t, i = pop(heap)
        for r in res[i]:
            if free[r] > t:
                t = free[r]
        e = t + dur[i]
        for r in res[i]:
            free[r] = e
        start[i] = t
        end[i] = e
        for j in succ[i]:
            if e > ready_at[j]:
                ready_at[j] = e
            indeg[j] -= 1
            if indeg[j] == 0:
                push(heap, (ready_at[j], j))
        placed += 1
        if progress is not None and placed % tick == 0:
            progress(placed)
    if placed != n:
        raise TriosimError(f"the task graph has a cycle: {n - placed} of {n} tasks could never start")
    return Schedule(start=start, end=end, makespan=max(end, default=0.0),
                    rates=[] if record_rates and graph.meta.get(NETWORK_META) == "flow" else None)


def _next_joins(events: list, ordered: deque, t: float) -> bool:
    """Whether the next event (the smaller of the heap's first and the sorted run's) is a flow
    joining its links at ``t``."""
    first = events[0] if events else None
    if ordered and (first is None or ordered[0] < first):
        first = ordered[0]
    return first is not None and first[0] == t and first[1] == 1


def _chain_schedule(graph: TaskGraph) -> Schedule | None:
    """The schedule of a graph that is one chain, task i before task i + 1 and nothing else (a
    single GPU's program), else None: each task starts when the one before it ends, whatever
    resources it holds. The running sum is the loop's own: numpy adds in the same order."""
    n = len(graph)
    if n == 0 or graph.npred[0] != 0 or graph.npred.count(1) != n - 1 or graph.succ[-1]:
        return None
    succ = graph.succ
    if list(map(len, succ[:-1])) != [1] * (n - 1) or [s[0] for s in succ[:-1]] != list(range(1, n)):
        return None
    end = np.cumsum(np.asarray(graph.duration, dtype=np.float64))
    end_list = end.tolist()
    return Schedule(start=[0.0, *end_list[:-1]], end=end_list, makespan=max(end_list))


def _has_link_tasks(graph: TaskGraph, distinct: set[tuple[int, ...]] | None = None) -> bool:
    """Whether a task holds a link (``distinct``: the graph's distinct resource tuples, if known)."""
    bw_by_name = graph.meta.get(BANDWIDTH_META, {})
    links = frozenset(r for r, name in enumerate(graph.resource_names) if name in bw_by_name)
    return bool(links) and any(not links.isdisjoint(rs) for rs in (set(graph.resources) if distinct is None else distinct))


def _schedule_flows(graph: TaskGraph, progress: Callable[[int], None] | None, record: bool,
                    distinct: set[tuple[int, ...]] | None = None) -> Schedule:
    """The event-driven loop of the flow network model (see the module docstring);
    ``distinct``: the graph's distinct resource tuples, if known."""
    n = len(graph)
    succ = graph.succ
    dur = graph.duration
    res = graph.resources
    names = graph.resource_names
    bw_by_name = graph.meta.get(BANDWIDTH_META, {})
    bandwidth = {r: bw_by_name[name] for r, name in enumerate(names) if name in bw_by_name}
    link_ids = frozenset(bandwidth)
    if distinct is None:
        distinct = set(res)
    flow_tuples = {rs for rs in distinct if not link_ids.isdisjoint(rs)}
    # How the loop places each task: 0 on its resources, 1 a flow, 2 on a shared compute stream
    # (a compute task on its one stream, set below when SMs are shared); per distinct tuple first.
    sms = task_sms(graph)  # SMs shared between compute and communication (schedule.sm_sharing)
    if sms is None:
        route = list(map({rs: 1 if rs in flow_tuples else 0 for rs in distinct}.__getitem__, res))
    else:  # a compute task on its one stream: placed on the GPU's shared stream
        # per tuple 1 (flows), 3 (one resource) or 0, then per task, with numpy over the kinds
        by_tuple = np.fromiter(map({rs: 1 if rs in flow_tuples else 3 if len(rs) == 1 else 0
                                    for rs in distinct}.__getitem__, res), dtype=np.int8, count=n)
        on_stream = (by_tuple == 3) & (graph.kind_codes() == KINDS.index("compute"))
        route = np.where(on_stream, 2, by_tuple == 1).astype(np.int8).tolist()
    # Links another stands for in every flow (record=False only: the rate log names every link),
    # found first where a flow holds many links (a ring of 4,096 GPUs: 8,192), whose flows the one
    # pass would otherwise build link by link.
    alike = None
    if not record and any(len(rs) > ALIKE_BEFORE_PASS for rs in flow_tuples):
        alike = alike_links(graph, bandwidth, list(map((1).__eq__, route)))
    if EARLIEST and not record:
        times = earliest_schedule(graph, route, sms, bandwidth, alike or frozenset())
        if times is not None:
            if progress is not None:
                progress(n)
            start, end, arrays = times
            sched = Schedule(start=start, end=end, makespan=max(end, default=0.0))
            sched._arrays = arrays  # the pass's own arrays of these lists
            return sched
    # Flows on links no other tuple holds skip the per-link sets while alone (record=False only:
    # the rate log is kept the general way).
    private = set() if record else private_tuples(flow_tuples, link_ids)
    latency = graph.latency
    indeg = list(graph.npred)
    ready_at = [0.0] * n
    start = [0.0] * n
    end = [0.0] * n
    free = [0.0] * len(names)
    # Events: (time, kind, task); kind 0 = ready, 1 = a flow's latency is over. Ready events
    # first at equal times, then by task id, as the list scheduler orders them.
    events = [(0.0, 0, i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(events)
    pop, push = heapq.heappop, heapq.heappush
    active, rates = ActiveFlows(), SeenComponents(maxmin_rates)  # a component's shape rated once
    memo: dict = {}  # flows of identical link tasks (see flow_of)
    if alike is None:
        alike = frozenset() if record else alike_links(graph, bandwidth, list(map((1).__eq__, route)))
    placed = 0
    tick = max(1, n // 100)
    log: list[tuple[float, float, dict[int, float]]] | None = [] if record else None
    logged_to = 0.0

    def note(t: float) -> None:
        """Record every active flow's rate up to ``t`` (only when asked: O(active flows))."""
        nonlocal logged_to
        if log is not None and t > logged_to:
            if active:
                log.append((logged_to, t, {k: f.rate for k, f in active.flows.items()}))
            logged_to = t

    streams = SharedStreams(graph, sms, events, start) if sms is not None else None
    if streams is not None:
        running, due, queue, stream_rate = streams.running, streams.due, streams.queue, streams.rate
        left, since, speed, change = streams.left, streams.since, streams.speed, streams.change
        taken, sm_count = streams.taken, streams.sm_count
        sm_top = sm_count - 1  # min(held, N − 1): SharedStreams.change's cap
    kind_of = graph.kind
    at_once = AT_ONCE
    devices = graph.devices

    def release(i: int, t: float) -> None:
        if streams is not None and sms[i]:
            change(i, t, -1)
        end[i] = t
        for j in succ[i]:
            if t > ready_at[j]:
                ready_at[j] = t
            indeg[j] -= 1
            if indeg[j] == 0:
                push(events, (ready_at[j], 0, j))

    flows = active.flows
    finish, alone, key_of, on_link = active.finish, active.alone, active.key_of, active.on_link
    attrs_of = graph.attr_rows  # link loads and bytes: no micro-batch read
    lone: dict[tuple, tuple] = {}  # (id of the links tuple, bytes, transfer time, id of the load) -> the memo's flow, private
    t_next = float("inf")  # the next flow's end: it changes only when flows start or end
    # The one event an event's handling made last, kept off the heap: the next event is the
    # smaller of it and the heap's first (heappushpop: no heap step when it is the smaller, as
    # a GPU's next task ready when the one before it ends mostly is). Events are distinct
    # tuples, so the order they are taken in is the same.
    pending = None
    # Events made in increasing order (a lockstep mesh's GPUs, one after another) go on a sorted
    # run, not the heap (a 4,096-GPU run's heap took a sixth of its time); the next event is the
    # smaller of the two firsts, so the same events come out in the same order.
    ordered: deque = deque()
    take = ordered.popleft
    inf = float("inf")
    while events or ordered or flows or pending is not None:
        # The task the turn before made ready first (a GPU's next compute task, mostly), when this
        # turn would take it (no earlier event, no flow ending before it) and its shared stream is
        # free: begun at once, as the turn would begin it (SharedStreams.begin, inline); the turn
        # then goes on with its end event pending.
        if (at_once and streams is not None and pending is not None and pending[1] == 0 and route[pending[2]] == 2
                and not (events and events[0] < pending) and not (ordered and ordered[0] < pending)
                and not (flows and t_next < pending[0])):
            t, _kind, j = pending
            gpu = devices[j][0]
            if gpu not in running:
                start[j] = t
                running[gpu] = j
                rate = stream_rate[gpu] = speed.get(gpu, 1.0)
                left[gpu] = dur[j]
                since[gpu] = t
                e = due[j] = t + dur[j] / rate
                pending = (e, -1, j)
        if flows:
            first = events[0][0] if events else inf
            if ordered and ordered[0][0] < first:
                first = ordered[0][0]
            if pending is not None and pending[0] < first:
                first = pending[0]
        if flows and t_next < first:
            t = t_next
            if log is not None:
                note(t)
            # ActiveFlows.due, remove and next_finish, inline for flows added alone (add_alone):
            # the same flows end, in the same order, and the next finish is the same entry.
            limit = t * (1 + 1e-13)
            done = []
            while finish and finish[0][0] <= limit:
                _x, version, k = pop(finish)
                f = flows.get(k)
                if f is not None and f.version == version:
                    done.append(k)
            if len(done) > 1:
                done.sort()
            if (len(done) == 1 and done[0] in key_of) or all(k in key_of for k in done):
                for k in done:
                    del flows[k]
                    del alone[key_of.pop(k)]
                while finish:
                    x, version, k = finish[0]
                    f = flows.get(k)
                    if f is not None and f.version == version:
                        t_next = x
                        break
                    pop(finish)
                else:
                    t_next = inf
            else:
                active.remove(done, t, rates)
                t_next = active.next_finish()
            for i in done:  # release(i, t), inline
                if streams is not None and sms[i]:  # SharedStreams.change(i, t, -1), inline
                    held_sms = sms[i]
                    gpus = devices[i] if kind_of[i] != "transfer" else devices[i][:1]
                    for gpu in gpus:
                        held = taken[gpu] = taken.get(gpu, 0) - held_sms
                        rate = speed[gpu] = 1.0 - (sm_top if sm_top < held else held) / sm_count
                        run = running.get(gpu)
                        if run is None:
                            continue
                        work = left[gpu] = left[gpu] - (t - since[gpu]) * stream_rate[gpu]
                        since[gpu] = t
                        stream_rate[gpu] = rate
                        x = due[run] = t + max(0.0, work) / rate
                        push(events, (x, -1, run))
                end[i] = t
                for j in succ[i]:
                    if t > ready_at[j]:
                        ready_at[j] = t
                    indeg[j] -= 1
                    if indeg[j] == 0:
                        if pending is None:
                            pending = (ready_at[j], 0, j)
                        else:
                            ev = (ready_at[j], 0, j)
                            if not ordered or ordered[-1] < ev:
                                ordered.append(ev)
                            else:
                                push(events, ev)
            placed += len(done)
            if progress is not None and placed // tick != (placed - len(done)) // tick:
                progress(placed)
            continue
        if pending is not None:
            if ordered and ordered[0] < pending and not (events and events[0] < ordered[0]):
                t, kind, i = take()  # the run's first is the smallest: pending joins the run or the heap
                if not ordered or ordered[-1] < pending:
                    ordered.append(pending)
                else:
                    push(events, pending)
            else:  # the smaller of pending and the heap's first is the smallest
                t, kind, i = heapq.heappushpop(events, pending)
            pending = None
        elif ordered and not (events and events[0] < ordered[0]):
            t, kind, i = take()
        else:
            t, kind, i = pop(events)
        if kind < 0:  # SM sharing: a compute task's end (−1), a communication task's SMs taken (−2) or freed (−3)
            if kind == -1:
                # SharedStreams.finished, inline: a stale end event is dropped
                if due.get(i) != t:
                    continue
                del due[i]
                gpu = devices[i][0]
                del running[gpu]
                q = queue.get(gpu)
                if q:  # SharedStreams.begin, inline: the GPU's next queued task starts
                    nxt = heapq.heappop(q)[1]
                    start[nxt] = t
                    running[gpu] = nxt
                    rate = stream_rate[gpu] = speed.get(gpu, 1.0)
                    left[gpu] = dur[nxt]
                    since[gpu] = t
                    e = due[nxt] = t + dur[nxt] / rate
                    pending = (e, -1, nxt)
                e = t  # released below, as a task run on the links is (a compute task holds no SMs of its own)
            else:
                change(i, t, 1 if kind == -2 else -1)
                continue
        if kind == 0:  # a task ready at t (kind −1 falls through: its end, released below; a flow's
            # start whose latency ends next, to kind 1)
            how = route[i]
            if how == 2:  # SharedStreams.offer, inline
                gpu = devices[i][0]
                if gpu in running:
                    q = queue.get(gpu)
                    if q is None:
                        queue[gpu] = [(t, i)]
                    else:
                        heapq.heappush(q, (t, i))
                else:  # SharedStreams.begin, inline
                    start[i] = t
                    running[gpu] = i
                    rate = stream_rate[gpu] = speed.get(gpu, 1.0)
                    left[gpu] = dur[i]
                    since[gpu] = t
                    e = due[i] = t + dur[i] / rate
                    pending = (e, -1, i)
                continue
            if how == 1:
                start[i] = t
                if streams is not None and sms[i]:  # SharedStreams.change(i, t, 1), inline
                    held_sms = sms[i]
                    gpus = devices[i] if kind_of[i] != "transfer" else devices[i][:1]
                    for gpu in gpus:
                        held = taken[gpu] = taken.get(gpu, 0) + held_sms
                        rate = speed[gpu] = 1.0 - (sm_top if sm_top < held else held) / sm_count
                        run = running.get(gpu)
                        if run is None:
                            continue
                        work = left[gpu] = left[gpu] - (t - since[gpu]) * stream_rate[gpu]
                        since[gpu] = t
                        stream_rate[gpu] = rate
                        x = due[run] = t + max(0.0, work) / rate
                        push(events, (x, -1, run))
                pending = (t + latency[i], 1, i)
                if (not at_once or (events and events[0] < pending) or (ordered and ordered[0] < pending)
                        or (flows and t_next < pending[0])):
                    continue
                # the loop's next turn takes this very event: taken at once (below)
                t, kind, i = pending
                pending = None
            else:
                for r in res[i]:
                    if free[r] > t:
                        t = free[r]
                e = t + dur[i]
                for r in res[i]:
                    free[r] = e
                if streams is not None and sms[i]:  # communication off the links: its SMs from start to end
                    push(events, (t, -2, i))
                    push(events, (e, -3, i))
                start[i] = t
        if kind == 1:  # flows whose latency is over join the link sharing, all those due at t at once
            if log is not None:
                note(t)
            if private and not _next_joins(events, ordered, t):
                # One flow starting: flow_of's memo, add_alone and next_finish inline when it
                # starts alone on a private tuple (a tensor-parallel collective, mostly).
                attrs = attrs_of[i]
                if attrs:
                    load = attrs.get("link_load")
                    uniform = attrs.get("link_bytes")
                else:
                    load = uniform = None
                rs = res[i]
                xfer = dur[i] - latency[i]
                lid = None if load is None else id(load)
                hit = lone.get((id(rs), uniform, xfer, lid))  # the tuples are the graph's: their ids are theirs
                if hit is None:
                    flow_of(graph, i, bandwidth, memo, alike)  # fills the memo
                    hit = lone[(id(rs), uniform, xfer, lid)] = (*memo[(rs, uniform, xfer, lid)][:4], rs in private)
                size, solo, coefs, alone_at, own = hit
                if own and size > 0 and coefs and rs not in alone and coefs[0][0] not in on_link:
                    f = Flow(i, size, solo, coefs, alone=alone_at)
                    f.since = t
                    flows[i] = f
                    alone[rs] = i
                    key_of[i] = rs
                    rate = f.rate = alone_at if alone_at > 0 else alone_rate(f)  # maxmin_rates([f])
                    f.version = 1
                    x = t + size / rate
                    heapq.heappush(finish, (x, 1, i))
                    if x < t_next:  # t_next is the earliest valid finish: the new one or it
                        t_next = x
                    continue
            starting = [i]
            while _next_joins(events, ordered, t):
                starting.append((take() if ordered and not (events and events[0] < ordered[0]) else pop(events))[2])
            joining = []
            for i in starting:
                f = flow_of(graph, i, bandwidth, memo, alike)
                if f.remaining <= 0 or not f.coefs:
                    release(i, t)
                    placed += 1
                else:
                    joining.append(f)
            if len(joining) == 1 and res[joining[0].task] in private:
                f = joining[0]
                key = res[f.task]
                if key not in active.alone and f.coefs[0][0] not in active.on_link:
                    active.add_alone(f, key, t, maxmin_rates)
                    t_next = active.next_finish()
                    continue
            if joining:
                if active.alone:  # a flow alone on links a joining flow holds: enter them first
                    for f in joining:
                        active.link(res[f.task])
                active.add(joining, t, rates)
                t_next = active.next_finish()
            continue
        end[i] = e  # release(i, e), inline: most tasks are compute tasks (and a shared stream's ends)
        for j in succ[i]:
            if e > ready_at[j]:
                ready_at[j] = e
            indeg[j] -= 1
            if indeg[j] == 0:
                if pending is None:
                    pending = (ready_at[j], 0, j)
                else:
                    ev = (ready_at[j], 0, j)
                    if not ordered or ordered[-1] < ev:
                        ordered.append(ev)
                    else:
                        push(events, ev)
        placed += 1
        if progress is not None and placed % tick == 0:
            progress(placed)
    if placed != n:
        raise TriosimError(f"the task graph has a cycle: {n - placed} of {n} tasks could never start")
    return Schedule(start=start, end=end, makespan=max(end, default=0.0), rates=log)
