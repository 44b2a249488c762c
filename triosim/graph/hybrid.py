"""Hybrid parallelism: data × tensor × pipeline parallel degrees in one task DAG, with ZeRO.

What it models:

- **Mesh.** ``dp × tp × pp`` GPUs numbered by :class:`~triosim.graph.rank_map.RankMap` (TP
  innermost by default). Replica (d, t) is one pipeline: pipeline rank p on GPU ``rank(d, t, p)``.
- **Pipeline.** The stages, micro-batches and schedules of case 4
  (:mod:`triosim.graph.pipeline.stages`): pipeline rank p runs stage p (stages p, p + P, … under
  the interleaved schedule) of every (d, t), its blocks in the schedule's order; every buffer
  crossing stages is sent hop by hop between consecutive stages of the same (d, t), per
  micro-batch.
- **Tensor parallel.** Every op takes its traced time × the TP plan's time scale × the
  micro-batch's share of the batch; after an op the plan names, its collective runs on the TP
  group of (d, s) (payload scaled with the micro-batch), and the readers of the buffers it
  completes wait for it (a buffer sent to the next stage leaves after it).
- **Data parallel.** Each stage's parameter gradients (its own shard under TP) are packed into
  DDP buckets of ``--bucket-mb`` in the order backward completes them; a bucket's collective runs
  on the DP group of (t, s) once the last micro-batch's backward op completing it has run there;
  the stage's optimizer share waits for the last bucket. Gradient accumulation: micro-batches
  before the last do not synchronise (as DDP's ``no_sync``).
- **ZeRO.** 0: buckets are all-reduced. 1 and 2: buckets are reduce-scattered, every DP rank
  updates its 1/N_dp of the optimizer state (optimizer time / N_dp) and the updated parameters
  are all-gathered (2Ψ of payload per step). 3 (FSDP): as 2, without the final all-gather; the
  parameters are grouped into units of ``--bucket-mb`` in forward order and each unit is
  all-gathered before its first forward op and again before its first backward op in every
  micro-batch, the next unit's gather starting as soon as the current unit starts computing
  (prefetch; 3Ψ per step with one micro-batch). Memory: parameters (ZeRO-3), gradients
  (ZeRO ≥ 2) and optimizer state (ZeRO ≥ 1) take 1/N_dp on each GPU; a gathered unit's whole
  parameters count from its gather until the pass's last op using them (two units with prefetch).
- **Representatives.** Replicas (d, t) do the same work; on large meshes only (0, 0) is built and
  its collectives are charged with their closed form on the group's links
  (:mod:`triosim.graph.collectives.group_comm`); ``--exact`` builds every GPU, and so does the default while
  the graph stays small (``AUTO_EXACT_TASKS``).

With one axis only it is the case builder it generalises: ``--dp N`` = case 2, ``--pp N`` =
case 4, ``--tp N --tp-style per-op`` = case 3 (tests compare them).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..compute.op_time import op_seconds
from ..errors import ConfigError
from ..hardware.platform import Platform, gpu_node
from ..trace import Trace
from .collectives.group_comm import Charge, GroupComm, wire_bytes_per_gpu
from .collectives.star_routes import prime_routes
from .data.data_parallel import MIB, gradient_order
from .data.zero import (
    BufferRoles,
    buffer_roles,
    bytes_per_step,
    fsdp_units,
    gathered_copies,
    zero_divisor,
)
from .layer_count import check_pipeline_depth
from .memory.plan import MemoryReport, Step, plan_replicas
from .memory.stage import stage_occupancy
from .pipeline.builder import micro_batch_sizes
from .pipeline.schedules import interleaved_order
from .pipeline.stages import (
    BACKWARD,
    FORWARD,
    OPTIMIZER,
    PipelinePlan,
    block_order,
    buffer_versions,
    optimizer_buffers,
    plan_stages,
)
from .rank_map import RankMap
from .replica_symmetry import replicas_alike
from .single import op_label, persistent_buffers, record_memory
from .strategy import Strategy
from .tasks import TaskGraph
from .tensor.plans import tensor_plan

# Without --exact/--representatives, every GPU is built while dp·tp·ops·micro-batches stays below
# this many compute tasks; above it one representative per role.
AUTO_EXACT_TASKS = 100_000
# Where replicas meet the topology differently (see triosim.graph.replica_symmetry), every GPU is
# built up to this many compute tasks, even with --representatives.
UNALIKE_EXACT_TASKS = 2_000_000

# ----------------------------------------------------------------------------- the stage plan


class _StageView:
    """``platform`` seen by the stage planner as a pipeline on ``stage_gpus`` (GPU k = stage k)."""

    def __init__(self, platform: Platform, stage_gpus: Sequence[int]) -> None:
        self._platform = platform
        self._gpus = tuple(stage_gpus)
        self.num_gpus = len(self._gpus)

    def _map(self, node: str) -> str:
        if node.startswith("gpu") and node[3:].isdigit():
            return gpu_node(self._gpus[int(node[3:])])
        return node

    def route(self, src: str, dst: str) -> tuple[str, ...]:
        return self._platform.route(self._map(src), self._map(dst))

    def __getattr__(self, name: str):
        return getattr(self._platform, name)


def stage_plan(trace: Trace, platform: Platform, strategy: Strategy, fractions: Sequence[float],
               stage_gpus: Sequence[int]) -> PipelinePlan:
    """The pipeline plan of ``len(stage_gpus)`` stages, stage s on ``stage_gpus[s]``."""
    if "num_stages" in inspect.signature(plan_stages).parameters:
        return plan_stages(trace, platform, strategy, fractions, num_stages=len(stage_gpus),
                           stage_gpus=tuple(stage_gpus))
    return plan_stages(trace, _StageView(platform, stage_gpus), strategy, fractions)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- TP data flow


def tp_waits(trace: Trace, collectives) -> tuple[list[tuple[int, ...]], dict[tuple[int, str], int]]:
    """Per op, the TP collectives whose buffers it reads; and (writer op, buffer) -> the collective
    after which that version of the buffer is complete (as case 3: a buffer stays covered by the
    latest collective that carried it)."""
    at: dict[int, list] = {}
    for c in collectives:
        at.setdefault(c.op, []).append(c)
    covered: dict[str, int] = {}
    last_writer: dict[str, int] = {}
    waits: list[tuple[int, ...]] = []
    cover: dict[tuple[int, str], int] = {}
    for i in range(len(trace.ops)):
        waits.append(tuple(dict.fromkeys(covered[k] for k in trace.reads[i] if k in covered)))
        for k in trace.writes[i]:
            last_writer[k] = i
        for c in at.get(i, ()):
            for k in c.buffers:
                covered[k] = i
                if k in last_writer:
                    cover[(last_writer[k], k)] = i
    return waits, cover


# ----------------------------------------------------------------------------- builder state


@dataclass
class _Build:
    trace: Trace
    platform: Platform
    strategy: Strategy
    ranks: RankMap
    plan: PipelinePlan
    tpp: object
    fractions: list[float]
    replicas: list[tuple[int, int]]
    roles: BufferRoles
    graph: TaskGraph = field(default_factory=TaskGraph)
    task: dict[tuple[int, int, int, int], int] = field(default_factory=dict)  # (d, t, op, mb) -> task
    tp_done: dict[tuple[int, int, int], dict[int, int]] = field(default_factory=dict)  # (op, mb, d) -> {gpu: t}
    seq: dict[int, list[tuple[int, tuple[int, ...], int | None]]] = field(default_factory=dict)  # gpu -> (task, ops, mb)
    stats: dict[str, dict[str, float]] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    key_flags: dict[int, tuple] = field(default_factory=dict)
    size_cache: dict[tuple[str, float], int] = field(default_factory=dict)
    prefixes: list[str] = field(default_factory=list)  # micro-batch r -> "mb{r}:" (memory keys)
    versions: list = field(default_factory=list)  # buffer_versions of the trace
    fuse: bool = False  # one task per run of ops with nothing entering or leaving mid-run
    buffer_ids: dict[str, int] = field(default_factory=dict)  # trace tensor -> index (memory keys)
    optimizer_stages: dict[int, dict[int, float]] = field(default_factory=dict)  # optimizer op -> rank -> share
    buffer_rank: dict[str, int] = field(default_factory=dict)  # buffer -> pipeline rank of its stage
    # ZeRO-3 gathered copies: (stage, op, mb) -> (keys freed, keys allocated); their bytes; per
    # stage, the gathered bytes alive at each step of its memory program
    gathered: dict[tuple[int, int, int], tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    gathered_sizes: dict[str, int] = field(default_factory=dict)
    gathered_at: dict[int, list[int]] = field(default_factory=dict)
    # Memory planning: each optimizer op's buffers per owning rank; persistent buffers' indices
    optimizer_split: dict[int, dict[int, tuple]] = field(default_factory=dict)
    persistent_ids: set[int] | None = None

    def gpus(self, s: int) -> list[int]:
        return [self.ranks.rank(d, t, s) for d, t in self.replicas]

    def count(self, kind: str, op: str, group: Sequence[int], nbytes: int) -> None:
        """Tally a collective of replica (0, 0)'s groups for the summary."""
        st = self.stats.setdefault(kind, {"collectives": 0, "payload_bytes": 0, "wire_bytes_per_gpu": 0.0})
        st["collectives"] += 1
        st["payload_bytes"] += int(nbytes)
        st["wire_bytes_per_gpu"] += wire_bytes_per_gpu(op, len(group), nbytes)

    def size(self, buffer: str, fraction: float) -> int:
        """Bytes of ``buffer`` on one GPU for a micro-batch of ``fraction`` of the batch."""
        hit = self.size_cache.get((buffer, fraction))
        if hit is None:
            hit = self.size_cache[(buffer, fraction)] = self._size(buffer, fraction)
        return hit

    def _size(self, buffer: str, fraction: float) -> int:
        t = self.trace.tensors[buffer].bytes
        if buffer not in self.trace.batch_invariant:
            t = int(round(t * fraction))
        div = self.tpp.shard_divisor.get(buffer, 1) * zero_divisor(self.roles, buffer, self.strategy.zero,
                                                                    self.ranks.dp)
        return -(-t // div) if div > 1 else t


def _key(trace: Trace, buffer: str, r: int) -> str:
    return buffer if buffer in trace.batch_invariant else f"mb{r}:{buffer}"


def build(trace: Trace, platform: Platform, strategy: Strategy, fuse_runs: bool = True) -> TaskGraph:
    """The hybrid DAG of ``strategy``'s degrees on ``platform`` (one representative per role
    unless ``strategy.exact``). A representative build runs each stretch of ops that nothing
    outside the GPU enters or leaves as one task (``fuse_runs``; same times, fewer tasks)."""
    dp, tp, pp = strategy.degrees(platform.num_gpus)
    ranks = RankMap(dp, tp, pp, tuple(strategy.rank_order))
    if ranks.size != platform.num_gpus:
        raise ConfigError(f"--dp {dp} × --tp {tp} × --pp {pp} = {ranks.size} GPUs, but the platform has "
                          f"{platform.num_gpus}")
    virtual = strategy.virtual_stages if strategy.schedule == "interleaved" else 1
    check_pipeline_depth(trace, pp, virtual)
    sizes = micro_batch_sizes(trace.batch_size, strategy.micro_batch_size)
    fractions = [m / trace.batch_size for m in sizes]
    exact = strategy.exact
    tasks = dp * tp * len(trace.ops) * len(fractions)
    if exact is None:  # every GPU while that stays small: then even contention between groups is simulated
        exact = tasks <= AUTO_EXACT_TASKS
    replica_warning = None
    if not exact and not replicas_alike(platform, ranks):
        # One replica cannot stand for the others: build them all while that stays affordable.
        if tasks <= UNALIKE_EXACT_TASKS:
            exact = True
        else:
            replica_warning = (f"the replicas meet the nodes differently (tp {tp} × pp {pp} GPUs a replica, "
                               f"{platform.node_of.count(0)} a node): replica (dp 0, tp 0) stands for all of them and "
                               "the times may be off; --exact builds every GPU")
    replicas = [(d, t) for d in range(dp) for t in range(tp)] if exact else [(0, 0)]
    # interleaved: stage P−1 (last GPU) hands over to stage P (first GPU again)
    prime_routes(platform, ((ranks.rank(d, t, s), ranks.rank(d, t, (s + e) % pp)) for d, t in replicas
                            for s in range(pp) for e in (-1, 1) if 0 <= s + e < pp or (virtual > 1 and pp > 1)))
    plan = stage_plan(trace, platform, strategy, fractions, ranks.stage_gpus(0, 0))
    tpp = tensor_plan(trace, tp, strategy.effective_tp_style, strategy.sequence_parallel)
    # Fused runs of ops keep every time exact only while no memcpy can cut into a run (a run's
    # buffers all fit on the GPU); when the memory plan needs one, the graph is built op by op.
    fuse = fuse_runs and not exact and strategy.initial_placement == "gpu"
    while True:
        g = _build(trace, platform, strategy, ranks, plan, tpp, fractions, replicas, exact, fuse)
        if not g.meta.pop("needs_memcpy") or not fuse:
            g.meta["hybrid"]["replica_warning"] = replica_warning
            return g
        fuse = False


def _build(trace: Trace, platform: Platform, strategy: Strategy, ranks: RankMap, plan: PipelinePlan, tpp,
           fractions: list[float], replicas: list[tuple[int, int]], exact: bool, fuse: bool) -> TaskGraph:
    tp, pp = ranks.tp, ranks.pp
    b = _Build(trace, platform, strategy, ranks, plan, tpp, fractions, replicas, buffer_roles(trace), fuse=fuse)
    b.labels = [op_label(trace, i) for i in range(len(trace.ops))]
    b.prefixes = [f"mb{r}:" for r in range(len(fractions))]
    b.versions = buffer_versions(trace, plan.phase) if pp > 1 else []
    comm = GroupComm(b.graph, platform, strategy.collective_detail, exact)
    waits, cover = tp_waits(trace, tpp.collectives if tp > 1 else ())
    colls = {c.op: c for c in tpp.collectives} if tp > 1 else {}
    params_of = _stage_params(b)
    for p in range(pp):
        _add_stage(b, comm, p, waits, colls, params_of[p])
    _add_crossings(b, cover)
    reports = _plan_memory(b)
    record_memory(b.graph, reports)
    b.graph.meta["needs_memcpy"] = any(r.fetch_tasks or r.evictions for r in reports)
    g = b.graph
    g.meta["devices"] = sorted(gg for s in range(pp) for gg in b.gpus(s))
    g.meta["cluster_names"] = {
        gg: f"GPU {gg} (dp {d}, tp {t}, stage {s})" for gg in g.meta["devices"] for d, t, s in [ranks.coords(gg)]
    }
    g.meta["hybrid"] = _summary(b, comm, params_of, reports)
    return g


# ----------------------------------------------------------------------------- per stage


def _stage_params(b: _Build) -> list[list[str]]:
    """Parameters each pipeline rank owns (those of its stages: the stage of their first
    reader), in gradient order."""
    out: list[list[str]] = [[] for _ in range(b.ranks.pp)]
    for p in gradient_order(b.trace):
        out[b.plan.rank_of(b.plan.buffer_stage.get(p, 0))].append(p)
    return out


@dataclass(frozen=True)
class _Bucket:
    index: int
    params: tuple[str, ...]
    nbytes: int
    ready_op: int


def _buckets(b: _Build, params: Sequence[str], s: int) -> list[_Bucket]:
    """DDP buckets of one stage's gradients (their per-GPU shard bytes under TP), as
    data_parallel.make_buckets; a bucket is ready after the last gradient's producer."""
    trace = b.trace
    last = trace.last_backward_index()
    cap = b.strategy.bucket_mb * MIB
    out: list[_Bucket] = []
    cur: list[str] = []
    size = 0
    for p in params:
        cur.append(p)
        size += -(-trace.tensors[p].bytes // b.tpp.shard_divisor.get(p, 1))
        if size >= cap:
            out.append(_Bucket(len(out), tuple(cur), size, max(trace.grad_ready_op.get(q, last) for q in cur)))
            cur, size = [], 0
    if cur:
        out.append(_Bucket(len(out), tuple(cur), size, max(trace.grad_ready_op.get(q, last) for q in cur)))
    return out


def _add_stage(b: _Build, comm: GroupComm, p: int, waits, colls, params: list[str]) -> None:
    """Pipeline rank ``p``'s program on every built replica: its stages' blocks in the schedule's
    order (stages p, p + P, … under the interleaved schedule), then its gradient sync and optimizer."""
    trace, plan, strategy, ranks = b.trace, b.plan, b.strategy, b.ranks
    g = b.graph
    stages = list(range(p, plan.num_stages, ranks.pp))
    ops = {(st, ph): plan.ops_on(st, ph) for st in stages for ph in (FORWARD, BACKWARD)}
    scale = b.tpp.time_scale
    last: dict[tuple[int, int], list[int]] = {rep: [] for rep in b.replicas}
    gpus = b.gpus(p)
    for gpu in gpus:
        b.seq[gpu] = []
    ds = sorted({d for d, _ in b.replicas})
    ts = sorted({t for _, t in b.replicas})
    full = lambda q: -(-trace.tensors[q].bytes // b.tpp.shard_divisor.get(q, 1))  # noqa: E731
    units_of = {st: fsdp_units(trace, plan, params, st, strategy.bucket_mb * MIB, full) for st in stages} \
        if strategy.zero == 3 else {}
    if units_of and ranks.dp > 1:
        for st, units in units_of.items():
            copies = gathered_copies(trace, plan, units, st, len(b.fractions))
            b.gathered.update({(p, *at): keys for at, keys in copies.steps.items()})
            b.gathered_sizes.update(copies.sizes)
    gathered: dict[tuple, int] = {}  # (d, t) -> latest unit gather on that GPU; (d, t, "unit", k) -> unit k's
    # Loop invariants of the hot loop below (one iteration per segment, micro-batch and replica).
    labels = b.labels
    waits_here = {i: tuple(c for c in waits[i] if plan.stage[c] == plan.stage[i])
                  for block in ops.values() for i in block}
    reps = list(zip(b.replicas, gpus))
    tp_groups = {d: comm.ordered(ranks.tp_group(d, p)) for d in ds}
    members = {d: [(t, ranks.rank(d, t, p)) for t in ts] for d in ds}
    tp_parallel = partial(_tp_groups, ranks, p)
    add_compute, task_of, tp_done, seq = g.add_compute, b.task, b.tp_done, b.seq
    r_count = len(b.fractions)
    # A representative build (replica (0, 0) only, each TP collective a closed-form task) charges
    # each distinct (op, bytes) once: the same collective recurs in every micro-batch.
    gpu0 = gpus[0]
    built0 = (gpu0,)
    rep_only = _charges_once(b, comm, tp_groups[0])
    charged: dict[tuple[int, int], tuple[Charge, float]] = {}
    segments: dict[tuple[int, str], list[list[int]]] = {}
    for st in stages:
        cut_before, cut_after = _segment_cuts(b, st, params, waits_here, colls, units_of.get(st))
        for ph in (FORWARD, BACKWARD):
            segments[(st, ph)] = _segments(ops[(st, ph)], cut_before, cut_after, b.fuse)
    # Each segment's fixed facts, once per (stage, phase): the loop below runs once per segment,
    # micro-batch and replica. (first op, last op, label, attributes, ops, TP collectives it
    # waits for, phase, the TP collective after it or None, that collective's label start)
    seg_facts: dict[tuple[int, str], list[tuple]] = {}
    for key, segs in segments.items():
        facts = seg_facts[key] = []
        for seg in segs:
            i, i_last = seg[0], seg[-1]
            c = colls.get(i_last)
            # a run of ops nothing outside the GPU waits for or feeds: one task, same times
            label, extra = (labels[i], {}) if len(seg) == 1 else \
                (f"{labels[i]} .. {labels[i_last]}", {"ops": tuple(seg)})
            facts.append((i, i_last, label, extra, tuple(seg), waits_here[i], trace.ops[i].stage, c,
                          None if c is None else f"tp {c.kind.replace('_', '')} {labels[i_last]}"))
    seg_time: dict[tuple[int, str, float], list[float]] = {}  # (stage, phase, fraction) -> seconds per segment
    if plan.virtual > 1:
        order = interleaved_order(ranks.pp, r_count, p, plan.virtual)
    else:
        order = [(ph, r, 0) for ph, r in block_order(strategy.schedule, ranks.pp, r_count, p)]
    stats = b.stats
    for ph, r, v in order:
        s = v * ranks.pp + p
        if not ops[(s, ph)]:
            continue
        units = units_of.get(s)
        frac = b.fractions[r]
        unit_at: dict[int, int] = {}
        if units is not None and units[ph]:
            unit_at = {u.first_op: k for k, u in enumerate(units[ph])}
            _gather_unit(b, comm, s, units[ph], 0, ph, r, last, gathered, ts)
        durs = seg_time.get((s, ph, frac))
        if durs is None:
            mb = max(1, round(frac * trace.batch_size))
            durs = seg_time[(s, ph, frac)] = []
            for seg in segments[(s, ph)]:
                dur = 0.0
                for j in seg:
                    dur += op_seconds(trace, j, mb) * scale[j]
                durs.append(dur)
        mb_s = f" mb{r}"
        for (i, i_last, base, extra, seg_ops, w, phase, c, c_name), dur in zip(seg_facts[(s, ph)], durs):
            k = unit_at.get(i) if unit_at else None
            if k is not None and k + 1 < len(units[ph]):
                _gather_unit(b, comm, s, units[ph], k + 1, ph, r, last, gathered, ts)
            label = base + mb_s
            for rep, gpu in reps:
                after = last[rep]
                if w or k is not None:
                    after = list(after)
                    for c_op in w:
                        done = tp_done.get((c_op, r, rep[0]))
                        if done is not None:
                            after.append(done[gpu])
                    if k is not None:
                        after.append(gathered[(*rep, "unit", k)])
                    after = list(dict.fromkeys(after))
                task = add_compute(gpu, dur, f"{label} gpu{gpu}", after=after, op=i, stage=phase, microbatch=r,
                                   stage_index=s, **extra)
                # Only a run's ends are looked up (a crossing buffer's writer or reader, a bucket's
                # last gradient, the op a TP collective follows): the cuts put them there.
                task_of[(*rep, i, r)] = task_of[(*rep, i_last, r)] = task
                seq[gpu].append((task, seg_ops, r))
                last[rep] = [task]
            if c is not None:
                nbytes = c.nbytes if frac == 1.0 else int(round(c.nbytes * frac))
                name = f"{c_name}{mb_s} stage{s} dp"
                if rep_only:  # one built GPU per group: the task its charge, found once, describes
                    charge, wire = _tp_charge(comm, charged, c, nbytes, tp_groups[0], tp_parallel)
                    task = comm.add_charged(charge, f"{name}0", [task_of[(0, 0, i_last, r)]], built0,
                                            op_index=i_last, microbatch=r, group_kind="tp")
                    tp_done[(i_last, r, 0)] = {gpu0: task}
                    tally = stats.get("tp")
                    if tally is None:
                        tally = stats["tp"] = {"collectives": 0, "payload_bytes": 0, "wire_bytes_per_gpu": 0.0}
                    tally["collectives"] += 1  # as b.count, without looking the group up again
                    tally["payload_bytes"] += nbytes
                    tally["wire_bytes_per_gpu"] += wire
                    continue
                for d in ds:
                    group = tp_groups[d]
                    after = {gpu: [task_of[(d, t, i_last, r)]] for t, gpu in members[d]}
                    tp_done[(i_last, r, d)] = comm.run(c.kind, group, nbytes, f"{name}{d}", after,
                                                       parallel=tp_parallel, op_index=i_last, microbatch=r,
                                                       group_kind="tp")
                    if d == 0:
                        b.count("tp", c.kind, group, nbytes)
    _add_gradient_sync(b, comm, p, params, last, ts)


def _charges_once(b: _Build, comm: GroupComm, tp_group: tuple[int, ...]) -> bool:
    """Whether a stage's TP collectives are added from a charge found once per (op, bytes): in a
    representative build (replica (0, 0) alone, collectives in closed form) on TP groups of 2 or more."""
    return b.replicas == [(0, 0)] and not comm.exact and len(tp_group) > 1


def _tp_charge(comm: GroupComm, charged: dict, c, nbytes: int, group: tuple[int, ...],
               parallel) -> tuple[Charge, float]:
    """The charge of TP collective ``c`` with ``nbytes`` on ``group`` and the bytes each GPU
    sends, found once per (op, bytes) (``charged`` keeps them): micro-batches of one size repeat
    the same collective."""
    hit = charged.get((c.op, nbytes))
    if hit is None:
        charge = comm.charge(c.kind, group, nbytes, parallel)
        assert charge is not None  # representative, group of 2 or more (_charges_once)
        hit = charged[(c.op, nbytes)] = (charge, wire_bytes_per_gpu(c.kind, len(group), nbytes))
    return hit


def _segment_cuts(b: _Build, s: int, params: list[str], waits_here, colls, units) -> tuple[set[int], set[int]]:
    """Ops of stage ``s`` that something outside its GPU's stream waits for (cut after them) or
    that wait for something outside it (cut before them): TP collectives and what reads their
    result, buffers crossing stages, DDP buckets, ZeRO-3 unit gathers. Between two cuts a GPU runs
    its ops back to back, so one task of their summed time starts and ends when they would."""
    before = {i for i, w in waits_here.items() if w}
    after = {i for i in colls if b.plan.stage[i] == s}
    for v in b.versions:
        src = b.plan.stage[v.writer]
        readers = [c for c in v.readers if b.plan.stage[c] != src]
        if not readers:
            continue
        if src == s:
            after.add(v.writer)
        before.update(c for c in readers if b.plan.stage[c] == s)
    after.update(bk.ready_op for bk in _buckets(b, params, s))
    if units is not None:
        for phase_units in units.values():
            before.update(u.first_op for u in phase_units)
    return before, after


def _segments(block: list[int], cut_before: set[int], cut_after: set[int], fuse: bool) -> list[list[int]]:
    """``block`` cut into runs of ops (one op each unless ``fuse``)."""
    if not fuse:
        return [[i] for i in block]
    out: list[list[int]] = []
    cur: list[int] = []
    for i in block:
        if cur and i in cut_before:
            out.append(cur)
            cur = []
        cur.append(i)
        if i in cut_after:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def _gather_unit(b: _Build, comm: GroupComm, s: int, units, k: int, ph: str, r: int, last, gathered, ts) -> None:
    """ZeRO-3: all-gather unit ``k``'s parameters on each DP group, after the previous gather and
    once the op before the current unit has run (one unit of prefetch)."""
    ranks = b.ranks
    u = units[k]
    p = b.plan.rank_of(s)  # stage s runs on pipeline rank p
    for t in ts:
        group = ranks.dp_group(t, p)
        after = {}
        for d, tt in b.replicas:
            if tt != t:
                continue
            prev = gathered.get((d, t))
            after[ranks.rank(d, t, p)] = [*last[(d, t)], *([prev] if prev is not None else [])]
        done = comm.run("all_gather", group, u.nbytes, f"zero3 gather unit{k} {'fwd' if ph == FORWARD else 'bwd'} "
                        f"mb{r} stage{s} tp{t}", after, parallel=lambda p=p: _dp_groups(ranks, p),
                        microbatch=r, group_kind="dp", unit=k)
        for d, tt in b.replicas:
            if tt == t:
                gathered[(d, t)] = done[ranks.rank(d, t, p)]
                gathered[(d, t, "unit", k)] = done[ranks.rank(d, t, p)]
        if t == 0:
            b.count("dp", "all_gather", group, u.nbytes)


def _tp_groups(ranks: RankMap, s: int):
    return (ranks.tp_group(d, s) for d in range(ranks.dp))


def _dp_groups(ranks: RankMap, s: int):
    return (ranks.dp_group(t, s) for t in range(ranks.tp))


def _add_gradient_sync(b: _Build, comm: GroupComm, s: int, params: list[str], last, ts) -> None:
    """DDP buckets (ZeRO-0 all-reduce, else reduce-scatter), the optimizer share, and ZeRO-1/2's
    all-gather of the updated parameters."""
    trace, plan, ranks, strategy = b.trace, b.plan, b.ranks, b.strategy
    zero = strategy.zero
    r_last = len(b.fractions) - 1
    done: dict[tuple[int, int], list[int]] = {rep: [] for rep in b.replicas}
    op = "all_reduce" if zero == 0 else "reduce_scatter"
    for bk in (_buckets(b, params, s) if ranks.dp > 1 or zero else []):
        for t in ts:
            group = ranks.dp_group(t, s)
            after = {}
            for d, tt in b.replicas:
                if tt != t:
                    continue
                ready = b.task.get((d, t, bk.ready_op, r_last))
                after[ranks.rank(d, t, s)] = [*(last[(d, t)] if ready is None else [ready]), *done[(d, t)]]
            label = f"{'allreduce' if zero == 0 else 'reducescatter'} bucket{bk.index} stage{s} tp{t}"
            out = comm.run(op, group, bk.nbytes, label, after, parallel=lambda s=s: _dp_groups(ranks, s),
                           bucket=bk.index, group_kind="dp")
            for d, tt in b.replicas:
                if tt == t:
                    done[(d, t)] = [out[ranks.rank(d, t, s)]]
            if t == 0:
                b.count("dp", op, group, bk.nbytes)
    scale = b.tpp.time_scale
    if not b.optimizer_stages:  # every optimizer op's ranks and shares, once (a foreach op touches every parameter)
        b.optimizer_stages.update((i, plan.optimizer_ranks(i)) for i, ph in enumerate(plan.phase) if ph == OPTIMIZER)
    opt_ops = [i for i, shares in b.optimizer_stages.items() if s in shares]
    for i in opt_ops:
        share = b.optimizer_stages[i][s]  # the sum over rank s's stages
        dur = trace.ops[i].duration_s * share * scale[i] / (ranks.dp if zero else 1)
        suffix = "" if share >= 1.0 else f" {share:.0%} share"
        for d, t in b.replicas:
            gpu = ranks.rank(d, t, s)
            task = b.graph.add_compute(gpu, dur, f"{op_label(trace, i)}{suffix} gpu{gpu}",
                                       after=[*last[(d, t)], *done[(d, t)]], op=i, stage=trace.ops[i].stage,
                                       stage_index=s, share=share)
            b.seq[gpu].append((task, (i,), None))
            last[(d, t)] = [task]
            done[(d, t)] = []
    if zero in (1, 2) and ranks.dp > 1:
        nbytes = sum(-(-trace.tensors[p].bytes // b.tpp.shard_divisor.get(p, 1)) for p in params)
        for t in ts:
            group = ranks.dp_group(t, s)
            after = {ranks.rank(d, t, s): [*last[(d, t)], *done[(d, t)]] for d, tt in b.replicas if tt == t}
            comm.run("all_gather", group, nbytes, f"zero{zero} gather parameters stage{s} tp{t}", after,
                     parallel=lambda s=s: _dp_groups(ranks, s), group_kind="dp")
            if t == 0:
                b.count("dp", "all_gather", group, nbytes)


# ----------------------------------------------------------------------------- between stages


def _add_crossings(b: _Build, cover: dict[tuple[int, str], int]) -> None:
    """Every cross-stage buffer version, per micro-batch and replica, hop by hop (as case 4)."""
    plan, ranks = b.plan, b.ranks
    if ranks.pp < 2:
        return
    for v in b.versions:
        src = plan.stage[v.writer]
        readers = [(c, plan.stage[c]) for c in v.readers if plan.stage[c] != src]
        if not readers:
            continue
        c_op = cover.get((v.writer, v.buffer))
        for r, frac in enumerate(b.fractions):
            nbytes = b.size(v.buffer, frac)
            for d, t in b.replicas:
                arrive: dict[int, int] = {}
                for step, direction in ((1, "forward"), (-1, "backward")):
                    dests = [st for _, st in readers if (st - src) * step > 0]
                    if not dests:
                        continue
                    far = max(dests) if step > 0 else min(dests)
                    prev = b.task[(d, t, v.writer, r)]
                    done = b.tp_done.get((c_op, r, d)) if c_op is not None else None
                    if done is not None:
                        prev = done[ranks.rank(d, t, plan.rank_of(src))]
                    for a in range(src, far, step):
                        ga, gb = ranks.rank(d, t, plan.rank_of(a)), ranks.rank(d, t, plan.rank_of(a + step))
                        prev = b.graph.add_transfer(
                            b.platform, ga, gb, nbytes, f"send {v.buffer} mb{r} gpu{ga}->gpu{gb}", after=[prev],
                            microbatch=r, stage_index=a, buffer=v.buffer, direction=direction, dst_stage=a + step)
                        arrive[a + step] = prev
                for c, st in readers:
                    b.graph.add_edge(arrive[st], b.task[(d, t, c, r)])


# ----------------------------------------------------------------------------- memory


def _plan_memory(b: _Build) -> list[MemoryReport]:
    """Each built GPU's program in run order, buffers keyed per micro-batch (as case 4); GPUs of
    one stage run the same program, so one plan serves them all when it needs no memcpy."""
    trace = b.trace
    persistent = persistent_buffers(trace)
    received = _received(b)
    reports: list[MemoryReport] = []
    for s in range(b.ranks.pp):
        gpus = b.gpus(s)
        fast = _stage_memory_fits(b, s, persistent, received.get(s, [])) \
            if b.strategy.initial_placement == "gpu" else None
        if fast is not None:
            reports += fast
            continue
        sizes: dict[str, int] = {}
        touched: dict[str, bool] = {}
        program: list[tuple[tuple[str, ...], tuple[str, ...], str]] = []  # the same on every GPU of s
        labels: dict[int, str] = {}
        for _, i, r in _op_steps(b, gpus[0]):
            reads, writes, keyed = _step_keys(b, s, i, r)
            if keyed is not None:
                for k, buf, frac in keyed:
                    if k not in sizes:
                        sizes[k] = b.size(buf, frac)
                for k in reads:
                    touched.setdefault(k, True)
                for k in writes:
                    touched.setdefault(k, False)
            else:
                frac = b.fractions[r]
                flags = b.key_flags[i]
                for key, (k, _) in zip(reads, flags[0]):
                    if key not in touched:
                        touched[key] = True
                        sizes[key] = b.size(k, frac)
                for key, (k, _) in zip(writes, flags[1]):
                    if key not in touched:
                        touched[key] = False
                        sizes[key] = b.size(k, frac)
            extra = b.gathered.get((s, i, r)) if r is not None else None
            if extra is not None:  # ZeRO-3: a unit's full parameters, allocated and freed here
                reads, writes = (*reads, *extra[0]), (*writes, *extra[1])
                for k in (*extra[0], *extra[1]):
                    sizes[k] = b.gathered_sizes[k]
                    touched[k] = False
            label = labels.get(i)
            if label is None:
                op = trace.ops[i]
                label = labels[i] = f"op {op.op_id} ({op.name}, trace.csv:{op.line}) on stage {s}"
            program.append((reads, writes, label))
        if b.gathered_sizes:
            b.gathered_at[s] = bytes_per_step([(rd, wr) for rd, wr, _ in program], b.gathered_sizes)
        delivered = _delivered(b, received.get(s, []))
        external = [k for k, is_read in touched.items() if is_read and k not in delivered]

        def steps(gpu: int, program=program) -> list[Step]:
            return [Step(task=task, reads=rd, writes=wr, label=lb)
                    for (task, _, _), (rd, wr, lb) in zip(_op_steps(b, gpu), program)]

        reports += plan_replicas(b.graph, b.platform, gpus, steps, sizes, external=external,
                                 persistent=[k for k in touched if k in persistent],
                                 placement=b.strategy.initial_placement)
    return reports


def _op_steps(b: _Build, gpu: int) -> list[tuple[int, int, int | None]]:
    """``gpu``'s program one op at a time: (task, op, micro-batch or None)."""
    return [(task, i, r) for task, ops, r in b.seq[gpu] for i in ops]


def _stage_memory_fits(b: _Build, s: int, persistent: set[str], received: list[str]) -> list[MemoryReport] | None:
    """Stage ``s``'s memory reports when every buffer it touches fits at once (the plan is then
    each buffer's lifetime, computed vectorised); ``None`` otherwise."""
    trace = b.trace
    if any(key[0] == s for key in b.gathered):  # ZeRO-3's gathered copies: planned step by step
        return None
    ids = b.buffer_ids
    if not ids:
        ids.update((name, k) for k, name in enumerate(trace.tensors))
    nb = len(ids)
    names = list(ids)
    inv = trace.batch_invariant

    def template(i: int, r: int | None) -> tuple[list[int], list[bool], list[bool]]:
        if r is None:
            reads, writes, _ = _step_keys(b, s, i, None)
            return [ids[k] for k in (*reads, *writes)], [True] * len(reads) + [False] * len(writes), \
                [False] * (len(reads) + len(writes))
        rd, wr = trace.reads[i], trace.writes[i]
        return ([ids[k] for k in (*rd, *wr)], [True] * len(rd) + [False] * len(wr),
                [k not in inv for k in (*rd, *wr)])

    def size_of(buf: int, fraction: float) -> int:
        return b.size(names[buf], fraction)

    delivered: set[int] = set()
    for name in received:
        k = ids[name]
        if name in inv:
            delivered.add(k)
        else:
            delivered.update((r + 1) * nb + k for r in range(len(b.fractions)))
    if b.persistent_ids is None:
        b.persistent_ids = {ids[k] for k in persistent if k in ids}
    gpus = b.gpus(s)
    runs = b.seq[gpus[0]]
    got = stage_occupancy(runs, template, size_of, b.fractions, nb, delivered, b.persistent_ids,
                          b.platform.capacity_bytes)
    if got is None:
        return None
    occ, _total = got
    peak = int(occ.max()) if len(occ) else 0
    # One counter value per task: the most its ops hold (a task of one op: that op's).
    starts = np.concatenate(([0], np.cumsum([len(ops) for _, ops, _ in runs])[:-1])).astype(np.int64)
    step_bytes = np.maximum.reduceat(occ, starts) if len(occ) else occ
    return [MemoryReport(device=g, peak_bytes=peak, step_tasks=tuple(t for t, _, _ in b.seq[g]), step_bytes=step_bytes)
            for g in gpus]


def _step_keys(b: _Build, s: int, i: int, r: int | None):
    """(read keys, write keys, [(key, buffer, fraction)]) of op ``i`` in micro-batch ``r`` on stage
    ``s`` (``r`` None: its optimizer share)."""
    trace = b.trace
    if r is None:
        split = b.optimizer_split.get(i)
        if split is None:
            split = b.optimizer_split[i] = _optimizer_split(b, i)
        reads, writes, keyed = split.get(s, ((), (), ()))
        return reads, writes, keyed
    flags = b.key_flags.get(i)
    if flags is None:
        inv = trace.batch_invariant
        flags = (tuple((k, k in inv) for k in trace.reads[i]), tuple((k, k in inv) for k in trace.writes[i]))
        b.key_flags[i] = flags
    pref = b.prefixes[r]
    reads = tuple(k if fixed else pref + k for k, fixed in flags[0])
    writes = tuple(k if fixed else pref + k for k, fixed in flags[1])
    return reads, writes, None


def _optimizer_split(b: _Build, i: int) -> dict[int, tuple[tuple[str, ...], tuple[str, ...], tuple]]:
    """Optimizer op ``i``'s buffers per pipeline rank owning them, in first-touch order: (read
    keys, write keys, [(key, buffer, fraction)]) of that rank's share (a foreach op touches
    every parameter: split once, not once per rank)."""
    trace = b.trace
    if not b.buffer_rank:  # buffer -> the pipeline rank owning it, once (optimizer ops touch thousands)
        b.buffer_rank.update((k, b.plan.rank_of(st)) for k, st in b.plan.buffer_stage.items())
    rank0, owner = b.plan.rank_of(0), b.buffer_rank
    op = trace.ops[i]
    in_place = not op.outputs and op.name.endswith("_")
    written, read = set(trace.writes[i]), set(trace.reads[i])
    per: dict[int, tuple[list[str], list[str], list[str]]] = {}
    for k in optimizer_buffers(trace, i):
        mine, reads, writes = per.setdefault(owner.get(k, rank0), ([], [], []))
        mine.append(k)
        if k in read:
            reads.append(k)
        if in_place or k in written:
            writes.append(k)
    return {rank: (tuple(reads), tuple(writes), tuple((k, k, 1.0) for k in mine))
            for rank, (mine, reads, writes) in per.items()}


def _received(b: _Build) -> dict[int, list[str]]:
    """Per pipeline rank, the buffers it receives from another stage (found once for all ranks)."""
    out: dict[int, list[str]] = {}
    if b.ranks.pp < 2:
        return out
    stage, rank_of = b.plan.stage, b.plan.rank_of
    for v in b.versions:
        src = stage[v.writer]
        for rank in {rank_of(stage[c]) for c in v.readers if stage[c] != src}:
            out.setdefault(rank, []).append(v.buffer)
    return out


def _delivered(b: _Build, received: list[str]) -> set[str]:
    """Keys of the ``received`` buffers, every micro-batch's."""
    return {_key(b.trace, k, r) for k in received for r in range(len(b.fractions))}


# ----------------------------------------------------------------------------- summary


def _summary(b: _Build, comm: GroupComm, params_of: list[list[str]], reports: list[MemoryReport]) -> dict:
    """JSON-ready facts: the mesh, the TP plan, collectives per group kind, memory per stage."""
    ranks, tpp = b.ranks, b.tpp
    peak = {r.device: r.peak_bytes for r in reports}
    at_peak = {r.device: int(r.step_bytes.argmax()) for r in reports if r.step_bytes is not None and len(r.step_bytes)}
    memory = []
    for s in range(ranks.pp):
        w = gr = opt = 0
        for k, owner in b.plan.buffer_stage.items():
            if b.plan.rank_of(owner) != s:
                continue
            role = b.roles.role(k)
            nbytes = b.size(k, 1.0)
            if role == "weights":
                w += nbytes
            elif role == "gradients":
                gr += nbytes
            elif role == "optimizer":
                opt += nbytes
        gpu = ranks.rank(0, 0, s)
        p = peak.get(gpu, 0)
        alive = b.gathered_at.get(s)
        gathered = alive[at_peak[gpu]] if alive and gpu in at_peak else 0  # ZeRO-3 copies whole at the peak
        memory.append({"stage": s, "gpu": gpu, "weights_bytes": w, "gradients_bytes": gr, "optimizer_bytes": opt,
                       "gathered_params_bytes": gathered, "gathered_params_max_bytes": max(alive or [0]),
                       "activations_peak_bytes": max(0, p - w - gr - opt - gathered),
                       "peak_bytes": p})
    return {
        "gpus": ranks.size,
        "rank_order": ",".join(ranks.order),
        "representatives": len(b.replicas) < ranks.dp * ranks.tp,
        "built_gpus": len(b.graph.meta.get("devices", [])) or len(b.replicas) * ranks.pp,
        "micro_batches": len(b.fractions),
        "tp_style": getattr(tpp, "style", "per-op") if ranks.tp > 1 else None,
        "tp_blocks": len(getattr(tpp, "blocks", ()) or ()),
        "tp_fallback_reason": getattr(tpp, "fallback_reason", None) if ranks.tp > 1 else None,
        "collectives_dp0_tp0": {k: {kk: (round(vv, 3) if isinstance(vv, float) else vv) for kk, vv in v.items()}
                                 for k, v in sorted(b.stats.items())},
        "link_sharing_unknown": comm.sharing_unknown,
        "stage_parameters": [len(p) for p in params_of],
        "pipeline_warnings": list(b.plan.warnings),  # e.g. the partition search ran out of budget
        "memory": memory,
    }


__all__ = ["build", "stage_plan", "tp_waits"]
