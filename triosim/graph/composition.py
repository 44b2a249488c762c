"""The composition: data × tensor × pipeline parallel degrees in one task DAG, with ZeRO.

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

**Presets.** A ``-case`` run is the composition's preset (:class:`~triosim.graph.strategy.Preset`):
its one axis spread over every GPU, every GPU built (as ``--exact``), one micro-batch unless
the axis is the pipeline's; case 1 synchronises every gradient in one all-reduce after the last
backward op (``gradient_sync="whole"``). A preset keeps its case's names (tasks, memory steps,
tensor-parallel op time t / N) and writes its case's JSON blocks (:mod:`triosim.graph.case_blocks`)
instead of ``hybrid``. So ``--dp N`` = case 2, ``--pp N`` = case 4 and
``--tp N --tp-style per-op`` = case 3 in every number (tests compare them).

Its steps, in order (:meth:`Composition.assemble`): each pipeline rank's program with its TP
collectives and ZeRO-3 gathers (:mod:`triosim.graph.pipeline.rank_program`), then its gradient
sync and optimizer share (:mod:`triosim.graph.data.gradient_sync`); the buffers crossing stages;
the memory plans (:mod:`triosim.graph.memory.composition`); the JSON summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import islice

from ..compute.op_parts import op_parts
from ..errors import ConfigError
from ..hardware.platform import Platform
from ..schedule.tasks import TaskGraph
from ..trace import Trace
from . import case_blocks
from .collectives.fragment import FOLD_BUILT_META
from .collectives.group_comm import GroupComm, collective_warning
from .collectives.star_routes import prime_routes
from .composition_state import CompositionState
from .context.plan import ContextPlan, context_plan, context_split
from .context.ring import exchange_sent, transient_bytes
from .data import gradient_sync
from .data.zero import buffer_roles
from .expert.plan import ExpertPlan, expert_ops, expert_split
from .layer_count import check_pipeline_depth, check_virtual_stages
from .memory import composition as composed_memory
from .memory.plan import MemoryReport
from .offload import carry_offload, host_link_rate, offload_on_plan
from .pipeline.blocking import StreamNeighbours, block_hops, check_blocking, receiving_block
from .pipeline.builder import choose_stages, micro_batch_sizes
from .pipeline.crossings import send_version_in_bulk, sent_last
from .pipeline.rank_program import add_rank_program
from .pipeline.schedules import FORWARD
from .pipeline.sends import send_hop_by_hop
from .pipeline.stages import PipelinePlan, buffer_versions
from .pipeline.summary import layer_facts
from .pipeline.tied_embedding import TiedEmbedding, add_tied_allreduce, find_tied
from .rank_map import rank_map
from .recompute import activation_facts, carry_plan, fit_to_stages, recompute
from .replica_symmetry import replicas_alike
from .ring_symmetry import group_comm
from .single import op_label, record_memory
from .strategy import Preset, Strategy
from .tensor.comm_overlap import plan_overlap
from .tensor.plans import tensor_plan, tp_waits
from .tensor.userbuffers import DEFAULT_TABLE

# A folded build's mirrored GPUs ({GPU: the built GPU it copies}) and its collectives' members'
# completion tasks ([(members' tasks, GPU 0's task)]) for the check after scheduling.
MIRRORS_META = "mirrors"
FOLD_CHECKS_META = "fold_checks"
# ... and the spans of task ids (lo, hi, each) whose compute tasks an exact build adds for every
# GPU: each task once per GPU in turn (each), or the whole span GPU after GPU.
FOLD_RUNS_META = "fold_runs"
# Without --exact/--representatives, every GPU is built while dp·tp·ops·micro-batches stays below
# this many compute tasks; above it one representative per role.
AUTO_EXACT_TASKS = 100_000
# Where replicas meet the topology differently (see triosim.graph.replica_symmetry), every GPU is
# built up to this many compute tasks, even with --representatives.
UNALIKE_EXACT_TASKS = 2_000_000
# Cross-stage sends that add only transfers are added for every micro-batch at once
# (graph/pipeline/crossings.py); tests turn it off to compare with the per-call path.
BULK_SENDS = True


def stage_plan(trace: Trace, platform: Platform, strategy: Strategy, fractions: Sequence[float],
               stage_gpus: Sequence[int]) -> PipelinePlan:
    """The pipeline plan of ``len(stage_gpus)`` stages, stage s on ``stage_gpus[s]``."""
    return choose_stages(trace, platform, strategy, fractions, num_stages=len(stage_gpus),
                         stage_gpus=tuple(stage_gpus))[0]


def folds(strategy: Strategy, preset: Preset | None) -> bool:
    """Whether a ``-case`` run may be built folded: a data- or tensor-parallel preset (cases 1-3,
    every GPU the same program, each collective over every GPU) not asked for ``--exact``, its
    buffers on the GPU (no copies to remote memory, whose links the GPUs share). GPU 0's
    program is built and every collective exactly over all GPUs, each member waiting for GPU
    0's tasks, which end when each GPU's own would; the builder keeps the folded graph only
    when every member's part of every collective ends when GPU 0's does (then every GPU's
    program runs as GPU 0's, and the schedule is the exact build's)."""
    return (preset is not None and preset.axis in ("dp", "tp") and strategy.exact is not True
            and strategy.initial_placement == "gpu" and strategy.zero != 3)


def preset_strategy(strategy: Strategy, preset: Preset) -> Strategy:
    """What the composition builds for a ``-case`` run: every GPU, and outside the pipeline preset
    one micro-batch on one stage (the pipeline options of a case 0–3 run are not used)."""
    if preset.axis == "pp":
        return replace(strategy, exact=True)
    return replace(strategy, exact=True, micro_batch_size=None, schedule="gpipe", virtual_stages=1)


def build(trace: Trace, platform: Platform, strategy: Strategy, fuse_runs: bool = True,
          fold: bool = False, memory_twins: tuple[int, ...] = ()) -> TaskGraph:
    """The composed DAG of ``strategy``'s degrees on ``platform`` (one representative per role
    unless ``strategy.exact``), or of its ``-case`` preset. A representative build runs each
    stretch of ops that nothing outside the GPU enters or leaves as one task (``fuse_runs``; same
    times, fewer tasks). ``fold``: a data-parallel preset builds GPU 0's program alone, its
    collectives exactly over every GPU (:func:`folds`); the caller checks the schedule.
    ``memory_twins``: ZeRO stages whose memory peaks are recorded beside the plan's own
    (``graph.meta["memory_twins"]``: stage -> GPU -> bytes; absent where they could differ in
    more than memory, :func:`~triosim.graph.memory.composition.peaks_under_zero`)."""
    preset = None if strategy.hybrid else strategy.preset
    fold = fold and folds(strategy, preset)
    if preset is not None:
        strategy = preset_strategy(strategy, preset)
    dp, tp, pp = strategy.degrees(platform.num_gpus)
    ranks = rank_map(strategy, platform.num_gpus)
    if ranks.size != platform.num_gpus and (preset is None or preset.axis is not None):  # case 0: GPU 0 of any
        with_cp = f" × --cp {ranks.cp}" if ranks.cp > 1 else ""
        raise ConfigError(f"--dp {dp} × --tp {tp} × --pp {pp}{with_cp} = {ranks.size} GPUs, but the platform has "
                          f"{platform.num_gpus}")
    dp = ranks.data  # data ranks: a context-parallel rank is a replica of the model too
    virtual = strategy.virtual_stages if strategy.schedule == "interleaved" else 1
    if preset is None:  # case 4 keeps its own check: a forward op per stage (stages.candidate_plans)
        check_pipeline_depth(trace, pp, virtual, strategy)
        check_virtual_stages(trace, pp, virtual, strategy.partition, strategy)
    original = trace  # the tensor-parallel plan is found on it, then carried to the re-runs
    rec = recompute(trace, strategy.recompute_spec) if preset is None else None
    if rec is not None:
        trace = rec.trace
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
    replicas = [(d, t) for d in range(dp) for t in range(tp)] if exact and not fold else [(0, 0)]
    # interleaved: stage P−1 (last GPU) hands over to stage P (first GPU again)
    prime_routes(platform, ((ranks.rank(d, t, s), ranks.rank(d, t, (s + e) % pp)) for d, t in replicas
                            for s in range(pp) for e in (-1, 1) if 0 <= s + e < pp or (virtual > 1 and pp > 1)))
    def plan_for(t: Trace) -> tuple:
        return choose_stages(t, platform, strategy, fractions, num_stages=pp, stage_gpus=tuple(ranks.stage_gpus(0, 0)))

    if rec is not None and pp > 1:  # re-runs stay on their stage: split them at the cuts
        rec, (plan, candidates) = fit_to_stages(original, rec, plan_for)
        trace = rec.trace
    else:
        plan, candidates = plan_for(trace)
    off = None
    if preset is None and strategy.offload_activations is not None:  # copies to host and back (graph.offload)
        rate = host_link_rate(trace)
        off, plan = offload_on_plan(trace, strategy.offload_activations, plan)
        trace = off.trace
    tpp = tensor_plan(original, tp, strategy.effective_tp_style, strategy.sequence_parallel)
    context = None
    if ranks.cp > 1:  # one context rank's share of every op and buffer, then its attention ops
        tpp = context_split(original, tpp, ranks.cp, strategy.cp_comm_type)
    experts = None
    etp = strategy.expert_tensor_degree
    if preset is None and (strategy.expert_degree > 1 or etp > 1 or tp > 1):  # an expert rank's share, exchanges
        tpp, experts = expert_split(original, tpp, strategy.expert_degree, ranks.data, strategy.zero,
                                    buffer_roles(original), strategy.moe_token_dispatcher, strategy.moe_imbalance, etp,
                                    strategy.moe_shared_expert_overlap)
    if rec is not None:
        tpp = carry_plan(tpp, rec)
    if off is not None:
        tpp = carry_offload(tpp, off)
    if experts is not None and strategy.delay_wgrad_compute:
        experts = replace(experts, delay_wgrad=True)
    if experts is not None and experts.ops and trace is not original:  # the rewritten trace's ops (re-runs
        experts = replace(experts, ops=expert_ops(trace)[0])  # exchange again; offload shifts the indices)
    if ranks.cp > 1:
        context = context_plan(trace, ranks.cp, strategy.cp_comm_type)
    # Fused runs of ops keep every time exact only while no memcpy can cut into a run (a run's
    # buffers all fit on the GPU); when the memory plan needs one, the graph is built op by op.
    fuse = fuse_runs and not exact and strategy.initial_placement == "gpu"
    roles = buffer_roles(trace)
    tied = find_tied(original) if preset is None and pp > 1 else None
    overlap = None
    if preset is None and strategy.tp_comm_overlap and tp > 1 and getattr(tpp, "sequence_parallel", False):
        overlap = plan_overlap(trace, tpp, plan.stage, rec.new_index if rec is not None else
                               off.new_index if off is not None else None,
                               strategy.tp_comm_overlap_cfg or DEFAULT_TABLE)
    blocking = preset is None and pp > 1 and strategy.blocking_sends
    if blocking:
        check_blocking(pp, virtual)
    while True:
        g = Composition(trace, platform, strategy, ranks, plan, tpp, fractions, replicas, roles, fuse=fuse,
                        preset=preset, exact=exact, tied=tied, context=context, experts=experts,
                        blocks={} if blocking else None, folded=fold,
                        block_first={} if preset is None and pp > 1 and not blocking else None,
                        overlap=overlap, host_copies=off.copies if off is not None else None,
                        host_rate=rate if off is not None else 0.0,
                        reruns=frozenset(rec.rerun_ops) if rec is not None else frozenset(),
                        memory_twins=memory_twins).assemble()
        if not g.meta.pop("needs_memcpy") or not (fuse or fold):
            break
        if fold:  # a memcpy's remote links are every GPU's: build them all
            fold, replicas = False, [(d, t) for d in range(dp) for t in range(tp)]
            continue
        fuse = False
    if preset is None:
        g.meta["hybrid"]["replica_warning"] = replica_warning
        g.meta["hybrid"]["recompute"] = activation_facts(original, rec, tpp, fractions[0])
        if off is not None:
            host = g.meta.pop("host_held", {})
            g.meta["hybrid"]["offload"] = {**off.summary(fractions[0]), "host_link_gbps": rate / 1e9,
                                           "host_peak_bytes": max((peak for _, peak in host.values()), default=0)}
        if rec is not None or off is not None:  # the time breakdown's phases, by the ops of the rewritten trace
            g.meta["op_stages"] = tuple(op.stage for op in trace.ops)
            g.meta["op_parts"] = op_parts(trace, strategy.micro_batch_size)
            g.meta["recompute_ops"] = frozenset(rec.rerun_ops) if rec is not None else frozenset()
    else:
        case_blocks.record(g, trace, strategy, preset, plan, tpp, sizes, candidates)
    return g


@dataclass
class Composition(CompositionState):
    """One build of the composed DAG, step by step (:meth:`assemble`). ``exact``: every replica
    is built and collectives are simulated on their links, not charged in closed form."""

    exact: bool = False
    folded: bool = False  # a data-parallel preset: GPU 0 built, the others its mirrors (see folds)
    tied: TiedEmbedding | None = None  # tied input/output embeddings (their all-reduce when pp > 1)
    reruns: frozenset[int] = frozenset()  # re-run forward ops (activation recomputation)
    context: ContextPlan | None = None  # context parallelism's attention ops (graph/context)
    experts: ExpertPlan | None = None  # expert parallelism's grouped GEMMs and exchanges (graph/expert)
    host_copies: dict | None = None  # activation offload: op -> its host copy (graph.offload)
    host_rate: float = 0.0  # the GPU's host link, B/s each way
    # overlapped sends: (d, t, pipeline rank) -> the first task of its last block so far, and how
    # many of block_first's entries that has read (_record_after_program)
    last_block_first: dict[tuple[int, int, int], int] = field(default_factory=dict)
    blocks_seen: int = 0
    # ZeRO stages whose memory peaks are wanted beside the build's own (graph.meta["memory_twins"]):
    # from ZeRO-1, ZeRO-2's, the same tasks (memory.composition.peaks_under_zero)
    memory_twins: tuple[int, ...] = ()

    def assemble(self) -> TaskGraph:
        """The steps in order; the graph's ``needs_memcpy`` says whether a memory plan needed a
        memcpy (then a fused build is redone op by op)."""
        trace, ranks, tpp = self.trace, self.ranks, self.tpp
        self.labels = [op_label(trace, i) for i in range(len(trace.ops))]
        self.prefixes = [f"mb{r}:" for r in range(len(self.fractions))]
        self.versions = buffer_versions(trace, self.plan.phase) if ranks.pp > 1 else []
        comm = group_comm(self.graph, self.platform, self.strategy.collective_detail, self.exact)
        if self.folded:
            comm.fold_members = True
            self.graph.meta[FOLD_BUILT_META] = frozenset(gg for s in range(ranks.pp) for gg in self.gpus(s))
        waits, cover = tp_waits(trace, tpp.collectives if ranks.tp > 1 else ())
        params_of = self.add_programs(comm, waits)
        self.add_crossings(cover, comm)
        reports = self.plan_memory()
        g = self.graph
        g.meta["needs_memcpy"] = any(r.fetch_tasks or r.evictions for r in reports)
        if self.memory_twins and not g.meta["needs_memcpy"] and self.preset is None and self.experts is None:
            # (an expert rank's shards depend on the stage: graph.expert.plan.expert_split)
            g.meta["memory_twins"] = {z: composed_memory.peaks_under_zero(self, z) for z in self.memory_twins}
        g.meta["devices"] = sorted(gg for s in range(ranks.pp) for gg in self.gpus(s))
        if self.folded:  # every GPU is GPU 0's mirror: its program, memory and times (checked after scheduling)
            del g.meta[FOLD_BUILT_META]
            built = g.meta["devices"][0]
            g.meta["devices"] = list(range(self.platform.num_gpus))
            g.meta[MIRRORS_META] = {gg: built for gg in g.meta["devices"] if gg != built}
            g.meta[FOLD_CHECKS_META] = comm.fold_checks
            mem = g.meta.get("memory", {})
            if built in mem:
                mem.update((gg, dict(mem[built])) for gg in g.meta[MIRRORS_META])
        if self.preset is None:
            g.meta["cluster_names"] = {
                gg: f"GPU {gg} (dp {d}, tp {t}, stage {s})" for gg in g.meta["devices"]
                for d, t, s in [ranks.coords(gg)]
            }
            g.meta["hybrid"] = self.summary(comm, params_of, reports)
        return g

    def add_programs(self, comm: GroupComm, waits) -> list[list[str]]:
        """Each pipeline rank's program, then its gradient sync and optimizer share; returns the
        parameters each rank owns."""
        # op -> its TP collectives in plan order: under sequence parallelism an op that ends one
        # block and feeds the next carries a reduce-scatter and then an all-gather.
        colls: dict[int, list] = {}
        for c in self.tpp.collectives if self.ranks.tp > 1 else ():
            colls.setdefault(c.op, []).append(c)
        params_of = gradient_sync.stage_params(self)
        if self.tied is not None and self.ranks.pp > 1:  # both embedding stages first, then their all-reduce
            lasts = [add_rank_program(self, comm, p, waits, colls, params_of[p]) for p in range(self.ranks.pp)]
            mid = len(self.graph)
            ends = [self._program_ends(last) for last in lasts]
            add_tied_allreduce(self, comm, self.tied, lasts)
            for p in range(self.ranks.pp):
                gradient_sync.add_gradient_sync(self, comm, p, params_of[p], lasts[p])
            for p, e in enumerate(ends):
                self._record_after_program(p, e, mid)
            return params_of
        for p in range(self.ranks.pp):
            first = len(self.graph)
            last = add_rank_program(self, comm, p, waits, colls, params_of[p])
            mid = len(self.graph)
            ends = self._program_ends(last)
            gradient_sync.add_gradient_sync(self, comm, p, params_of[p], last)
            self._record_after_program(p, ends, mid)
            if self.folded:  # how the exact build orders these compute tasks (report.compute_kinds):
                # a program with collectives op by op, every GPU's task of an op in turn; without,
                # and the optimizer, GPU after GPU
                self.graph.meta[FOLD_RUNS_META] = [(first, mid, bool(colls)), (mid, len(self.graph), False)]
        return params_of

    def _program_ends(self, last) -> list[tuple[tuple[int, int], int]]:
        """(replica, task) for each last task of each replica's program on a rank (a typed
        pipeline's: looked up by its sends)."""
        typed_pipeline = self.blocks is not None or self.block_first is not None
        return [(rep, k) for rep in self.replicas for k in last[rep]] if typed_pipeline else []

    def _record_after_program(self, p: int, ends: list[tuple[tuple[int, int], int]], mid: int) -> None:
        """What starts off each program end of pipeline rank ``p`` among the tasks added from
        ``mid`` on (the tied embedding's all-reduce, the gradient reduction, the optimizer share).
        Megatron-Core runs ``finalize_model_grads`` only once the schedule's last send has
        completed (a batched send returns after it, ``_communicate(wait_on_reqs=True)``; with
        ``overlap_p2p_comm`` the schedule waits on the last send's handle first), so these start
        after the rank's last send, not beside it. With overlapped sends, the last send is any
        sent by a task of the rank's last block (``last_block``: its first and last task)."""
        succ = self.graph.succ
        if self.blocks is None and self.block_first is not None:  # each replica's last block, per rank
            # (the blocks added since the last call: each entry read once over the whole build)
            for (d, t, st, _ph, _r), task in islice(self.block_first.items(), self.blocks_seen, None):
                key = (d, t, self.plan.rank_of(st))
                if task > self.last_block_first.get(key, -1):
                    self.last_block_first[key] = task
            self.blocks_seen = len(self.block_first)
        for rep, k in ends:
            later = [x for x in succ[k] if x >= mid]
            if later:
                self.after_program[k] = later
                first = self.last_block_first.get((*rep, p))
                if first is not None:
                    self.last_block[(*rep, p)] = (first, k)

    def add_crossings(self, cover: dict[tuple[int, str], int], comm: GroupComm) -> None:
        """Every cross-stage buffer version, per micro-batch and replica, hop by hop (as case 4).
        With ``--pipeline-scatter-gather`` (Megatron-LM 2021–22, without sequence parallelism)
        each TP rank sends 1/tp of a buffer its TP group holds whole, and the receiving group
        all-gathers it before its readers (``split_tensor_into_1d_equal_chunks`` and
        ``gather_split_1d_tensor`` in ``megatron/p2p_communication.py``)."""
        plan, ranks = self.plan, self.ranks
        if ranks.pp < 2:
            return
        handed = set(self.tied.head_part) if self.tied is not None else set()
        near = StreamNeighbours(self) if self.blocks is not None else None
        split = (self.strategy.pipeline_scatter_gather and ranks.tp > 1
                 and not getattr(self.tpp, "sequence_parallel", False))
        ds = sorted({d for d, _ in self.replicas})
        rows: dict = {}  # each hop's resolved task row (send_hop_by_hop)
        for v in self.versions:
            if v.buffer in handed:  # the tied embedding's all-reduce replaces this hand-over
                continue
            src = plan.stage[v.writer]
            readers = [(c, plan.stage[c]) for c in v.readers if plan.stage[c] != src]
            if not readers:
                continue
            stages = [st for _, st in readers]
            c_op = cover.get((v.writer, v.buffer))
            read_in: dict[int, str] = {}
            for c, st in readers:  # a stage's earliest reading phase (forward before backward)
                if read_in.get(st) != FORWARD:
                    read_in[st] = plan.phase[c]
            gather = split and self.tpp.shard_divisor.get(v.buffer, 1) == 1
            if not gather and BULK_SENDS:  # transfers only: every micro-batch's at once
                send_version_in_bulk(self, near, v.buffer, v.writer, src, readers, plan.phase[v.writer], read_in,
                                     c_op, rows)
                continue
            for r, frac in enumerate(self.fractions):
                nbytes = self.size(v.buffer, frac)
                sent = -(-nbytes // ranks.tp) if gather else nbytes
                for d in ds:
                    arrived: dict[int, dict[int, int]] = {}  # reader stage -> GPU -> the send arriving there
                    for dd, t in self.replicas:
                        if dd != d:
                            continue
                        first = self.task[(d, t, v.writer, r)]
                        done = self.tp_done.get((c_op, r, d)) if c_op is not None else None
                        if done is not None:  # a buffer a TP collective completes leaves after it
                            first = done[ranks.rank(d, t, plan.rank_of(src))]
                        arrive = send_hop_by_hop(self.graph, self.platform, v.buffer, r, sent, src, stages, first,
                                                 lambda a, d=d, t=t: ranks.rank(d, t, plan.rank_of(a)), rows)
                        if near is not None:
                            block_hops(self, near, (d, t), r, src, plan.phase[v.writer], read_in, arrive)
                        else:  # overlapped: the program's last sends are waited for
                            for x in sent_last(self, (d, t), src, first):
                                for st in (src - 1, src + 1):
                                    if st in arrive:
                                        self.graph.add_edge(arrive[st], x)
                        for st in set(stages):
                            arrived.setdefault(st, {})[ranks.rank(d, t, plan.rank_of(st))] = arrive[st]
                    for st, at in arrived.items():
                        ready = at
                        if gather:  # the receiving TP group puts the shards together
                            p = plan.rank_of(st)
                            ready = comm.run("all_gather", ranks.tp_group(d, p), nbytes,
                                             f"tp gather {v.buffer} mb{r} stage{st} dp{d}", {g: [a] for g, a in at.items()},
                                             parallel=lambda p=p: (ranks.tp_group(x, p) for x in range(ranks.data)),
                                             microbatch=r, group_kind="tp")
                            if d == 0:
                                self.count("tp", "all_gather", ranks.tp_group(d, p), nbytes)
                        read = {}  # per replica, the tasks reading it
                        for c, cst in readers:
                            if cst == st:
                                for dd, t in self.replicas:
                                    if dd == d:
                                        task = self.task[(d, t, c, r)]
                                        read.setdefault(t, set()).add(task)
                                        self.graph.add_edge(ready[ranks.rank(d, t, plan.rank_of(st))], task)
                        # the receiving group (blocking sends) or block starts once the tensor is there
                        for dd, t in self.replicas:
                            if dd != d:
                                continue
                            gate = receiving_block(self, (d, t), r, src, st, plan.phase[v.writer], read_in)
                            if gate is not None and gate not in read.get(t, ()):
                                self.graph.add_edge(ready[ranks.rank(d, t, plan.rank_of(st))], gate)

    def plan_memory(self) -> list[MemoryReport]:
        """Every built GPU's memory plan, recorded on the graph."""
        reports = composed_memory._plan_memory(self)
        record_memory(self.graph, reports)
        return reports

    def summary(self, comm: GroupComm, params_of: list[list[str]], reports: list[MemoryReport]) -> dict:
        """JSON-ready facts: the mesh, the TP plan, collectives per group kind, memory per stage."""
        ranks, tpp = self.ranks, self.tpp
        peak = {r.device: r.peak_bytes for r in reports}
        at_peak = {r.device: int(r.step_bytes.argmax()) for r in reports if r.step_bytes is not None and len(r.step_bytes)}
        memory = []
        owned: dict[int, list[str]] = {}  # pipeline rank -> the buffers its stages own (one pass, not one per rank)
        for k, owner in self.plan.buffer_stage.items():
            owned.setdefault(self.plan.rank_of(owner), []).append(k)
        for s in range(ranks.pp):
            w = gr = opt = 0
            for k in owned.get(s, ()):
                role = self.roles.role(k)
                nbytes = self.size(k, 1.0)
                if role == "weights":
                    w += nbytes
                elif role == "gradients":
                    gr += nbytes
                elif role == "optimizer":
                    opt += nbytes
            gpu = ranks.rank(0, 0, s)
            p = peak.get(gpu, 0)
            alive = self.gathered_at.get(s)
            gathered = alive[at_peak[gpu]] if alive and gpu in at_peak else 0  # ZeRO-3 copies whole at the peak
            memory.append({"stage": s, "gpu": gpu, "weights_bytes": w, "gradients_bytes": gr, "optimizer_bytes": opt,
                           "gathered_params_bytes": gathered, "gathered_params_max_bytes": max(alive or [0]),
                           "activations_peak_bytes": max(0, p - w - gr - opt - gathered),
                           "peak_bytes": p})
        return {
            "gpus": ranks.size,
            "rank_order": ",".join(ranks.order),
            "representatives": len(self.replicas) < ranks.data * ranks.tp,
            "built_gpus": len(self.graph.meta.get("devices", [])) or len(self.replicas) * ranks.pp,
            "micro_batches": len(self.fractions),
            "tp_style": getattr(tpp, "style", "per-op") if ranks.tp > 1 else None,
            "tp_blocks": len(getattr(tpp, "blocks", ()) or ()),
            "tp_fallback_reason": getattr(tpp, "fallback_reason", None) if ranks.tp > 1 else None,
            "collectives_dp0_tp0": {k: {kk: (round(vv, 3) if isinstance(vv, float) else vv) for kk, vv in v.items()}
                                     for k, v in sorted(self.stats.items())},
            "link_sharing_unknown": comm.sharing_unknown,
            "collective_warning": collective_warning(comm.crosses_other_gpus),
            "stage_parameters": [len(p) for p in params_of],
            "partition": self.plan.partition if ranks.pp > 1 else None,  # how the stages were cut
            **(layer_facts(self.plan) if ranks.pp > 1 else {}),
            "pipeline_warnings": list(self.plan.warnings),  # e.g. the partition search ran out of budget
            "memory": memory,
            **({"context_parallel": self.context_facts()} if self.context is not None else {}),
            **({"expert_parallel": self.expert_facts()} if self.experts is not None else {}),
        }

    def context_facts(self) -> dict:
        """JSON-ready: the context-parallel degree and exchange, and per layer (the first
        attention op of each direction, micro-batch 0) the bytes one rank sends in it and the
        buffers it holds while the attention runs."""
        ctx, frac = self.context, self.fractions[0]
        sent = {"forward": 0, "backward": 0}
        held = {"forward": 0, "backward": 0}
        for a in ctx.ops.values():
            if sent[a.phase] or held[a.phase]:
                continue
            sent[a.phase] = exchange_sent(self, ctx, a, frac)
            held[a.phase] = transient_bytes(self, ctx, a, frac)
        return {"cp": ctx.degree, "comm_type": ctx.comm_type, "attention_ops": len(ctx.ops),
                "exchange_bytes_per_layer": sent, "exchange_buffers_per_layer": held}

    def expert_facts(self) -> dict:
        """JSON-ready: the expert-parallel degree, groups and dispatcher, the busiest rank's load,
        and per MoE layer (its first dispatch, micro-batch 0) the bytes one rank exchanges."""
        ex = self.experts
        first = next((e for e in ex.ops.values() if e.phase == "forward" and e.when == "before"), None)
        routed = ex.wire_bytes(first, self.size(first.routed, self.fractions[0])) if first is not None else 0
        return {"ep": ex.degree, "etp": ex.etp, "edp": ex.edp, "dispatcher": ex.dispatcher, "imbalance": ex.imbalance,
                "busiest_rank_factor": round(ex.factor, 6), "experts": ex.experts, "top_k": ex.top_k,
                "local_experts": ex.experts // ex.degree, "exchanges": len(ex.ops),
                "routed_bytes_per_layer": routed}


__all__ = ["AUTO_EXACT_TASKS", "FOLD_CHECKS_META", "FOLD_RUNS_META", "MIRRORS_META", "Composition", "UNALIKE_EXACT_TASKS", "build",
           "folds", "stage_plan"]
