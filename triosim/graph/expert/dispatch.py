"""The token exchanges of expert parallelism in the DAG, and the expert groups.

A grouped GEMM named by the :class:`~triosim.graph.expert.plan.ExpertPlan` runs as: the exchange
before it (forward: the dispatch of the permuted tokens; backward: the gradients of the expert
outputs sent back to the expert ranks), the GEMM, or the exchange after it (forward: the combine
of the expert outputs; backward: the gradients of the permuted tokens sent home). Each exchange is
a collective of the expert-parallel group (:class:`~triosim.graph.collectives.group_comm.GroupComm`:
on every GPU of the group's links under ``--exact``, else in closed form on one representative),
so the router, permutation and attention before it and the shared expert beside it run as the
scheduler lets them.

``flex`` (DeepEP) runs two collectives each way: forward the inter-node all-to-all (one copy of a
token per destination node) then the intra-node one (NVLink fan-out to the experts); backward
the reverse order.
"""

from __future__ import annotations

from ..collectives.group_comm import GroupComm
from ..composition_state import CompositionState
from ..rank_map import RankMap
from .plan import BACKWARD, FORWARD, ExpertOp, ExpertPlan, flex_node_fraction

Rep = tuple[int, int]


def _x(ranks: RankMap, d: int, t: int) -> int:
    """The flattened rank of data rank ``d``, TP rank ``t`` within a stage (tp innermost)."""
    return t + ranks.tp * d


def _gpus(ranks: RankMap, xs, s: int) -> tuple[int, ...]:
    return tuple(ranks.rank(y // ranks.tp, y % ranks.tp, s) for y in xs)


def ep_group(ranks: RankMap, ep: int, d: int, t: int, s: int, etp: int = 1) -> tuple[int, ...]:
    """The expert-parallel group of data rank ``d``, TP rank ``t`` on stage ``s``. The expert
    ranks of a stage are numbered etp-innermost over its flattened ranks x = t + tp·d: the
    ``ep`` ranks of x's block of etp·ep with x's expert-tensor index (stride etp)."""
    x = _x(ranks, d, t)
    block = x - x % (etp * ep)
    return _gpus(ranks, range(block + x % etp, block + etp * ep, etp), s)


def etp_group(ranks: RankMap, etp: int, d: int, t: int, s: int) -> tuple[int, ...]:
    """The expert-tensor-parallel group: ``etp`` consecutive flattened ranks."""
    x = _x(ranks, d, t)
    return _gpus(ranks, range(x - x % etp, x - x % etp + etp), s)


def edp_group(ranks: RankMap, ep: int, d: int, t: int, s: int, etp: int = 1) -> tuple[int, ...]:
    """The expert-data-parallel group: the ranks of the stage holding the same expert shards
    (x ≡ x' mod etp·ep), where the expert gradients are reduced."""
    x = _x(ranks, d, t)
    return _gpus(ranks, range(x % (etp * ep), ranks.tp * ranks.data, etp * ep), s)


def flex_groups(b: CompositionState, group: tuple[int, ...], gpu: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(intra-node, inter-node) sub-groups of ``gpu`` in the expert-parallel ``group``: its node's
    members, and the members at its own position in their nodes."""
    node_of = b.platform.node_of or (0,) * b.platform.num_gpus  # no nodes: one NVLink domain
    by_node: dict[int, list[int]] = {}
    for g in group:
        by_node.setdefault(node_of[g], []).append(g)
    mine = by_node[node_of[gpu]]
    at = mine.index(gpu)
    return tuple(mine), tuple(m[at] for m in by_node.values() if len(m) > at)


def exchanges(b: CompositionState, plan: ExpertPlan, e: ExpertOp, frac: float, gpu: int
              ) -> list[tuple[str, tuple[int, ...], int]]:
    """(kind, group, payload) of the exchange of op ``e`` on ``gpu``, in the order they run.
    Under expert tensor parallelism the rows an expert rank received are all-gathered over its
    etp group before the GEMM (each rank computes 1/etp of every local expert's width for them)
    and the partial outputs reduce-scattered after it."""
    ranks = b.ranks
    d, t, s = ranks.coords(gpu)
    group = ep_group(ranks, plan.degree, d, t, s, plan.etp)
    if plan.dispatcher == "allgather":
        return [("all_gather" if e.when == "before" else "reduce_scatter", group, _gathered(b, plan, e, frac))]
    routed = _busiest_rows(b, plan, e, frac)
    if plan.dispatcher == "alltoall":
        steps = [("all_to_all", group, routed)]
    else:
        intra, inter = flex_groups(b, group, gpu)
        steps = [("all_to_all", intra, routed)]
        if len(inter) > 1:
            n = len(inter)
            wire = routed * flex_node_fraction(plan.top_k, n)
            steps.insert(0, ("all_to_all", inter, int(round(wire * n / (n - 1)))))  # sends (n−1)/n of it
        outbound = (e.phase == FORWARD) == (e.when == "before")  # toward the experts: between nodes first
        steps = steps if outbound else steps[::-1]
    if plan.etp > 1:  # before: gather the received rows over etp; after: reduce-scatter, then send home
        shard = etp_group(ranks, plan.etp, d, t, s)
        if e.when == "before":
            steps.append(("all_gather", shard, plan.etp * routed))
        else:
            steps.insert(0, ("reduce_scatter", shard, plan.etp * routed))
    return steps


def _busiest_rows(b: CompositionState, plan: ExpertPlan, e: ExpertOp, frac: float) -> int:
    """Bytes of the busiest rank's exchanged rows of op ``e``, as they travel (FP8: in bf16)."""
    return int(round(plan.wire_bytes(e, b.size(e.routed, frac)) * plan.factor))


def _gathered(b: CompositionState, plan: ExpertPlan, e: ExpertOp, frac: float) -> int:
    """The allgather dispatcher's payload: every rank's un-permuted tokens, as they travel."""
    return plan.degree * plan.wire_bytes(e, b.size(e.tokens, frac), tokens=True)


def exchange_buffer_bytes(b: CompositionState, plan: ExpertPlan, e: ExpertOp, frac: float) -> int:
    """Bytes op ``e``'s exchange holds beyond the trace's buffers while it runs: the buffer it
    receives into (the busiest rank's rows; the gathered tokens under ``allgather``), which the
    grouped GEMM then reads in place of the permuted tokens the rank sent."""
    if plan.dispatcher == "allgather":
        return _gathered(b, plan, e, frac)
    routed = _busiest_rows(b, plan, e, frac)
    return routed * (1 + plan.etp) if plan.etp > 1 else routed  # the received rows, and gathered over etp


def add_expert_op(b: CompositionState, comm: GroupComm, plan: ExpertPlan, e: ExpertOp, r: int, s: int, p: int,
                  label: str, tags: dict, dur: float, reps: list[tuple[Rep, int]],
                  after: dict[Rep, list[int]]) -> dict[Rep, tuple[int, int]]:
    """Grouped GEMM ``e`` of micro-batch ``r`` on stage ``s`` (pipeline rank ``p``) of every built
    replica, with its exchange. Returns each replica's (first task, task after which it is done)."""
    ranks, ep, etp = b.ranks, plan.degree, plan.etp
    frac = b.fractions[r]
    mb = f" mb{r}" if b.tagged else ""
    # The built replicas by block of etp·ep flattened ranks: every group of the exchange lies in one.
    blocks: dict[int, list[tuple[Rep, int]]] = {}
    for rep, gpu in reps:
        blocks.setdefault(_x(ranks, *rep) // (etp * ep), []).append((rep, gpu))
    what = {(FORWARD, "before"): "dispatch", (FORWARD, "after"): "combine",
            (BACKWARD, "before"): "dispatch-grad", (BACKWARD, "after"): "combine-grad"}[(e.phase, e.when)]

    def parallel():  # the expert-parallel groups of the stage, side by side
        return (_gpus(ranks, range(x, x - x % (etp * ep) + etp * ep, etp), p) for x in range(ranks.tp * ranks.data)
                if x % (etp * ep) < etp)

    def parallel_etp():  # the expert-tensor-parallel groups of the stage
        return (_gpus(ranks, range(x, x + etp), p) for x in range(0, ranks.tp * ranks.data, etp))

    def run(deps: dict[Rep, list[int]], members) -> dict[Rep, int]:
        """The exchange's collectives, each once per distinct (sub-)group of the built members."""
        plans = {rep: exchanges(b, plan, e, frac, gpu) for rep, gpu in members}
        pre = dict(deps)
        for k in range(max(len(x) for x in plans.values())):
            by_sub: dict[tuple[int, ...], list[tuple[Rep, int]]] = {}
            for rep, gpu in members:
                by_sub.setdefault(plans[rep][k][1], []).append((rep, gpu))
            for sub, at in by_sub.items():
                kind, _, nbytes = plans[at[0][0]][k]
                sharded = etp > 1 and kind != "all_to_all" and plan.dispatcher != "allgather"
                done = comm.run(kind, sub, nbytes, f"ep {what}{k or ''} {label}{mb} stage{s} gpu{at[0][1]}",
                                {gpu: pre[rep] for rep, gpu in at}, parallel=parallel_etp if sharded else parallel,
                                op_index=e.index,
                                microbatch=r, stage_index=s, group_kind="ep")
                pre.update({rep: [done[gpu]] for rep, gpu in at})
                if (0, 0) in [rep for rep, _ in at]:
                    b.count("ep", kind, sub, nbytes)
        return {rep: pre[rep][0] if len(pre[rep]) == 1 else b.graph.add_sync_tagged(
            f"ep {what} {label}{mb} gpu{gpu}", pre[rep], (gpu,), {"op_index": e.index, "microbatch": r})
            for rep, gpu in members}

    out: dict[Rep, tuple[int, int]] = {}
    early = plan.shared_overlap and e.source is not None  # the dispatch needs only its rows
    # --delay-wgrad-compute (Megatron-Core's delay_wgrad_compute, with the combined 1F1B schedule:
    # TransformerLayerSchedulePlan.run's "mlp_bwd -> mlp_bwd_dw"): a backward grouped GEMM runs its
    # data gradient (half its products) in place and its weight gradient once the MLP's data
    # gradients are done, beside the combine's gradient exchange
    wgrad = plan.delay_wgrad and e.phase == BACKWARD
    for members in blocks.values():
        if e.when == "before":
            start = {rep: ([b.task[(*rep, e.source, r)]] if early and (*rep, e.source, r) in b.task else list(after[rep]))
                     for rep, _ in members}
            ready = run(start, members)
            for rep, gpu in members:
                deps = [ready[rep], *after[rep]] if early else [ready[rep]]
                if wgrad:
                    b.deferred_wgrad[(rep, r)] = b.deferred_wgrad.get((rep, r), 0.0) + dur / 2
                work = b.graph.add_compute_tagged(gpu, dur / 2 if wgrad else dur, f"{label}{mb} gpu{gpu}", tags, deps)
                out[rep] = (work, work)
        elif wgrad:
            dgrad = {rep: b.graph.add_compute_tagged(gpu, dur / 2, f"{label}{mb} dgrad gpu{gpu}", tags, list(after[rep]))
                     for rep, gpu in members}
            done = run({rep: [w] for rep, w in dgrad.items()}, members)
            for rep, gpu in members:
                later = dur / 2 + b.deferred_wgrad.pop((rep, r), 0.0)
                w = b.graph.add_compute_tagged(gpu, later, f"{label}{mb} wgrad gpu{gpu}", tags, [dgrad[rep]])
                end = b.graph.add_sync_tagged(f"ep wgrad {label}{mb} gpu{gpu}", [w, done[rep]], (gpu,),
                                              {"op_index": e.index, "microbatch": r})
                out[rep] = (dgrad[rep], end)
        else:
            work = {rep: b.graph.add_compute_tagged(gpu, dur, f"{label}{mb} gpu{gpu}", tags, list(after[rep]))
                    for rep, gpu in members}
            done = run({rep: [w] for rep, w in work.items()}, members)
            out.update({rep: (work[rep], done[rep]) for rep, _ in members})
    return out


__all__ = ["add_expert_op", "edp_group", "ep_group", "etp_group", "exchange_buffer_bytes", "exchanges",
           "flex_groups"]
