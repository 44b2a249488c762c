"""The task DAG every parallelism builder produces and the scheduler consumes.

Tasks are kept in flat lists indexed by integer id (cheap for 10^6 tasks); ``to_networkx`` builds
the ``networkx.DiGraph`` view for export, inspection and property tests. Kinds:

- ``compute``: one op on one GPU; resource ``gpuG.compute`` (the GPU's in-order stream).
- ``memcpy``: bytes between remote memory and a GPU; holds the route's directed links.
- ``transfer``: point-to-point bytes between two GPUs (pipeline tensors, one collective step).
- ``collective``: a whole collective as one macro task holding every link of its ring.
- ``sync``: zero-duration join.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice, repeat
from operator import itemgetter
from typing import Any

import networkx as nx
import numpy as np

from ..hardware.platform import Platform, gpu_node

KINDS = ("compute", "memcpy", "transfer", "collective", "sync")
COMM_KINDS = frozenset({"memcpy", "transfer", "collective"})
_KIND_CODE = {kind: code for code, kind in enumerate(KINDS)}


# The graph made last, for a progress display's "tasks built so far" while a builder fills it
# (read from another thread: a list's length is safe to read while it grows).
_newest: list[weakref.ref | None] = [None]


def tasks_in_newest_graph() -> int:
    """How many tasks the task graph created last holds now (0 when none is alive)."""
    ref = _newest[0]
    graph = ref() if ref is not None else None
    return len(graph.kind) if graph is not None else 0


def compute_resource(device: int) -> str:
    return f"gpu{device}.compute"


class TaskGraph:
    """A DAG of tasks with durations and resources, stored as parallel lists."""

    def __init__(self) -> None:
        self.kind: list[str] = []
        # Labels and attributes as stored (see the ``label`` and ``attrs`` properties): a block
        # added from a template has no label of its own here yet, and its attributes are the
        # template's dicts without the micro-batch (a 1T run's 1.8 M copies took 600 MiB).
        self.label_rows: list[str | None] = []
        self.duration: list[float] = []
        self.resources: list[tuple[int, ...]] = []
        self.devices: list[tuple[int, ...]] = []
        self.nbytes: list[int] = []
        # The fixed-delay part of a link task's duration (link and collective latency): under the
        # flow network model only the rest is shared with other flows.
        self.latency: list[float] = []
        self.attr_rows: list[dict[str, Any] | None] = []
        # (first task, micro-batch, labels around " mb{r} ", (attributes, collective name around
        # " mb{r} " or None)) of each block added from a template, in task order, not yet spelled out
        self._templated: list[tuple[int, int, list[tuple[str, str]], list[tuple[dict, tuple[str, str] | None]]]] = []
        self.succ: list[list[int]] = []
        self.npred: list[int] = []
        self.resource_names: list[str] = []
        self._rid: dict[str, int] = {}
        self._rtuples: dict[tuple[str, ...], tuple[int, ...]] = {}
        self._dtuples: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._streams: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # GPU -> (its stream's rids, (GPU,))
        # Facts builders know and reports need (peak memory per GPU, fetched bytes, ...).
        self.meta: dict[str, Any] = {}
        # each task's kind as its index in KINDS, for the tasks seen so far (kind_codes): the
        # build and the reports each looked at 10^6 kind strings several times
        self._codes = np.zeros(0, dtype=np.int8)
        self._compute: tuple[int, np.ndarray, np.ndarray] = (0, np.zeros(0, np.int64), np.zeros(0, np.int64))
        _newest[0] = weakref.ref(self)

    def __len__(self) -> int:
        return len(self.kind)

    def kind_codes(self) -> np.ndarray:
        """Each task's kind as its index in :data:`KINDS` (int8; read-only). A task's kind never
        changes, so only the tasks added since the last call are read."""
        codes = self._codes
        n, seen = len(self.kind), len(codes)
        if seen < n:
            more = np.fromiter(map(_KIND_CODE.__getitem__, islice(self.kind, seen, None)), dtype=np.int8,
                               count=n - seen)
            codes = self._codes = np.concatenate((codes, more)) if seen else more
            codes.flags.writeable = False
        return codes

    def tasks_of_kind(self, *kinds: str) -> np.ndarray:
        """The ids of the tasks of ``kinds``, in id order."""
        codes = self.kind_codes()
        if len(kinds) == 1:
            return np.flatnonzero(codes == _KIND_CODE[kinds[0]])
        return np.flatnonzero(np.isin(codes, [_KIND_CODE[k] for k in kinds]))

    def compute_tasks(self) -> tuple[np.ndarray, np.ndarray]:
        """The compute tasks' ids in id order and each one's GPU (read-only; the tasks added
        since the last call are the only ones read)."""
        seen, at, gpu = self._compute
        n = len(self.kind)
        if seen < n:
            codes = self.kind_codes()
            new = np.flatnonzero(codes[seen:] == _KIND_CODE["compute"]) + seen
            new_gpu = np.fromiter(map(itemgetter(0), map(self.devices.__getitem__, new.tolist())), dtype=np.int64,
                                  count=len(new))
            at, gpu = (np.concatenate((at, new)), np.concatenate((gpu, new_gpu))) if len(at) else (new, new_gpu)
            at.flags.writeable = gpu.flags.writeable = False
            self._compute = (n, at, gpu)
        return at, gpu

    @property
    def label(self) -> list[str]:
        """Each task's label (blocks added from a template spelled out on first read)."""
        if self._templated:
            self._spell_out()
        return self.label_rows  # type: ignore[return-value]

    @property
    def attrs(self) -> list[dict[str, Any] | None]:
        """Each task's attributes (blocks added from a template spelled out on first read).
        Readers of keys other than ``microbatch`` and ``collective`` read :attr:`attr_rows`
        instead, which leaves them unspelled."""
        if self._templated:
            self._spell_out()
        return self.attr_rows

    def extend_templated(self, r: int, labels: list[tuple[str, str]],
                         attrs: list[tuple[dict, tuple[str, str] | None]], shared: list[dict | None]) -> None:
        """The labels and attributes of a block of micro-batch ``r`` whose other columns were
        just extended from a template: each label is ``head mb{r} tail``; each task's
        attributes are a copy of the template's with ``microbatch`` set to ``r`` (and its
        ``collective`` name spelled like a label). Until first read through :attr:`label` or
        :attr:`attrs`, the rows hold no label and ``shared`` (the template's attributes without
        those two keys, one dict for every block)."""
        first = len(self.label_rows)
        self.label_rows.extend(repeat(None, len(labels)))
        self.attr_rows.extend(shared)
        self._templated.append((first, r, labels, attrs))

    def _spell_out(self) -> None:
        """Every templated block's labels and attributes, as built task by task."""
        blocks, self._templated = self._templated, []
        labels, attr_rows = self.label_rows, self.attr_rows
        for first, r, heads, attrs in blocks:
            mid = f" mb{r} "
            end = first + len(heads)
            labels[first:end] = [head + mid + tail for head, tail in heads]
            # a copy of each with the micro-batch's values in their places (both keys are
            # there: a copy keeps its key order)
            attr_rows[first:end] = [dict(a, microbatch=r) if coll is None else
                                    dict(a, microbatch=r, collective=coll[0] + mid + coll[1]) for a, coll in attrs]

    @property
    def num_edges(self) -> int:
        return sum(self.npred)

    def resource_id(self, name: str) -> int:
        rid = self._rid.get(name)
        if rid is None:
            rid = len(self.resource_names)
            self._rid[name] = rid
            self.resource_names.append(name)
        return rid

    def add_task(
        self,
        kind: str,
        label: str,
        duration_s: float,
        resources: Iterable[str] = (),
        devices: Sequence[int] = (),
        nbytes: int = 0,
        after: Iterable[int] = (),
        latency_s: float = 0.0,
        **attrs: Any,
    ) -> int:
        return self.add_tagged(kind, label, duration_s, resources, devices, attrs or None, nbytes, after, latency_s)

    def add_tagged(
        self,
        kind: str,
        label: str,
        duration_s: float,
        resources: Iterable[str],
        devices: Sequence[int],
        attrs: dict[str, Any] | None,
        nbytes: int = 0,
        after: Iterable[int] = (),
        latency_s: float = 0.0,
    ) -> int:
        """:meth:`add_task` with its attributes as a dict kept as given: builders pass one dict
        for the alike tasks of every GPU (4,096 GPUs × 400 ops each held their own copy). The
        graph's attributes are read, never changed in place."""
        if kind not in KINDS:
            raise ValueError(f"unknown task kind {kind!r}")
        if not duration_s >= 0.0:
            raise ValueError(f"task {label!r} has negative or NaN duration {duration_s}")
        tid = len(self.kind)
        self.kind.append(kind)
        self.label_rows.append(label)
        self.duration.append(float(duration_s))
        if isinstance(resources, tuple):
            # Builders reuse the same tuple of names for many tasks (a GPU's stream, a group's
            # links): resolve each tuple once.
            rids = self._rtuples.get(resources)
            if rids is None:
                rids = self._rtuples[resources] = tuple(self.resource_id(r) for r in resources)
        else:
            rids = tuple(self.resource_id(r) for r in resources)
        self.resources.append(rids)
        devices = tuple(devices)
        self.devices.append(self._dtuples.setdefault(devices, devices))  # one tuple per device set
        self.nbytes.append(int(nbytes))
        self.latency.append(min(float(latency_s), float(duration_s)))
        self.attr_rows.append(attrs)
        self.succ.append([])
        self.npred.append(self._edges_to(tid, after))
        return tid

    def resolved_row(self, kind: str, label: str, duration_s: float, resources: tuple[str, ...],
                     devices: Sequence[int]) -> tuple[str, float, tuple[int, ...], tuple[int, ...]]:
        """What :meth:`add_tagged` checks and resolves of a task added many times alike (a
        representative collective per layer and micro-batch): its kind, duration (checked, as a
        float), resource ids and device tuple, for :meth:`add_row`."""
        if kind not in KINDS:
            raise ValueError(f"unknown task kind {kind!r}")
        if not duration_s >= 0.0:
            raise ValueError(f"task {label!r} has negative or NaN duration {duration_s}")
        rids = self._rtuples.get(resources)
        if rids is None:
            rids = self._rtuples[resources] = tuple(self.resource_id(r) for r in resources)
        devices = tuple(devices)
        return kind, float(duration_s), rids, self._dtuples.setdefault(devices, devices)

    def add_row(self, row: tuple[str, float, tuple[int, ...], tuple[int, ...]], label: str, nbytes: int,
                latency_s: float, attrs: dict[str, Any] | None, after: Iterable[int]) -> int:
        """:meth:`add_tagged` of a row :meth:`resolved_row` resolved (``nbytes`` an int,
        ``latency_s`` a float): the same task, without resolving it again."""
        kind, duration, rids, devices = row
        tid = len(self.kind)
        self.kind.append(kind)
        self.label_rows.append(label)
        self.duration.append(duration)
        self.resources.append(rids)
        self.devices.append(devices)
        self.nbytes.append(nbytes)
        self.latency.append(duration if duration < latency_s else latency_s)  # min(latency, duration), as add_tagged
        self.attr_rows.append(attrs)
        self.succ.append([])
        self.npred.append(self._edges_to(tid, after))
        return tid

    def _edges_to(self, tid: int, after: Iterable[int]) -> int:
        """Add an edge from each of ``after`` to the new task ``tid``; returns how many (its
        predecessor count): :meth:`add_edge` inline, for the 10^6 tasks of a large build."""
        succ = self.succ
        count = 0
        for p in after:
            if p == tid:
                raise ValueError(f"self-loop on task {p}")
            succ[p].append(tid)
            count += 1
        return count

    def add_edge(self, u: int, v: int) -> None:
        """``u`` must finish before ``v`` starts."""
        if u == v:
            raise ValueError(f"self-loop on task {u}")
        self.succ[u].append(v)
        self.npred[v] += 1

    # -- convenience constructors ------------------------------------------------------------

    def add_compute(self, device: int, duration_s: float, label: str, after: Iterable[int] = (), **attrs: Any) -> int:
        """What ``add_task("compute", …)`` adds on ``device``'s stream, without its generic steps: a
        large mesh adds 10^6 of them (see :meth:`add_compute_tagged`)."""
        return self.add_compute_tagged(device, duration_s, label, attrs or None, after)

    def add_compute_tagged(self, device: int, duration_s: float, label: str, attrs: dict[str, Any] | None,
                           after: Iterable[int] = ()) -> int:
        """:meth:`add_compute` with a shared attribute dict (:meth:`add_tagged`), its GPU's
        stream and device tuple resolved once per GPU: a case-3 run on 4,096 GPUs adds 1.6e6."""
        if not duration_s >= 0.0:
            raise ValueError(f"task {label!r} has negative or NaN duration {duration_s}")
        stream = self._streams.get(device)
        if stream is None:
            stream = self._stream(device)
        tid = len(self.kind)
        self.kind.append("compute")
        self.label_rows.append(label)
        self.duration.append(float(duration_s))
        self.resources.append(stream[0])
        self.devices.append(stream[1])
        self.nbytes.append(0)
        self.latency.append(0.0)  # min(0.0, duration) as add_task's
        self.attr_rows.append(attrs)
        self.succ.append([])
        self.npred.append(self._edges_to(tid, after))
        return tid

    def _stream(self, device: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``device``'s stream: its resource ids and its devices tuple, made once per GPU."""
        stream = self._streams.get(device)
        if stream is None:
            name = (compute_resource(device),)
            rids = self._rtuples.get(name)
            if rids is None:
                rids = self._rtuples[name] = (self.resource_id(name[0]),)
            stream = self._streams[device] = (rids, self._dtuples.setdefault((device,), (device,)))
        return stream

    def add_compute_each(self, devices: Sequence[int], duration_s: float, labels: Sequence[str],
                         attrs: dict[str, Any] | None, afters: Sequence[Sequence[int]]) -> range:
        """One compute task on each GPU of ``devices``, the k-th after ``afters[k]``, all of
        ``duration_s`` and the one ``attrs``: what :meth:`add_compute_tagged` adds GPU after GPU,
        as whole columns (a case-3 run on 4,096 GPUs adds 1.6e6 tasks 4,096 at a time)."""
        if not duration_s >= 0.0:
            raise ValueError(f"task {labels[0]!r} has negative or NaN duration {duration_s}")
        n, first = len(devices), len(self.kind)
        streams = [self._streams.get(d) or self._stream(d) for d in devices]
        self.kind.extend(["compute"] * n)
        self.label_rows.extend(labels)
        self.duration.extend([float(duration_s)] * n)
        self.resources.extend([stream[0] for stream in streams])
        self.devices.extend([stream[1] for stream in streams])
        self.nbytes.extend([0] * n)
        self.latency.extend([0.0] * n)
        self.attr_rows.extend([attrs] * n)
        return self._edges_each(first, afters)

    def add_sync_each(self, devices: Sequence[int], labels: Sequence[str], attrs: dict[str, Any] | None,
                      afters: Sequence[Sequence[int]]) -> range:
        """One sync on each GPU of ``devices``, the k-th after ``afters[k]``, all with the one
        ``attrs``: what :meth:`add_sync_tagged` adds GPU after GPU, as whole columns (an exact
        case-3 run ends each of its collectives with 4,096 of them)."""
        n, first = len(devices), len(self.kind)
        none = self._rtuples.get(())
        if none is None:
            none = self._rtuples[()] = ()
        dtuples = self._dtuples
        self.kind.extend(["sync"] * n)
        self.label_rows.extend(labels)
        self.duration.extend([0.0] * n)
        self.resources.extend([none] * n)
        self.devices.extend([dtuples.setdefault((d,), (d,)) for d in devices])
        self.nbytes.extend([0] * n)
        self.latency.extend([0.0] * n)
        self.attr_rows.extend([attrs] * n)
        return self._edges_each(first, afters)

    def _edges_each(self, first: int, afters: Sequence[Sequence[int]]) -> range:
        """The successor lists and predecessor counts of the tasks ``first`` … ``first + len(afters) - 1``
        just added as whole columns, the k-th after ``afters[k]``; their ids."""
        n, succ = len(afters), self.succ
        succ.extend([[] for _ in range(n)])
        counts = list(map(len, afters))
        if counts.count(1) == n:  # one predecessor each (a GPU's last task): the appends made in C
            deque(map(list.append, map(succ.__getitem__, map(itemgetter(0), afters)), range(first, first + n)),
                  maxlen=0)
        else:
            for tid, after in zip(range(first, first + n), afters):
                for p in after:
                    succ[p].append(tid)
        self.npred.extend(counts)
        return range(first, first + n)

    def add_compute_chain(self, device: int, durations: Sequence[float], labels: Sequence[str],
                          attrs: Sequence[dict[str, Any]], after: Iterable[int] = ()) -> list[int]:
        """Compute tasks on ``device``, each after the previous one (and the first after
        ``after``): what ``add_compute`` in a loop adds, in one step per list (a 200k-op trace)."""
        seconds = np.asarray(durations, dtype=np.float64)
        if not (seconds >= 0.0).all():
            bad = next(i for i, d in enumerate(durations) if not d >= 0.0)
            raise ValueError(f"task {labels[bad]!r} has negative or NaN duration {durations[bad]}")
        n, first = len(durations), len(self.kind)
        if n == 0:
            return []
        rids = self._rtuples.get((compute_resource(device),))
        if rids is None:
            rids = self._rtuples[(compute_resource(device),)] = (self.resource_id(compute_resource(device)),)
        self.kind.extend(["compute"] * n)
        self.label_rows.extend(labels)
        self.duration.extend(seconds.tolist())
        self.resources.extend([rids] * n)
        self.devices.extend([(device,)] * n)
        self.nbytes.extend([0] * n)
        self.latency.extend([0.0] * n)
        self.attr_rows.extend(a or None for a in attrs)
        tasks = list(range(first, first + n))
        self.succ.extend([t + 1] for t in tasks)
        self.succ[-1] = []
        self.npred.extend([1] * n)
        self.npred[first] = 0
        for p in after:
            self.add_edge(p, first)
        return tasks

    def add_sync(self, label: str, after: Iterable[int] = (), devices: Sequence[int] = (), **attrs: Any) -> int:
        return self.add_task("sync", label, 0.0, (), devices, after=after, **attrs)

    def add_sync_tagged(self, label: str, after: Iterable[int], devices: Sequence[int],
                        attrs: dict[str, Any] | None) -> int:
        """:meth:`add_sync` with a shared attribute dict (:meth:`add_tagged`)."""
        return self.add_tagged("sync", label, 0.0, (), devices, attrs, after=after)

    def add_route_task(
        self,
        platform: Platform,
        kind: str,
        src: str,
        dst: str,
        nbytes: int,
        label: str,
        devices: Sequence[int],
        after: Iterable[int] = (),
        **attrs: Any,
    ) -> int:
        """A memcpy or transfer that holds every link of the route from ``src`` to ``dst``."""
        route = platform.route(src, dst)
        return self.add_task(
            kind, label, platform.route_time(route, nbytes), route, devices, nbytes,
            after=after, latency_s=platform.route_time(route, 0.0), src=src, dst=dst, **attrs,
        )

    def add_transfer(
        self, platform: Platform, src_gpu: int, dst_gpu: int, nbytes: int, label: str,
        after: Iterable[int] = (), **attrs: Any,
    ) -> int:
        return self.add_route_task(
            platform, "transfer", gpu_node(src_gpu), gpu_node(dst_gpu), nbytes, label,
            (src_gpu, dst_gpu), after=after, **attrs,
        )

    # -- views -------------------------------------------------------------------------------

    def predecessors(self) -> list[list[int]]:
        pred: list[list[int]] = [[] for _ in self.kind]
        for u, vs in enumerate(self.succ):
            for v in vs:
                pred[v].append(u)
        return pred

    def task_resources(self, tid: int) -> tuple[str, ...]:
        return tuple(self.resource_names[r] for r in self.resources[tid])

    def to_networkx(self) -> nx.DiGraph:
        """Every task as a node with its attributes; every dependency as an edge."""
        g = nx.DiGraph()
        labels, attrs = self.label, self.attrs
        for tid in range(len(self.kind)):
            data: dict[str, Any] = {
                "kind": self.kind[tid],
                "label": labels[tid],
                "duration_s": self.duration[tid],
                "resources": self.task_resources(tid),
                "devices": self.devices[tid],
                "bytes": self.nbytes[tid],
            }
            if attrs[tid]:
                data.update(attrs[tid])
            if self.kind[tid] == "compute":
                data["device"] = self.devices[tid][0]
            g.add_node(tid, **data)
        for u, vs in enumerate(self.succ):
            for v in vs:
                g.add_edge(u, v)
        return g
