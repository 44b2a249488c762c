"""What the planner's estimator weighs, per forward position of the trace, measured once per
(per-replica batch, tensor-parallel degree, sequence parallel, micro-batch size).

A *position* is a forward op of the trace; every backward op belongs to the position of its
forward partner (as the pipeline partitioner counts them, :mod:`triosim.graph.pipeline.stages`).
For one micro-batch a position weighs:

- its forward and backward compute time: each op's time from the trace's op-time model at the
  micro-batch size (:func:`triosim.compute.op_time.op_seconds`) times the tensor-parallel plan's
  time scale — the very numbers the task DAG gives its compute tasks;
- the tensor-parallel collectives the plan puts after its ops, each at its closed-form time on a
  TP group's links (:func:`triosim.graph.collectives.cost.collective_cost`), as a representative
  build charges them;
- the bytes of every buffer version crossing the cut after it (forward and backward direction),
  which the pipeline recurrence sends as one transfer per micro-batch and boundary;
- parameter, gradient and optimizer-state bytes (one TP rank's shard) and the activation bytes
  its forward ops write (what a micro-batch keeps until its backward).

The figures are cached per key (:class:`ModelProfile.times`): the estimator looks them up for
thousands of candidates and recomputing them per candidate was what made an earlier planner slow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from ..compute.op_time import op_seconds
from ..compute.scale import scale_trace
from ..graph.context.plan import context_split
from ..graph.data.data_parallel import gradient_order
from ..graph.data.precision import with_training_precision
from ..graph.data.zero import buffer_roles
from ..graph.pipeline.layer_layout import LayerSplit
from ..graph.pipeline.schedules import BACKWARD, FORWARD, OPTIMIZER
from ..graph.pipeline.stage_costs import buffer_versions
from ..graph.pipeline.stages import (
    _positions,
    megatron_starts,
    op_phases,
    resolve_partition,
    trace_layers,
)
from ..graph.pipeline.tied_embedding import TiedEmbedding, find_tied
from ..graph.recompute import carry_plan, recompute
from ..graph.recompute_spec import RecomputeSpec, as_spec
from ..graph.single import persistent_buffers
from ..graph.tensor.per_op import optimizer_state_of
from ..graph.tensor.plans import tensor_plan, tp_waits
from ..hardware.platform import Platform
from ..trace import Trace
from ..trace.precision import gathered_parameter_bytes, reduced_gradient_bytes
from .candidates import layer_facts
from .collective_costs import CollectiveCosts
from .combined_time import MoeOverlaps
from .context_time import held_bytes
from .expert_time import expert_held_bytes, expert_share
from .micro_scale import PLAIN, PRE_EXPERT, scale_at
from .stage_memory import StageLayout, StageMemory, gpu_bytes, stage_layout, stage_memories, touches
from .variants import rewrite_key

BASE = "base"  # a variant profile's key for the plain profile it was made from (ModelProfile.for_context)

# Ops of the attention core (scores, softmax, dropout on them, the product with V): what
# selective recomputation re-runs instead of keeping (Korthikanti et al. 2022, section 4.2).
_ATTENTION_CORE = re.compile(r"softmax|scaled_dot_product|_efficient_attention|flash_attention|baddbmm|bmm",
                             re.IGNORECASE)


@dataclass(frozen=True)
class PositionTimes:
    """Per-position arrays for one (batch, tp, sp, micro-batch) key; seconds and bytes of one
    micro-batch on one GPU of the TP group."""

    fwd: np.ndarray  # forward compute
    bwd: np.ndarray  # backward compute
    tp_fwd: np.ndarray  # TP collectives after forward ops
    tp_bwd: np.ndarray  # TP collectives after backward ops
    attn_fwd: np.ndarray  # forward compute of the attention core (selective recomputation re-runs it)
    act: np.ndarray  # activation bytes written by forward ops
    attn_act: np.ndarray  # of which the attention core's
    cut_fwd_bytes: np.ndarray  # bytes crossing the cut after each position, forward (len n-1)
    cut_bwd_bytes: np.ndarray
    params: np.ndarray  # parameter bytes as ZeRO gathers them (one TP shard), by the position that first reads them
    params_full: np.ndarray  # the same unsharded (what a stage's share of the optimizer follows)
    opt_state: np.ndarray  # optimizer-state bytes (one TP shard), following the parameters
    optimizer_s: float  # the whole optimizer's time on one TP rank (split by parameter bytes)
    op_s: np.ndarray  # every op's seconds, with the TP collectives after it
    b_ops: np.ndarray  # backward ops in trace order
    b_pos: np.ndarray  # and their positions


@dataclass
class ModelProfile(CollectiveCosts):
    """The trace a plan searches over and the platform it runs on, with cached per-key figures."""

    raw: Trace
    platform: Platform
    reference_compat: bool = False
    precision: object = None  # the training precision of --dtype (None: sizes as traced)
    _scaled: dict[int, Trace] = field(default_factory=dict, repr=False)
    _plans: dict[tuple[int, int, bool], object] = field(default_factory=dict, repr=False)
    _times: dict[tuple[int, int, bool, int], PositionTimes] = field(default_factory=dict, repr=False)
    _coll: dict[tuple[str, tuple[int, ...]], dict[int, float]] = field(default_factory=dict, repr=False)
    _grads: dict[tuple[int, int, bool], _Gradients] = field(default_factory=dict, repr=False)
    _op_times: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)
    _arrays: dict[tuple[int, int, bool], _PlanArrays] = field(default_factory=dict, repr=False)
    recompute: str | tuple = "none"  # the recomputation its trace carries (variants.rewrite_key)
    rc_spec: RecomputeSpec = field(default_factory=RecomputeSpec, repr=False)
    rc_cuts: frozenset[int] = field(default_factory=frozenset, repr=False)  # first forward op of each chunk
    rc_units: tuple = field(default=(), repr=False)  # its units (recompute_units): the same on every scaled copy
    parent: ModelProfile | None = field(default=None, repr=False)
    _children: dict[str, ModelProfile] = field(default_factory=dict, repr=False)
    _rewrites: dict[int, object] = field(default_factory=dict, repr=False)  # batch -> its Recomputed
    _layer_units: tuple[tuple[int, ...], ...] | None = field(default=None, repr=False)
    _touches: dict[tuple[int, int, bool], object] = field(default_factory=dict, repr=False)
    _stage_mem: dict[tuple, list[StageMemory]] = field(default_factory=dict, repr=False)
    _layouts: dict[tuple, StageLayout] = field(default_factory=dict, repr=False)
    cp: int = 1  # context-parallel degree: one context rank's share of every op and activation
    _contexts: dict[tuple, ModelProfile] = field(default_factory=dict, repr=False)
    # expert parallelism (an MoE trace): (ep, etp, the ZeRO stage sharding expert state over its expert-data-
    # parallel group: 0 without ZeRO or data ranks); moe: the run's (dispatcher, imbalance); overlaps: its pins
    experts: tuple[int, int, int] = (1, 1, 0)
    moe: tuple[str, float] = ("alltoall", 1.0)
    overlaps: MoeOverlaps = MoeOverlaps()
    _expert_plans: dict[tuple[int, int, bool], object] = field(default_factory=dict, repr=False)
    memo: dict[tuple, object] = field(default_factory=dict, repr=False)  # exchange facts of this trace, per key

    def __post_init__(self) -> None:
        trace = self.raw
        self.phase = op_phases(trace)
        self.fops = [i for i, p in enumerate(self.phase) if p == FORWARD]
        self.pos = _positions(trace, self.phase, self.fops)
        self.positions = len(self.fops)
        root = self.parent  # a rewrite keeps the layers (inserted ops are re-runs)
        self.layers, self.layer_unit, self.heads = (root.layers, root.layer_unit, root.heads) if root else layer_facts(trace)
        self.roles = buffer_roles(trace)
        self.versions = buffer_versions(trace, self.phase)
        self.gradient_order = gradient_order(trace)
        first: dict[str, int] = {}
        for i in sorted(self.pos):
            for b in trace.reads[i]:
                first.setdefault(b, self.pos[i])
        self.first_reader = first  # buffer -> position of its first reader (a parameter's owner)
        self.optimizer_buffers = tuple(k for k in trace.tensors if self.roles.role(k) == "optimizer")
        self.attention_ops = frozenset(i for i, op in enumerate(trace.ops) if _ATTENTION_CORE.search(op.name))
        # tied input/output embeddings: the head's gradient part is not sent between stages, an
        # all-reduce between the first and last pipeline rank replaces it (as the simulation does)
        self.tied: TiedEmbedding | None = self.parent.tied if self.parent is not None else find_tied(trace)

    # ------------------------------------------------------------------ cached inputs

    def layer_cuts(self, partition: str, stages: int, split: LayerSplit | None = None,
                   ranks: int = 1) -> list[int] | None:
        """Megatron-LM's stage starts (forward positions) when ``partition`` (``layers``, or
        ``auto`` on a model card's trace) cuts ``stages`` stages at equal layers, or a given
        layout ``split`` of ``ranks`` pipeline ranks cuts them (whatever the partition, as the
        simulation's :func:`~triosim.graph.pipeline.layer_layout.choose_split`), else None. The
        layers are found once, on the trace without re-runs: recomputation inserts its re-runs
        among the backward ops, so the forward positions are the same."""
        root = self.parent or self
        units = root._layer_units = trace_layers(root.raw) if root._layer_units is None else root._layer_units
        if split is not None and split.given:  # Megatron's rules (a card's leading layers counted)
            return megatron_starts(root.raw, root.fops, stages, units, split, ranks)
        if resolve_partition(root.raw, partition, stages, units) != "layers":
            return None
        return megatron_starts(root.raw, root.fops, stages, units, LayerSplit())

    @property
    def variant(self) -> tuple[int, int, int, int, str]:
        """(cp, ep, etp, expert ZeRO stage, token dispatcher): what the rank's share of ops and
        buffers depends on beyond the (batch, tp, sp) keys; memo keys name it."""
        return (self.cp, *self.experts, self.moe[0])

    def for_context(self, cp: int, experts: tuple[int, int, int] = (1, 1, 0),
                    dispatcher: str | None = None) -> ModelProfile:
        """One context rank's profile at ``cp`` (as :func:`~triosim.graph.context.plan.context_split`
        splits it) and, on an MoE trace, one expert rank's at ``experts`` with ``dispatcher`` (default
        the plan's; :mod:`triosim.plan.expert_time`), with this one's recomputation; built once per
        variant, sharing the plain profile's scaled traces and op times."""
        root = self.parent or self
        base = root._contexts.get(BASE, root)
        key = (cp, *experts, dispatcher or base.moe[0])
        hit = root if key == root.variant else base if key == base.variant else base._contexts.get(key)
        if hit is None:
            hit = base._contexts[key] = ModelProfile(base.raw, base.platform, base.reference_compat, base.precision,
                                                     _scaled=base._scaled, _op_times=base._op_times, cp=cp, experts=experts,
                                                     moe=(key[-1], base.moe[1]), overlaps=base.overlaps)
            hit._contexts[BASE] = base
        return hit.for_recompute(self.rc_spec, self.rc_cuts)

    def for_recompute(self, mode: str | RecomputeSpec, cuts: frozenset[int] = frozenset()) -> ModelProfile:
        """The profile of the trace with ``mode``'s re-runs inserted, as the simulation rewrites
        it (:mod:`triosim.graph.recompute`: the re-runs are backward ops of their layer's
        position, so its backward time includes them); built once per setting. ``cuts``: each
        chunk's first forward op, where the re-run layers depend on them (RecomputeSpec.partial)."""
        spec = as_spec(mode)
        key = rewrite_key(spec, cuts)
        if key == self.recompute:
            return self
        root = self.parent or self
        if key == "none":
            return root
        hit = root._children.get(key)
        if hit is None:
            cuts = frozenset(cuts) if spec.partial else frozenset()
            rec = recompute(root.raw, spec, cuts)
            hit = root._children[key] = ModelProfile(rec.trace, root.platform, root.reference_compat, root.precision,
                                                     recompute=key, rc_spec=spec, rc_cuts=cuts, rc_units=rec.units,
                                                     parent=root, cp=root.cp, experts=root.experts, moe=root.moe,
                                                     overlaps=root.overlaps)
        return hit

    def scaled(self, batch: int) -> Trace:
        """The trace scaled to a per-replica batch, sized for the training precision and with
        its re-runs, as ``triosim run`` scales, sizes and rewrites it."""
        hit = self._scaled.get(batch)
        if hit is None:
            if self.parent is not None:  # a scaled copy has the same ops: the same units
                rec = self._rewrites[batch] = recompute(self.parent.scaled(batch), self.rc_spec, self.rc_cuts,
                                                        list(self.rc_units))
                hit = rec.trace
            else:
                hit = with_training_precision(scale_trace(self.raw, batch, reference_compat=self.reference_compat),
                                              self.precision)
            self._scaled[batch] = hit
        return hit

    def tensor_plan(self, batch: int, tp: int, sp: bool):
        """The tensor-parallel plan (cached); with recomputation, found on the trace without the
        re-runs and carried to them, as the simulation does."""
        key = (batch, tp, sp)
        hit = self._plans.get(key)
        if hit is None:
            if self.parent is not None:
                self.scaled(batch)
                hit = carry_plan(self.parent.tensor_plan(batch, tp, sp), self._rewrites[batch])
            else:
                hit = self.memo[(PLAIN, *key)] = tensor_plan(self.scaled(batch), tp, "megatron", sp and tp > 1)
                if self.cp > 1:  # one context rank's share, before the re-runs get theirs (as build does)
                    hit = context_split(self.scaled(batch), hit, self.cp, "p2p")
                self.memo[(PRE_EXPERT, *key)] = hit
                # an expert rank's share (expert buffers, busiest rank's GEMMs, optimizer share)
                hit, self._expert_plans[key] = expert_share(self, batch, hit)
            self._plans[key] = hit
        return hit

    # ------------------------------------------------------------------ per-key figures

    def times(self, batch: int, tp: int, sp: bool, micro_batch: int, cast_share: float | None = None) -> PositionTimes:
        """Per-position figures of one micro-batch (cached per key); ``cast_share``: under FP8
        training, the share of a weight's cast each forward pays (:meth:`op_times`)."""
        sp = sp and tp > 1
        key = (batch, tp, sp, micro_batch, cast_share)
        hit = self._times.get(key)
        if hit is None:
            hit = self._times[key] = self._measure(batch, tp, sp, micro_batch, cast_share)
        return hit

    @property
    def fp8_weight_casts(self) -> bool:
        """Whether the op times carry FP8 weight casts, whose share per micro-batch a candidate
        sets (1 / micro-batches: cast once and cached; every micro-batch under ZeRO-3)."""
        root = self.parent or self
        return getattr(root.precision, "fp8", None) is not None

    def op_times(self, batch: int, micro_batch: int, cast_share: float | None = None) -> np.ndarray:
        """Every op's seconds at ``micro_batch`` samples in the trace scaled to ``batch``; under FP8
        training with ``cast_share`` of each weight's cast (the op times are linear in it)."""
        key = (batch, micro_batch, cast_share)
        hit = self._op_times.get(key)
        if hit is None:
            if self.parent is not None:  # a re-run takes its original's time
                self.scaled(batch)
                hit = self.parent.op_times(batch, micro_batch, cast_share)[list(self._rewrites[batch].origin)]
            elif cast_share is not None and _fp8_plan(self.scaled(batch).op_time) is not None:
                none, whole = (self._cast_times(batch, micro_batch, share) for share in (0.0, 1.0))
                hit = none + cast_share * (whole - none)
            else:
                trace = self.scaled(batch)
                hit = np.array([op_seconds(trace, i, micro_batch) for i in range(len(trace.ops))])
            self._op_times[key] = hit
        return hit

    def _cast_times(self, batch: int, micro_batch: int, share: float) -> np.ndarray:
        """Every op's seconds with ``share`` of each FP8 weight cast."""
        model = self.scaled(batch).op_time
        plan = _fp8_plan(model)
        timed = replace(model, fp8=replace(plan, fp8=replace(plan.fp8, weight_cast_share=share)), _times={}, _casts={})
        return np.array([timed.seconds(i, micro_batch) for i in range(len(self.scaled(batch).ops))])

    def _plan_arrays(self, batch: int, tp: int, sp: bool) -> _PlanArrays:
        key = (batch, tp, sp)
        hit = self._arrays.get(key)
        if hit is None:
            experts = self.expert_plan(batch, tp, sp)
            hit = self._arrays[key] = _plan_arrays(self, self.scaled(batch), self.tensor_plan(batch, tp, sp),
                                                   experts.params if experts is not None else frozenset())
        return hit

    def _measure(self, batch: int, tp: int, sp: bool, mb: int, cast_share: float | None) -> PositionTimes:
        trace = self.scaled(batch)
        pa = self._plan_arrays(batch, tp, sp)
        n = self.positions
        frac = mb / trace.batch_size
        t = self.op_times(batch, mb, cast_share) * scale_at(self, batch, tp, sp, mb)  # at the DAG's shapes
        fwd = np.bincount(pa.f_pos, weights=t[pa.f_ops], minlength=n)
        bwd = np.bincount(pa.b_pos, weights=t[pa.b_ops], minlength=n)
        attn = np.bincount(pa.f_pos, weights=t[pa.f_ops] * pa.f_attn, minlength=n)
        act_bytes = gpu_bytes(pa.act_bytes, pa.act_invariant, pa.act_div, frac)
        act = np.bincount(pa.act_pos, weights=act_bytes, minlength=n)
        attn_act = np.bincount(pa.act_pos, weights=act_bytes * pa.act_attn, minlength=n)
        tpf, tpb = np.zeros(n), np.zeros(n)
        op_s = t.copy()
        if tp > 1:
            group = tuple(range(tp))  # rank order tp innermost: a TP group is tp consecutive GPUs
            for (kind, nbytes, forward), (positions, ops) in pa.collectives.items():
                # a context rank's collectives carry its 1/cp of the tokens (as rank_program sizes them)
                size = nbytes if frac == 1.0 and self.cp == 1 else int(round(nbytes * frac / self.cp))
                cost = self.collective_s(kind, group, size)
                np.add.at(tpf if forward else tpb, positions, cost)
                np.add.at(op_s, ops, cost)
        v_bytes = gpu_bytes(pa.v_bytes, pa.v_invariant, pa.v_div, frac)
        cf, cb = np.zeros(n + 1), np.zeros(n + 1)
        ahead, behind = pa.v_hi > pa.v_pos, pa.v_lo < pa.v_pos
        np.add.at(cf, pa.v_pos[ahead], v_bytes[ahead])
        np.add.at(cf, pa.v_hi[ahead], -v_bytes[ahead])
        np.add.at(cb, pa.v_lo[behind], v_bytes[behind])
        np.add.at(cb, pa.v_pos[behind], -v_bytes[behind])
        return PositionTimes(fwd, bwd, tpf, tpb, attn, act, attn_act, np.cumsum(cf)[:n - 1], np.cumsum(cb)[:n - 1],
                             pa.params, pa.params_full, pa.opt_state, pa.optimizer_s, op_s, pa.b_ops, pa.b_pos)

    def expert_plan(self, batch: int, tp: int, sp: bool):
        """The :class:`~triosim.graph.expert.plan.ExpertPlan` of this profile's expert rank at
        the key (its exchanges at the ops of this profile's trace: re-runs exchange again), or
        None (a dense model, or every expert whole on every GPU with nothing to exchange)."""
        sp = sp and tp > 1
        root = self
        while root.parent is not None:
            root = root.parent
        root.tensor_plan(batch, tp, sp)
        return root._expert_plans.get((batch, tp, sp))

    def tied_allreduce_s(self, batch: int, tp: int, sp: bool, pp: int, last: int | None = None) -> float:
        """Seconds of the tied embedding's gradient all-reduce between pipeline rank 0 and the last
        (one TP shard of the table, on GPU 0 and ``last``, the last stage's peer: by default
        (pp - 1) · tp · cp, ranks tp innermost, then cp, then pp), as the simulation adds it after
        both ranks' programs (:mod:`triosim.graph.pipeline.tied_embedding`); 0 without tied
        embeddings or with one stage."""
        if self.tied is None or pp < 2:
            return 0.0
        trace = self.scaled(batch)
        shard = self.tensor_plan(batch, tp, sp and tp > 1).shard_divisor.get(self.tied.table, 1)
        return self.collective_s("all_reduce", (0, (pp - 1) * tp * self.cp if last is None else last),
                                 -(-trace.tensors[self.tied.table].bytes // shard))

    def stage_memories(self, batch: int, tp: int, sp: bool, micro_batch: int, starts: list[int],
                       unit_bytes: float = float("inf")) -> list[StageMemory]:
        """The buffers of each stage (``starts``: their first forward positions) for one
        micro-batch, as the DAG's memory plan holds them (:mod:`triosim.plan.stage_memory`;
        cached per key)."""
        sp = sp and tp > 1
        key = (batch, tp, sp, micro_batch, tuple(starts), unit_bytes)
        hit = self._stage_mem.get(key)
        if hit is None:
            uses = self._touches.get((batch, tp, sp))
            if uses is None:
                trace = self.scaled(batch)
                uses = self._touches[(batch, tp, sp)] = touches(  # the uses found at another key, if any
                    trace, self.phase, self.pos, self.tensor_plan(batch, tp, sp), self.roles,
                    persistent_buffers(trace), next(iter(self._touches.values()), None))
            # the cut's layout does not depend on the micro-batch size: shared by all of them
            lkey = (batch, tp, sp, tuple(starts), unit_bytes)
            layout = self._layouts.get(lkey)
            if layout is None:
                layout = self._layouts[lkey] = stage_layout(uses, list(starts), unit_bytes)
            hit = self._stage_mem[key] = stage_memories(uses, list(starts),
                                                        micro_batch / self.scaled(batch).batch_size, unit_bytes,
                                                        layout, {**held_bytes(self, batch, tp, sp, micro_batch),
                                                                 **expert_held_bytes(self, batch, tp, sp, micro_batch)})
        return hit

    def gradients(self, batch: int, tp: int, sp: bool) -> _Gradients:
        """Every gradient in the order backward completes it (cached per key)."""
        sp = sp and tp > 1
        key = (batch, tp, sp)
        hit = self._grads.get(key)
        if hit is None:
            trace = self.scaled(batch)
            shard = self.tensor_plan(batch, tp, sp).shard_divisor
            last = trace.last_backward_index()
            ready, order = trace.grad_ready_op, self.gradient_order
            hit = self._grads[key] = _Gradients(
                np.array([self.first_reader.get(p, 0) for p in order], dtype=np.intp),
                [-(-reduced_gradient_bytes(trace, p) // shard.get(p, 1)) for p in order],
                [ready.get(p, last) for p in order])
        return hit

    def rank_buckets(self, batch: int, tp: int, sp: bool, owned: np.ndarray,
                     bucket_bytes: float, part: tuple[frozenset[str], bool] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The DDP buckets of the parameters whose first reader is at an ``owned`` position, in
        the order their gradients complete, one TP shard each, packed as the composition packs
        them (:func:`triosim.graph.data.data_parallel.make_buckets`: close a bucket once it
        holds ``bucket_bytes`` or more): each bucket's bytes and the backward op completing it.
        ``part`` (expert parameters, True/False): only the expert ones, or only the others (the
        DAG packs them apart: their gradients meet on another group)."""
        g = self.gradients(batch, tp, sp)
        nbytes, ready_op = g.nbytes, g.ready_op
        sizes: list[int] = []
        readies: list[int] = []
        size, ready, count = 0, -1, 0
        mine = owned[g.owner]
        if part is not None:
            experts, want = part
            mine = mine & (np.array([p in experts for p in self.gradient_order], dtype=bool) == want)
        for i in np.flatnonzero(mine).tolist():
            size += nbytes[i]
            ready = max(ready, ready_op[i])
            count += 1
            if size >= bucket_bytes:
                sizes.append(size)
                readies.append(ready)
                size, ready, count = 0, -1, 0
        if count:
            sizes.append(size)
            readies.append(ready)
        return np.array(sizes, dtype=np.int64), np.array(readies, dtype=np.intp)


@dataclass(frozen=True)
class _Gradients:
    """The parameters in gradient order: each one's owner (the position of its first reader),
    the bytes of its gradient on one GPU (a TP shard) and the backward op completing it."""

    owner: np.ndarray
    nbytes: list[int]
    ready_op: list[int]


@dataclass(frozen=True)
class _PlanArrays:
    """What a (batch, tp, sp) key fixes, as arrays over ops, written buffers and buffer versions."""

    scale: np.ndarray
    f_ops: np.ndarray
    f_pos: np.ndarray
    f_attn: np.ndarray
    b_ops: np.ndarray
    b_pos: np.ndarray
    act_pos: np.ndarray
    act_bytes: np.ndarray
    act_invariant: np.ndarray
    act_div: np.ndarray
    act_attn: np.ndarray
    v_pos: np.ndarray
    v_hi: np.ndarray
    v_lo: np.ndarray
    v_bytes: np.ndarray
    v_invariant: np.ndarray
    v_div: np.ndarray
    collectives: dict[tuple[str, int, bool], tuple[np.ndarray, np.ndarray]]  # (kind, bytes, fwd) -> positions, ops
    params: np.ndarray
    params_full: np.ndarray
    opt_state: np.ndarray
    optimizer_s: float


def _fp8_plan(model):
    """The FP8 plan of a roofline op-time model (None: not FP8 training, or not the roofline)."""
    return getattr(model, "fp8", None) if type(model).__name__ == "RooflineTimes" else None


def handed_over(profile: ModelProfile) -> frozenset[str]:
    """Buffers the trace hands between stages that the pipeline does not send: the LM head's part
    of a tied embedding's gradient (the first and last rank's all-reduce replaces it)."""
    return frozenset(profile.tied.head_part) if profile.tied is not None else frozenset()


def _spread_state(params: np.ndarray, total: float) -> np.ndarray:
    """``total`` optimizer-state bytes spread over the positions as their parameters' bytes."""
    return params / params.sum() * total if params.sum() > 0 else np.zeros(len(params))


def _plan_arrays(profile: ModelProfile, trace: Trace, plan, experts: frozenset[str] = frozenset()) -> _PlanArrays:
    phase, pos = profile.phase, profile.pos
    shard = plan.shard_divisor
    invariant = trace.batch_invariant
    f_ops = [i for i in sorted(pos) if phase[i] == FORWARD]
    b_ops = [i for i in sorted(pos) if phase[i] == BACKWARD]
    acts = [(pos[i], float(trace.tensors[k].bytes), shard.get(k, 1), i in profile.attention_ops)
            for i in f_ops for k in trace.writes[i] if k not in invariant]
    vers = []
    handed = handed_over(profile)
    for v in profile.versions:
        if v.buffer in handed:  # the tied embedding's all-reduce replaces this hand-over
            continue
        p = pos.get(v.writer)
        cs = [pos[c] for c in v.readers if c in pos]
        if p is not None and cs:
            vers.append((p, max(cs), min(cs), float(trace.tensors[v.buffer].bytes), v.buffer in invariant,
                         shard.get(v.buffer, 1)))
    colls: dict[tuple[str, int, bool], list[tuple[int, int]]] = {}
    # A TP collective holds up the stream only when a later op of the same pass reads what it
    # carries; one nothing in the pass waits for (the last layer's input gradient) runs beside
    # the ops.
    waits = tp_waits(trace, plan.collectives)[0] if plan.degree > 1 else []
    waited = {c for j, w in enumerate(waits) for c in w if phase[c] == phase[j]}
    for c in plan.collectives if plan.degree > 1 else ():
        k = pos.get(c.op)
        if k is not None and c.op in waited:
            colls.setdefault((c.kind, int(c.nbytes), phase[c.op] == FORWARD), []).append((k, c.op))
    n = profile.positions
    params, params_full, expert_params = np.zeros(n), np.zeros(n), np.zeros(n)
    first = profile.first_reader
    for prm in trace.parameters:
        if prm in first:
            params[first[prm]] += -(-gathered_parameter_bytes(trace, prm) // shard.get(prm, 1))
            params_full[first[prm]] += trace.tensors[prm].bytes
            if prm in experts:
                expert_params[first[prm]] += -(-gathered_parameter_bytes(trace, prm) // shard.get(prm, 1))
    opt_total = sum(-(-trace.tensors[b].bytes // shard.get(b, 1)) for b in profile.optimizer_buffers)
    if experts:  # an expert rank's state is split otherwise than its weights (ZeRO: over edp): spread apart
        state = optimizer_state_of(trace, set(experts))
        expert_total = sum(-(-trace.tensors[b].bytes // shard.get(b, 1)) for b in profile.optimizer_buffers
                           if b in state)
        opt_state = _spread_state(params - expert_params, opt_total - expert_total) + \
            _spread_state(expert_params, expert_total)
    else:
        opt_state = _spread_state(params, opt_total)
    scale = np.array(plan.time_scale, dtype=float)
    optimizer_s = sum(op_seconds(trace, i, trace.batch_size) * scale[i]
                      for i, p in enumerate(phase) if p == OPTIMIZER)

    def arr(rows, k, dtype=float):
        return np.array([r[k] for r in rows], dtype=dtype)

    return _PlanArrays(
        scale, np.array(f_ops, dtype=np.intp), np.array([pos[i] for i in f_ops], dtype=np.intp),
        np.array([1.0 if i in profile.attention_ops else 0.0 for i in f_ops]),
        np.array(b_ops, dtype=np.intp), np.array([pos[i] for i in b_ops], dtype=np.intp),
        arr(acts, 0, np.intp), arr(acts, 1), np.zeros(len(acts), dtype=bool),
        arr(acts, 2), arr(acts, 3),
        arr(vers, 0, np.intp), arr(vers, 1, np.intp), arr(vers, 2, np.intp), arr(vers, 3), arr(vers, 4, bool),
        arr(vers, 5), {k: (np.array([a for a, _ in v], dtype=np.intp), np.array([b for _, b in v], dtype=np.intp))
                     for k, v in colls.items()}, params, params_full, opt_state, float(optimizer_s))


__all__ = ["ModelProfile", "PositionTimes"]
