"""Data-parallel group collectives of the composition: each pipeline rank's gradients packed into
DDP buckets and synchronised over its DP groups (all-reduce at ZeRO-0, reduce-scatter above), the
optimizer share after them, ZeRO-1/2's all-gather of the updated parameters and ZeRO-3's
per-unit parameter gathers (see :mod:`triosim.graph.composition`). Under expert parallelism the
expert parameters' buckets come after the dense ones and are reduced (and their updated values
gathered) over the expert-data-parallel group (:func:`triosim.graph.expert.dispatch.edp_group`).

The standard data-parallel preset (case 1, ``Preset.gradient_sync == "whole"``) synchronises
every gradient in one all-reduce after the last backward op instead of DDP buckets.

A typed composition follows Megatron-Core's ``--overlap-grad-reduce``. With it, each bucket of
``--bucket-mb`` is reduced once backward has filled it (as DDP; case 2 does so too). Without it
(Megatron's default) Megatron-Core makes the bucket size infinite — one bucket per model chunk
(``DistributedDataParallel.__init__``: ``bucket_size = None`` unless ``overlap_grad_reduce``) —
and ``finalize_model_grads`` reduces them, chunk after chunk, once the pipeline schedule's last
backward op has run: here one bucket per stage of the rank, after the rank's last backward task.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...trace.precision import gathered_parameter_bytes, reduced_gradient_bytes
from ..collectives.group_comm import GroupComm
from ..composition_state import CompositionState
from ..expert.dispatch import edp_group
from ..pipeline.schedules import FORWARD, OPTIMIZER
from ..rank_map import RankMap
from ..single import op_label
from .data_parallel import MIB, Bucket, gradient_order, make_buckets, whole_gradient


def stage_params(b: CompositionState) -> list[list[str]]:
    """Parameters each pipeline rank owns (those of its stages: the stage of their first
    reader), in gradient order."""
    out: list[list[str]] = [[] for _ in range(b.ranks.pp)]
    for p in gradient_order(b.trace):
        out[b.plan.rank_of(b.plan.buffer_stage.get(p, 0))].append(p)
    return out


def sync_buckets(b: CompositionState, params: Sequence[str], s: int) -> list[Bucket]:
    """What pipeline rank ``s`` synchronises: its DDP buckets, or under the ``whole`` preset one
    bucket of every gradient, ready after the last backward op."""
    if b.preset is not None and b.preset.gradient_sync == "whole":  # one stage: params are every parameter
        return whole_gradient(b.trace)
    experts = expert_params(b)
    if experts:  # the dense buckets, then the experts' (another group)
        dense = _buckets_of(b, [q for q in params if q not in experts], s)
        moe = _buckets_of(b, [q for q in params if q in experts], s)
        return dense + [Bucket(len(dense) + k, bk.params, bk.nbytes, bk.ready_op) for k, bk in enumerate(moe)]
    return _buckets_of(b, params, s)


def _buckets_of(b: CompositionState, params: Sequence[str], s: int) -> list[Bucket]:
    if not params:
        return []
    if not overlapped(b):
        return _stage_buckets(b, params)
    return _buckets(b, params, s)


def expert_params(b: CompositionState) -> frozenset[str]:
    """The expert parameters under expert parallelism (else none)."""
    experts = getattr(b, "experts", None)
    return experts.params if experts is not None else frozenset()


def _group_of(b: CompositionState, params: Sequence[str], s: int):
    """(group of replica (d, t), group kind) for a bucket or gather of ``params``: the DP group,
    or the expert-data-parallel group for expert parameters."""
    ranks = b.ranks
    if params and params[0] in expert_params(b):
        ep, etp = b.experts.degree, b.experts.etp
        return (lambda d, t: edp_group(ranks, ep, d, t, s, etp)), "edp"
    groups: dict[int, tuple[int, ...]] = {}  # a DP group depends on the TP rank only: build each once

    def dp_group(d: int, t: int) -> tuple[int, ...]:
        group = groups.get(t)
        if group is None:
            group = groups[t] = ranks.dp_group(t, s)
        return group

    return dp_group, "dp"


def _by_group(b: CompositionState, group_of) -> dict[tuple[int, ...], list[tuple[int, int]]]:
    out: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for d, t in b.replicas:
        out.setdefault(group_of(d, t), []).append((d, t))
    return out


def overlapped(b: CompositionState) -> bool:
    """Whether buckets start as backward fills them (else after the rank's last backward task)."""
    return b.preset is not None or b.strategy.overlap_grad_reduce


def _stage_buckets(b: CompositionState, params: Sequence[str]) -> list[Bucket]:
    """Without ``--overlap-grad-reduce``: one bucket per model chunk (stage) of the rank, in
    chunk order, each holding every gradient of its stage."""
    trace, divisor, plan = b.trace, b.tpp.shard_divisor, b.plan
    by_stage: dict[int, list[str]] = {}
    for p in params:
        by_stage.setdefault(plan.buffer_stage.get(p, 0), []).append(p)
    out: list[Bucket] = []
    for st in sorted(by_stage):
        for bk in make_buckets(trace, float("inf"), by_stage[st],
                               lambda p: -(-reduced_gradient_bytes(trace, p) // divisor.get(p, 1))):
            out.append(Bucket(len(out), bk.params, bk.nbytes, bk.ready_op))
    return out


def _buckets(b: CompositionState, params: Sequence[str], s: int) -> list[Bucket]:
    """DDP buckets of one stage's gradients ``params``, each counted at its per-GPU shard bytes
    under TP (:func:`~triosim.graph.data.data_parallel.make_buckets`)."""
    trace, divisor = b.trace, b.tpp.shard_divisor
    return make_buckets(trace, b.strategy.bucket_mb * MIB, params,
                        lambda p: -(-reduced_gradient_bytes(trace, p) // divisor.get(p, 1)))


def gather_unit(b: CompositionState, comm: GroupComm, s: int, units, k: int, ph: str, r: int, last, gathered, ts,
                tally_log: list | None = None) -> None:
    """ZeRO-3 (and ZeRO 1/2 with ``--overlap-param-gather``): all-gather unit ``k``'s parameters on
    each DP group, after the previous gather and once the op before the current unit has run (one
    unit of prefetch). ``tally_log``: where the ``dp`` statistics' additions are logged, in order
    (a block replayed from a template adds them again: graph/pipeline/block_replay)."""
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
        done = comm.run("all_gather", group, u.nbytes, f"zero{b.strategy.zero} gather unit{k} {'fwd' if ph == FORWARD else 'bwd'} "
                        f"mb{r} stage{s} tp{t}", after, parallel=lambda p=p: _dp_groups(ranks, p),
                        microbatch=r, group_kind="dp", unit=k)
        for d, tt in b.replicas:
            if tt == t:
                gathered[(d, t)] = done[ranks.rank(d, t, p)]
                gathered[(d, t, "unit", k)] = done[ranks.rank(d, t, p)]
        if t == 0:
            wire = b.count("dp", "all_gather", group, u.nbytes)
            if tally_log is not None:
                tally_log.append(("dp", 1, int(u.nbytes), wire))


def _dp_groups(ranks: RankMap, s: int):
    return (ranks.dp_group(t, s) for t in range(ranks.tp))


def _parallel(b: CompositionState, kind: str, s: int):
    """Every group of ``kind`` (dp, edp) on stage ``s`` (they run side by side)."""
    ranks = b.ranks
    if kind == "dp":
        return _dp_groups(ranks, s)
    ep, etp = b.experts.degree, b.experts.etp
    return (edp_group(ranks, ep, x // ranks.tp, x % ranks.tp, s, etp) for x in range(ep * etp))


def add_gradient_sync(b: CompositionState, comm: GroupComm, s: int, params: list[str], last) -> None:
    """DDP buckets (ZeRO-0 all-reduce, else reduce-scatter), the optimizer share, and ZeRO-1/2's
    all-gather of the updated parameters, on pipeline rank ``s`` of every built replica after its
    program (``last``: each replica's last task there)."""
    trace, plan, ranks, strategy = b.trace, b.plan, b.ranks, b.strategy
    zero = strategy.zero
    r_last = len(b.fractions) - 1
    done: dict[tuple[int, int], list[int]] = {rep: [] for rep in b.replicas}
    op = "all_reduce" if zero == 0 else "reduce_scatter"
    typed = b.preset is None  # a run typed as degrees; a preset names its tasks as its case did
    whole = not typed and b.preset.gradient_sync == "whole"
    # A data-parallel preset syncs its buckets on one GPU too (a sync task each, as its case did).
    dp_preset = not typed and b.preset.axis == "dp"
    as_filled = overlapped(b)
    edp = b.experts.edp if getattr(b, "experts", None) is not None else 1
    for bk in (sync_buckets(b, params, s) if ranks.data > 1 or edp > 1 or zero or dp_preset else []):
        group_of, kind = _group_of(b, bk.params, s)
        if kind == "edp" and edp == 1:  # every GPU holds its own experts: nothing to reduce
            continue
        for n, (group, members) in enumerate(_by_group(b, group_of).items()):
            t = members[0][1]
            after = {}
            for d, tt in members:
                ready = b.task.get((d, tt, bk.ready_op, r_last)) if as_filled else None
                after[ranks.rank(d, tt, s)] = [*(last[(d, tt)] if ready is None else [ready]), *done[(d, tt)]]
            if typed:
                label = f"{'allreduce' if zero == 0 else 'reducescatter'} bucket{bk.index} stage{s} " + \
                    (f"tp{t}" if kind == "dp" else f"edp{n}")
                out = comm.run(op, group, bk.nbytes, label, after, parallel=lambda s=s, kind=kind: _parallel(b, kind, s),
                               bucket=bk.index, group_kind="dp")
            else:
                label = "allreduce gradients" if whole else f"allreduce bucket{bk.index}"
                out = comm.run(op, group, bk.nbytes, label, after, bucket=bk.index)
            for d, tt in members:
                done[(d, tt)] = [out[ranks.rank(d, tt, s)]]
            if (0, 0) in members:
                b.count("dp" if kind == "dp" else "edp", op, group, bk.nbytes)
    scale = b.tpp.time_scale
    if not b.optimizer_stages:  # every optimizer op's ranks and shares, once (a foreach op touches every parameter)
        b.optimizer_stages.update((i, plan.optimizer_ranks(i)) for i, ph in enumerate(plan.phase) if ph == OPTIMIZER)
    opt_ops = [i for i, shares in b.optimizer_stages.items() if s in shares]
    # A typed composition adds each optimizer op on every replica in turn; a preset each GPU's
    # optimizer ops in turn, as its case did (the same tasks and edges).
    steps = ([(i, rep) for i in opt_ops for rep in b.replicas] if typed
             else [(i, rep) for rep in b.replicas for i in opt_ops])
    for i, (d, t) in steps:
        share = b.optimizer_stages[i][s]  # the sum over rank s's stages
        dur = trace.ops[i].duration_s * share * scale[i] / (ranks.data if zero else 1)
        suffix = "" if share >= 1.0 else f" {share:.0%} share"
        gpu = ranks.rank(d, t, s)
        if b.tagged:
            task = b.graph.add_compute(gpu, dur, f"{op_label(trace, i)}{suffix} gpu{gpu}",
                                       after=[*last[(d, t)], *done[(d, t)]], op=i, stage=trace.ops[i].stage,
                                       stage_index=s, share=share)
        else:
            task = b.graph.add_compute(gpu, dur, f"{op_label(trace, i)} gpu{gpu}",
                                       after=[*last[(d, t)], *done[(d, t)]], op=i, stage=trace.ops[i].stage)
        b.seq.append(gpu, (task, (i,), None))
        last[(d, t)] = [task]
        done[(d, t)] = []
    if zero in (1, 2) and (ranks.data > 1 or edp > 1) and not (typed and strategy.overlap_param_gather):
        experts = expert_params(b)
        for part in ([q for q in params if q not in experts], [q for q in params if q in experts]):
            nbytes = sum(-(-gathered_parameter_bytes(trace, p) // b.tpp.shard_divisor.get(p, 1)) for p in part)
            if not part:
                continue
            group_of, kind = _group_of(b, part, s)
            if kind == "edp" and edp == 1:
                continue
            for n, (group, members) in enumerate(_by_group(b, group_of).items()):
                after = {ranks.rank(d, t, s): [*last[(d, t)], *done[(d, t)]] for d, t in members}
                where = f"tp{members[0][1]}" if kind == "dp" else f"edp{n}"
                comm.run("all_gather", group, nbytes, f"zero{zero} gather parameters stage{s} {where}", after,
                         parallel=lambda s=s, kind=kind: _parallel(b, kind, s), group_kind="dp")
                if (0, 0) in members:
                    b.count("dp" if kind == "dp" else "edp", "all_gather", group, nbytes)


__all__ = ["add_gradient_sync", "gather_unit", "overlapped", "stage_params", "sync_buckets"]
