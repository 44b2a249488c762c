"""The outcome of one simulation: makespan plus per-GPU and per-link figures.

Figures are derived only from the TaskGraph and the Schedule, never from the strategy:
compute = time the GPU's compute stream is busy; comm = time any communication task touching
the GPU runs (union of intervals); exposed comm = the part of comm time during which the GPU
computes nothing; idle = makespan − compute.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import chain, compress
from operator import not_
from typing import Any

import numpy as np

from ..graph.composition import MIRRORS_META
from ..graph.strategy import Strategy
from ..hardware.platform import Platform
from ..schedule.list_scheduler import Schedule
from ..schedule.tasks import COMM_KINDS, TaskGraph
from ..trace.load import collector_paused
from .intervals import Columns, columns_length, merged_columns, subtract_length

# Facts builders record about their strategy that belong in the JSON result.
STRATEGY_META = ("gradient_bytes", "buckets", "tensor_parallel", "pipeline", "parallel", "hybrid", "collectives",
                 "precision")


def case_of(strategy: Strategy) -> int | None:
    """The run's ``case`` as the JSON result, the summary and sweep rows give it: a ``-case`` run's
    number; for a run given as degrees (``--dp/--tp/--pp``), the preset its composition equals
    exactly (``--dp N`` is case 2, ``--tp N --tp-style per-op`` case 3, ``--pp N`` case 4, all
    degrees 1 case 0), else None: no case describes it, its ``case_name`` does."""
    if not strategy.hybrid:
        return strategy.case
    if strategy.zero or strategy.sequence_parallel or getattr(strategy, "context_degree", 1) > 1:
        return None
    wide = [axis for axis, n in (("dp", strategy.dp), ("tp", strategy.tp), ("pp", strategy.pp)) if (n or 1) > 1]
    if len(wide) > 1:
        return None
    if wide == ["pp"]:
        return 4  # case 4's preset keeps the micro-batches, schedule and partition
    if strategy.micro_batch_size is not None:
        return None  # the presets of cases 0, 2 and 3 run one micro-batch
    if not wide:
        return 0
    if wide == ["dp"]:
        return 2
    return 3 if strategy.effective_tp_style == "per-op" else None


def case_label(strategy: Strategy) -> str:
    """How the summary's header names the run: ``case 2 · distributed data parallel (DDP)``, a
    hybrid run by its composition (``hybrid dp2×tp4``), with the preset it equals if any."""
    if not strategy.hybrid:
        return f"case {strategy.case} · {strategy.name}"
    case = case_of(strategy)
    return strategy.name + (f" (= case {case})" if case is not None else "")


@dataclass
class GpuStats:
    gpu: int
    compute_ms: float
    comm_ms: float
    exposed_comm_ms: float
    idle_ms: float
    peak_memory_bytes: int


@dataclass
class LinkStats:
    link: str
    bytes: int
    busy_ms: float
    utilization: float


@dataclass
class Result:
    makespan_s: float
    strategy: Strategy
    platform: Platform
    graph: TaskGraph
    schedule: Schedule
    per_gpu: list[GpuStats]
    per_link: list[LinkStats]
    extra: dict[str, Any] = field(default_factory=dict)
    _breakdown: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def time_breakdown(self) -> dict[str, Any]:
        """Where each GPU's iteration goes (see :mod:`triosim.report.breakdown`); computed once."""
        if self._breakdown is None:
            from .breakdown import breakdown_dict  # the breakdown reads this module's Result

            self._breakdown = breakdown_dict(self)
        return self._breakdown

    @property
    def makespan_ms(self) -> float:
        return self.makespan_s * 1e3

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, deterministic (rounded to 1 ns / 1e-9)."""

        def r(x: float) -> float:
            return round(x, 9)

        mem = self.graph.meta.get("memory", {})
        return {
            "makespan_ms": r(self.makespan_ms),
            "case": case_of(self.strategy),
            "case_name": self.strategy.name,
            "gpus": self.platform.num_gpus,
            "topology": self.platform.topology,
            # The achieved share of nominal bandwidth per link class, when not every link is nominal.
            **({"link_efficiency": dict(sorted(self.platform.link_efficiency.items()))}
               if self.platform.link_efficiency else {}),
            "tasks": len(self.graph),
            "edges": self.graph.num_edges,
            "fetched_bytes": sum(m.get("fetched_bytes", 0) for m in mem.values()),
            "written_back_bytes": sum(m.get("written_back_bytes", 0) for m in mem.values()),
            "per_gpu": [
                {
                    "gpu": g.gpu,
                    "compute_ms": r(g.compute_ms),
                    "comm_ms": r(g.comm_ms),
                    "exposed_comm_ms": r(g.exposed_comm_ms),
                    "idle_ms": r(g.idle_ms),
                    "peak_memory_bytes": g.peak_memory_bytes,
                }
                for g in self.per_gpu
            ],
            "per_link": [
                {"link": k.link, "bytes": k.bytes, "busy_ms": r(k.busy_ms), "utilization": r(k.utilization)}
                for k in self.per_link
            ],
            **{k: self.graph.meta[k] for k in STRATEGY_META if k in self.graph.meta},
            "breakdown": self.time_breakdown(),
            **self.extra,
        }


def summarize(graph: TaskGraph, sched: Schedule, platform: Platform) -> tuple[list[GpuStats], list[LinkStats]]:
    """Per-GPU and per-link figures of ``sched`` (the cyclic collector paused: as the build)."""
    with collector_paused():
        return _summarize(graph, sched, platform)


def _summarize(graph: TaskGraph, sched: Schedule, platform: Platform) -> tuple[list[GpuStats], list[LinkStats]]:
    devices = graph.meta.get("devices") or list(range(platform.num_gpus))
    names = graph.resource_names
    # Every union below is kept as columns (report.intervals.Columns): a large run has 10^6
    # compute and 10^5 communication spans per GPU or link.
    at, gpu_of = graph.compute_tasks()
    starts, ends = sched.times()
    compute_union: dict[int, Columns] = {d: _NONE for d in devices}
    # GPUs whose compute spans are the same (a lockstep mesh's) share one union, so the figures
    # below are computed once for them
    same: dict[tuple[bytes, bytes], Columns] = {}
    for d, mine in _grouped(at, gpu_of):
        s, e = starts[mine], ends[mine]
        spans = (s.tobytes(), e.tobytes())
        union = same.get(spans)
        if union is None:
            union = same[spans] = merged_columns(s, e)
        compute_union[d] = union
    for d, built in graph.meta.get(MIRRORS_META, {}).items():  # a folded build: GPU d runs as the built GPU
        compute_union[d] = compute_union[built]
    # Communication spans by the GPUs their task names (a collective names its whole group):
    # each GPU's spans are those of the tuples naming it, and GPUs named by the same tuples
    # share their union. Tasks are grouped by the tuple of links they hold (a collective's
    # ring, a route): each link of a tuple gets the same spans, so spans and uniform bytes are
    # gathered once per tuple.
    comm = graph.tasks_of_kind(*sorted(COMM_KINDS)).tolist()
    comm_at = np.array(comm, dtype=np.int64)
    devs_code: dict[tuple[int, ...], int] = {}
    devs = np.array([devs_code.setdefault(d, len(devs_code)) for d in map(graph.devices.__getitem__, comm)],
                    dtype=np.int64).reshape(len(comm))
    comm_of = {k: (starts[mine], ends[mine]) for k, mine in _grouped(comm_at, devs)}
    link_bytes: dict[str, int] = {}
    bytes_of: dict[tuple[int, ...], int] = {}
    loads: dict[tuple[tuple[int, ...], int], list] = {}  # (links, id of the load dict) -> [load, tasks]
    rids_code: dict[tuple[int, ...], int] = {}
    # Column by column (a 1T run has 7e5 link tasks), each in task order: the tuples' codes in
    # first-seen order, and the charges and bytes below in the order a task-by-task loop meets them.
    held = list(map(graph.resources.__getitem__, comm))
    some = list(map(bool, held))
    holding = list(compress(comm, some)) if not all(some) else comm
    held = list(compress(held, some)) if len(holding) != len(held) else held
    attrs_of = list(map(graph.attr_rows.__getitem__, holding))
    codes = [rids_code.setdefault(rids, len(rids_code)) for rids in held]
    # macro collectives whose links carry different bytes: one load dict per charge, shared by its
    # tasks, counted here and added once per link below
    load_of = [attrs.get("link_load") if attrs else None for attrs in attrs_of]
    loaded = list(map(bool, load_of))
    tuples = list(rids_code)
    by_id = dict(zip(map(id, compress(load_of, loaded)), compress(load_of, loaded)))
    for (code, lid), calls in Counter(compress(zip(codes, map(id, load_of)), loaded)).items():
        loads[(tuples[code], lid)] = [by_id[lid], calls]
    for rids, attrs, i in compress(zip(held, attrs_of, holding), map(not_, loaded)):
        nbytes = graph.nbytes[i]
        bytes_of[rids] = bytes_of.get(rids, 0) + int(attrs.get("link_bytes", nbytes) if attrs else nbytes)
    spans_of = {tuples[k]: (starts[mine], ends[mine])
                for k, mine in _grouped(np.array(holding, dtype=np.int64), np.array(codes, dtype=np.int64))}
    _add_loads(loads, names, link_bytes)
    link_busy = _links_busy(spans_of, bytes_of, names, link_bytes)
    makespan = sched.makespan
    mem = graph.meta.get("memory", {})
    named_by = _named_by({d: None for d in devs_code})
    unions: dict[tuple[int, ...], Columns] = {}
    figures: dict[tuple[tuple[int, ...], int], tuple[float, float, float, float]] = {}
    per_gpu = []
    for d in sorted(compute_union):
        cu = compute_union[d]
        key = named_by.get(d, ())
        hit = figures.get((key, id(cu)))  # a folded build's mirrors: the built GPU's spans, once
        if hit is None:
            co = unions.get(key)
            if co is None:
                co = unions[key] = merged_columns(np.concatenate([comm_of[k][0] for k in key]),
                                                  np.concatenate([comm_of[k][1] for k in key])) if key else _NONE
            busy = columns_length(*cu)
            hit = figures[(key, id(cu))] = (busy * 1e3, columns_length(*co) * 1e3, subtract_length(co, cu) * 1e3,
                                            max(0.0, makespan - busy) * 1e3)
        per_gpu.append(
            GpuStats(
                gpu=d,
                compute_ms=hit[0],
                comm_ms=hit[1],
                exposed_comm_ms=hit[2],
                idle_ms=hit[3],
                peak_memory_bytes=int(mem.get(d, {}).get("peak_bytes", 0)),
            )
        )
    per_link = [
        LinkStats(
            link=name,
            bytes=link_bytes[name],
            busy_ms=link_busy[name] * 1e3,
            utilization=(link_busy[name] / makespan) if makespan > 0 else 0.0,
        )
        for name in sorted(link_bytes, key=_natural_key)
    ]
    return per_gpu, per_link


_NONE: Columns = (np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.float64))


def _grouped(tasks: np.ndarray, group: np.ndarray):
    """(group, its tasks in order) per distinct value of ``group`` (one per task): grouped by one
    stable sort, not a mask per group (4,096 GPUs × 1.6e6 tasks)."""
    if not len(tasks):
        return
    order = np.argsort(group, kind="stable")
    values, firsts = np.unique(group[order], return_index=True)
    for g, lo, hi in zip(values.tolist(), firsts.tolist(), [*firsts[1:].tolist(), len(order)]):
        yield g, tasks[order[lo:hi]]


def _add_loads(loads: dict, names: list[str], link_bytes: dict[str, int]) -> None:
    """Add each charge's bytes per link (rounded, times its calls) to ``link_bytes``: per link,
    with numpy over the resource ids where a charge's tasks name its load's links in the load's
    order (a macro collective on 8,192 links), one by one otherwise. Whole numbers: any order
    sums them alike."""
    total = np.zeros(len(names), dtype=np.int64)
    named = np.zeros(len(names), dtype=bool)
    names_of: dict[int, tuple[str, ...]] = {}  # id of a links tuple (the graph's own) -> their names
    for (rids, _), (load, calls) in loads.items():
        in_order = names_of.get(id(rids))
        if in_order is None:
            in_order = names_of[id(rids)] = tuple(map(names.__getitem__, rids))
        if len(load) == len(rids) and tuple(load) == in_order:  # compared in C: 8,192 names a charge
            ids = np.fromiter(rids, dtype=np.int64, count=len(rids))
            np.add.at(total, ids, calls * np.rint(np.fromiter(load.values(), dtype=np.float64,
                                                              count=len(load))).astype(np.int64))
            named[ids] = True
        else:
            for rid in rids:
                name = names[rid]
                link_bytes[name] = link_bytes.get(name, 0) + calls * int(round(load[name]))
    for rid, nbytes in zip(np.flatnonzero(named).tolist(), total[named].tolist()):
        name = names[rid]
        link_bytes[name] = link_bytes.get(name, 0) + nbytes


def _named_by(spans_of: dict[tuple[int, ...], list]) -> dict[int, tuple[int, ...]]:
    """Per GPU, the positions (in ``spans_of``'s order) of the device tuples naming it."""
    out: dict[int, list[int]] = {}
    for k, devs in enumerate(spans_of):
        for d in devs:
            hit = out.get(d)
            if hit is None:
                out[d] = [k]
            else:
                hit.append(k)
    return {d: tuple(ks) for d, ks in out.items()}


def _links_busy(spans_of: dict[tuple[int, ...], Columns], bytes_of: dict[tuple[int, ...], int],
                names: list[str], link_bytes: dict[str, int]) -> dict[str, float]:
    """Each link's busy time (the union of the spans of every link tuple holding it), adding the
    tuples' uniform bytes to ``link_bytes``.

    A collective on a large ring holds 10^4 links, and every link of the ring is held by the same
    few collectives: links are grouped by the list of tuples holding them (with numpy), and a
    list's busy time is found once for all its links.
    """
    tuples = list(spans_of)
    if not tuples:
        return {}
    sizes = np.fromiter(map(len, tuples), dtype=np.int64, count=len(tuples))
    flat = np.fromiter(chain.from_iterable(tuples), dtype=np.int64, count=int(sizes.sum()))
    owner = np.repeat(np.arange(len(tuples), dtype=np.int64), sizes)
    order = np.argsort(flat, kind="stable")  # per link, its tuples in first-seen order
    flat, owner = flat[order], owner[order]
    starts = np.flatnonzero(np.concatenate(([True], flat[1:] != flat[:-1])))
    uniform = np.array([bytes_of.get(t, 0) for t in tuples], dtype=np.int64)
    added = np.add.reduceat(uniform[owner], starts).tolist()
    bounds = [*starts.tolist(), len(flat)]
    unions = [merged_columns(*spans_of[t]) for t in tuples]
    by_owners: dict[tuple[int, ...], float] = {}
    out: dict[str, float] = {}
    owners = owner.tolist()
    for j, rid in enumerate(flat[starts].tolist()):
        key = tuple(owners[bounds[j]:bounds[j + 1]])
        hit = by_owners.get(key)
        if hit is None:
            spans = unions[key[0]] if len(key) == 1 else merged_columns(np.concatenate([unions[t][0] for t in key]),
                                                                        np.concatenate([unions[t][1] for t in key]))
            hit = by_owners[key] = columns_length(*spans)
        name = names[rid]
        out[name] = hit
        link_bytes[name] = link_bytes.get(name, 0) + added[j]
    return out


def _natural_key(name: str) -> tuple:
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
