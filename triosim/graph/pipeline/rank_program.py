"""One pipeline rank's program in the composition (:mod:`triosim.graph.composition`): its
forward and backward blocks in the schedule's order on every built replica, each op at the TP
plan's time scale for the micro-batch, the TP collectives after the ops the plan names (two on one op run one after the other), and
ZeRO-3's unit gathers before the units' first ops.

A ``-case`` preset keeps its case's task names and attributes: no micro-batch or stage on cases
0–3's tasks, case 3's collectives named after their op, and case 3's op time (t / N).

A representative build runs each stretch of ops that nothing outside the GPU enters or leaves
as one task (a *segment*, cut by :func:`triosim.graph.pipeline.segments.segment_cuts`): the same times with fewer tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from ... import limits
from ...compute.op_time import op_seconds
from ...trace.precision import gathered_parameter_bytes
from ..collectives.group_comm import Charge, GroupComm
from ..composition_state import CompositionState
from ..context import ring
from ..data import gradient_sync
from ..data.data_parallel import MIB
from ..data.zero import fsdp_units, gathered_copies
from ..expert.dispatch import add_expert_op
from ..offload import add_host_copy
from ..tensor import per_op
from ..tensor.comm_overlap import Part, add_chunk_sends, add_ring_steps, chunk_senders
from ..tensor.userbuffers import gemm_slowdown, partial_sum_seconds
from .block_replay import BlockReplay
from .blocking import record_comm_points
from .combined import CombinedPairs
from .preset_chains import add_preset_chains
from .schedules import BACKWARD, FORWARD, block_order, interleaved_order, interleaved_warmup
from .segments import segment_cuts, split_segments
from .tp_charges import charges_once, tp_charge, tp_groups_of

# Whether a forward TP collective (Megatron style, not --tp-comm-overlap) holds back the op after
# it in program order (see stream_waits in add_rank_program); off only in tests.
FORWARD_TP_HOLDS_STREAM = True


def add_rank_program(b: CompositionState, comm: GroupComm, p: int, waits, colls,
                     params: list[str]) -> dict[tuple[int, int], list[int]]:
    """Pipeline rank ``p``'s forward and backward program on every built replica: its stages'
    blocks in the schedule's order (stages p, p + P, … under the interleaved schedule), with the
    TP collectives and ZeRO-3 gathers they need. Returns each replica's last task there (its
    gradient sync and optimizer follow: :func:`triosim.graph.data.gradient_sync.add_gradient_sync`)."""
    trace, plan, strategy, ranks = b.trace, b.plan, b.strategy, b.ranks
    g = b.graph
    device, slow = gemm_slowdown(trace, strategy, b.platform.network)  # a GEMM keeping an SM margin runs slower
    stages = list(range(p, plan.num_stages, ranks.pp))
    ops = {(st, ph): plan.ops_on(st, ph) for st in stages for ph in (FORWARD, BACKWARD)}
    scale = b.tpp.time_scale
    last: dict[tuple[int, int], list[int]] = {rep: [] for rep in b.replicas}
    gpus = b.gpus(p)
    b.seq.start(gpus)
    ds = sorted({d for d, _ in b.replicas})
    ts = sorted({t for _, t in b.replicas})
    full = lambda q: -(-gathered_parameter_bytes(trace, q) // b.tpp.shard_divisor.get(q, 1))  # noqa: E731
    units_of = {st: fsdp_units(trace, plan, params, st, strategy.bucket_mb * MIB, full) for st in stages} \
        if strategy.zero == 3 else {}
    # --overlap-param-gather (ZeRO 1/2): the updated parameters are gathered per bucket before the
    # first forward op using them, in the stage's first micro-batch only (Megatron-Core's forward
    # pre-hooks: wait for this bucket's all-gather, dispatch the next one).
    param_gather = strategy.zero in (1, 2) and strategy.overlap_param_gather and ranks.data > 1 and b.preset is None
    if param_gather:
        units_of = {st: {FORWARD: fsdp_units(trace, plan, params, st, strategy.bucket_mb * MIB, full)[FORWARD],
                         BACKWARD: []} for st in stages}
    if units_of and ranks.data > 1 and strategy.zero == 3:
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
    rep_gpus = [gpu for _, gpu in reps]
    rep_keys = [rep for rep, _ in reps]
    rep_position = {rep: k for k, rep in enumerate(rep_keys)}
    gpu_suffixes = [f" gpu{gpu}" for gpu in rep_gpus]  # each built GPU's task label ends so
    tp_groups = {d: comm.ordered(ranks.tp_group(d, p)) for d in ds}
    members = {d: [(t, ranks.rank(d, t, p)) for t in ts] for d in ds}
    # each member's GPU and its replica's position in a column of the replicas' tasks
    member_at = {d: [(gpu, rep_position[(d, t)]) for t, gpu in members[d]] for d in ds
                 if all((d, t) in rep_position for t in ts)}
    tp_parallel = partial(tp_groups_of, ranks, p)
    add_compute, task_of, tp_done, seq = g.add_compute_tagged, b.task, b.tp_done, b.seq
    r_count = len(b.fractions)
    # A representative build (replica (0, 0) only, each TP collective a closed-form task) charges
    # each distinct (op, kind, bytes) once: the same collective recurs in every micro-batch.
    gpu0 = gpus[0]
    built0 = (gpu0,)
    rep_only = charges_once(b, comm, tp_groups[0])
    charged: dict[tuple[int, str, int], tuple[Charge, float]] = {}
    tagged = b.tagged
    # The tensor-parallel preset times an op as case 3 did, t / N (t × 1/N is another float when
    # N is not a power of two); a typed composition scales by the plan's factor.
    case3_time = b.preset is not None and b.preset.axis == "tp"
    segments: dict[tuple[int, str], list[list[int]]] = {}
    parts: dict[tuple[int, str], list] = {}  # per segment: its overlap piece (None: the whole segment)
    looked_up: set[int] = set()  # ops whose task a later step looks up (the cuts)
    looked_up_later: set[int] = set()  # … once the program is built
    ovl = b.overlap
    megatron_tp = b.preset is None and getattr(b.tpp, "style", "per-op") == "megatron"
    for st in stages:
        cut_before, cut_after, later = segment_cuts(b, st, params, waits_here, colls, units_of.get(st))
        looked_up_later |= later
        if ovl is not None:  # chunked and split ops are tasks of their own
            cut_before |= ovl.cut_ops
            cut_after |= ovl.cut_ops
        looked_up |= cut_before | cut_after
        for ph in (FORWARD, BACKWARD):
            segs = split_segments(ops[(st, ph)], cut_before, cut_after, b.fuse)
            pieces = ovl.pieces(segs) if ovl is not None else [(seg, None) for seg in segs]
            segments[(st, ph)] = [seg for seg, _ in pieces]
            parts[(st, ph)] = [part for _, part in pieces]
    # Each segment's fixed facts, once per (stage, phase): the loop below runs once per segment,
    # micro-batch and replica. (first op, last op, label, attributes, ops, TP collectives it
    # waits for, phase, the TP collectives after it, their labels' start)
    seg_facts: dict[tuple[int, str], list[tuple]] = {}
    for key, segs in segments.items():
        facts = seg_facts[key] = []
        for seg, part in zip(segs, parts[key]):
            i, i_last = seg[0], seg[-1]
            cs = tuple(colls.get(i_last, ()))
            # a run of ops nothing outside the GPU waits for or feeds: one task, same times
            label, extra = (labels[i], {}) if len(seg) == 1 else \
                (f"{labels[i]} .. {labels[i_last]}", {"ops": tuple(seg)})
            if case3_time and ranks.tp > 1 and scale[i] != 1.0:
                extra = {**extra, "shard": ranks.tp}  # as case 3 marked a split op
            w = waits_here[i]
            if part is not None:
                label, extra, w, cs = piece_facts(part, label, extra, seg, waits_here, cs)
            keep_i, keep_last = i in looked_up, i_last in looked_up or bool(cs)  # its collectives look it up
            if part is not None:
                keep_i = keep_last = keep_i or keep_last or i in looked_up  # the last piece's task is the op's
            c_names = tuple(f"{c.kind.replace('_', '')} {labels[i_last]}" for c in cs)
            facts.append((i, i_last, label, extra, tuple(seg), w, trace.ops[i].stage, cs,
                          tuple(f"tp {n}" for n in c_names) if tagged else c_names, keep_i, keep_last, part))
    seg_time: dict[tuple[int, str, float], list[float]] = {}  # (stage, phase, fraction) -> seconds per segment

    def seconds(s: int, ph: str, frac: float) -> list[float]:
        """Each segment's seconds in block (stage ``s``, phase ``ph``) of a micro-batch of ``frac``."""
        durs = seg_time.get((s, ph, frac))
        if durs is None:
            mb = max(1, round(frac * trace.batch_size))
            durs = seg_time[(s, ph, frac)] = []
            for seg, part in zip(segments[(s, ph)], parts[(s, ph)]):
                dur = 0.0
                for j in seg:
                    dur += per_op.op_time(trace, j, ranks.tp) if case3_time else op_seconds(trace, j, mb) * scale[j]
                durs.append(dur if part is None else dur * part.frac * slow(part.margin))
        return durs

    if plan.virtual > 1:
        order = interleaved_order(ranks.pp, r_count, p, plan.virtual)
    else:
        order = [(ph, r, 0) for ph, r in block_order(strategy.schedule, ranks.pp, r_count, p)]
    if b.preset is not None and not colls and not units_of:
        add_preset_chains(b, p, order, ops, seconds, last, looked_up)
        return last
    context = getattr(b, "context", None)  # context parallelism: its attention ops (graph/context)
    attention = context.ops if context is not None else {}
    experts = getattr(b, "experts", None)  # expert parallelism: grouped GEMMs with token exchanges (graph/expert)
    exchanged = experts.ops if experts is not None else {}
    host = getattr(b, "host_copies", None) or {}  # activation offload's copies (graph/offload)
    host_waits: dict[tuple, int] = {}  # (replica, op, micro-batch) -> the reload it waits for
    stats = b.stats
    ran: list = []  # with blocking sends: each block run and its first and last task per replica
    ring_in: dict[tuple[int, int, int], dict[int, list[int]]] = {}  # (AG op, mb, d) -> gpu -> arriving steps

    def ring_exchange(c, nbytes: int, name: str, r: int, chained: bool) -> None:
        """--tp-comm-overlap: all-gather ``c`` as ring-exchange steps (graph.tensor.comm_overlap)."""
        n = ranks.tp
        for d in ds:
            built = [(t, gpu) for t, gpu in members[d]]
            after = {gpu: [tp_done[(c.op, r, d)][gpu]] if chained else [task_of[(d, t, c.op, r)]] for t, gpu in built}
            arriving = add_ring_steps(g, b.platform, tp_groups[d], built, -(-nbytes // n), after, name + str(d),
                                      sms=ovl.sms(c.op, c.kind, False), op_index=c.op, microbatch=r, group_kind="tp")
            ring_in[(c.op, r, d)] = arriving
            tp_done[(c.op, r, d)] = {gpu: steps[-1] for gpu, steps in arriving.items()}
            if d == 0:
                b.count("tp", c.kind, tp_groups[d], nbytes)

    rs_prev: dict[tuple[int, int, int], dict[int, int]] = {}  # (row op, mb, d) -> gpu -> its last chunk

    def rs_chunk(part: Part, r: int, frac: float, mb_s: str, s: int) -> None:
        """--tp-comm-overlap: the reduce-scatter of one chunk of a row GEMM, after that chunk and
        after the previous chunk's (graph.tensor.comm_overlap)."""
        c = next(x for x in colls[part.rs] if x.kind == "reduce_scatter")
        # the micro-batch's share of the rank's 1/cp of the tokens, as an unchunked collective's;
        # the chunks carry it exactly once between them
        whole = c.nbytes if frac == 1.0 and ranks.cp == 1 else int(round(c.nbytes * frac / ranks.cp))
        nbytes = whole * (part.chunk + 1) // part.splits - whole * part.chunk // part.splits
        held = ovl.sms(part.rs, c.kind, False)
        name = f"tp reducescatter {labels[part.rs]} chunk{part.chunk}{mb_s} stage{s} dp"
        for d in ds:
            after = {}
            for t, gpu in members[d]:
                deps = [task_of[(d, t, part.rs, r)]]
                if part.chunk:
                    deps.append(rs_prev[(part.rs, r, d)][gpu])
                after[gpu] = deps
            if rep_only:
                charge, _ = tp_charge(comm, charged, c, nbytes, tp_groups[0], tp_parallel)
                task = comm.add_charged(charge, name + "0", after[gpu0], built0, op_index=part.rs, microbatch=r,
                                        group_kind="tp", sms=held)
                done = {gpu0: task}
            else:
                done = comm.run(c.kind, tp_groups[d], nbytes, name + str(d), after, parallel=tp_parallel,
                                op_index=part.rs, microbatch=r, group_kind="tp", sms=held)
            rs_prev[(part.rs, r, d)] = done
            if d == 0:
                b.count("tp", c.kind, tp_groups[d], nbytes)
            if part.last:
                tp_done[(part.rs, r, d)] = done

    ring_sent: dict[tuple[int, int, int], dict[int, list[int]]] = {}  # (row op, mb, d) -> gpu -> its sends

    def rs_ring_chunk(part: Part, r: int, frac: float, mb_s: str, s: int, reps) -> None:
        """--tp-comm-overlap, ring-exchange reduce-scatter (graph.tensor.comm_overlap): after a
        chunk of the row GEMM, its send to the rank that owns it; after the last (the rank's own),
        the sum of the partial chunks once every send to and from the rank is done."""
        c = next(x for x in colls[part.rsring] if x.kind == "reduce_scatter")
        whole = c.nbytes if frac == 1.0 and ranks.cp == 1 else int(round(c.nbytes * frac / ranks.cp))
        nbytes = -(-whole // part.splits)
        name = f"tp reducescatter {labels[part.rsring]}{mb_s} stage{s} dp"
        for d in ds:
            sent = ring_sent.setdefault((part.rsring, r, d), {gpu: [] for _, gpu in members[d]})
            chunk_of = {gpu: task_of[(d, t, part.rsring, r)] for t, gpu in members[d]}
            if part.chunk < part.splits - 1:
                after = {gpu: [chunk_of[gpu], *sent[gpu][-1:]] for gpu in sent}
                for gpu, task in add_chunk_sends(g, b.platform, tp_groups[d], members[d], nbytes, part.chunk, after,
                                                 name + str(d), ovl.sms(part.rsring, c.kind, False),
                                                 op_index=part.rsring, microbatch=r, group_kind="tp").items():
                    sent[gpu].append(task)
                continue
            waits = chunk_senders(tp_groups[d], members[d], sent)
            dur = partial_sum_seconds(nbytes, part.splits, device)
            tp_done[(part.rsring, r, d)] = {
                gpu: g.add_compute(gpu, dur, f"{name}{d} sum gpu{gpu}", after=[chunk_of[gpu], *waits[gpu]],
                                   microbatch=r, stage_index=s, tp_sum=part.rsring) for gpu in sent}
            if d == 0:
                b.count("tp", c.kind, tp_groups[d], whole)
        for rep, gpu in reps:  # the sum runs on the GPU's stream, after the GEMM's last chunk
            done = tp_done.get((part.rsring, r, rep[0])) if part.last else None
            if done is not None:
                last[rep] = [done[gpu]]

    # --overlap-param-gather under the interleaved schedule: Megatron-LM aligns the gathers
    # (align_param_gather, its default there): every bucket of model chunks 0 and 1 is gathered
    # from the start, and chunk c's at the forward block (c − 1)·P − p of rank p
    # (schedules.forward_backward_pipelining_with_interleaving, param_sync_func); the forward ops
    # wait for their bucket.
    aligned = param_gather and plan.virtual > 1
    dispatch: dict[int, list[int]] = {}
    if aligned:
        for c in range(plan.virtual):
            dispatch.setdefault(0 if c < 2 else max(0, (c - 1) * ranks.pp - p), []).append(c * ranks.pp + p)
    early: dict[tuple, int] = {}  # (stage, unit, replica) -> its gather, dispatched ahead
    forwards = 0
    pairs = CombinedPairs(b, order, p)  # --moe-a2a-overlap: forward and backward blocks as two chains
    # A representative rank whose blocks nothing but TP collectives, ring attention's key/value
    # exchanges and ZeRO-3's unit gathers enter: the blocks that repeat per micro-batch are added
    # from a template (graph/pipeline/block_replay). Under --overlap-param-gather only the first
    # micro-batch's forward blocks gather: they are built op by op, the rest from templates.
    replay = BlockReplay(g, comm.charged_rows, task_of, tp_done, seq[gpu0], gpu0, b.replicas[0], stats,
                         (charged, comm.charges, seg_time, gathered, ring_in, rs_prev), frozenset(looked_up_later),
                         gathered) \
        if rep_only and tagged and ovl is None and not host and not exchanged \
        and (not attention or context.comm_type == "p2p") \
        and not pairs.pairs \
        else None
    # every built replica's task of a segment is one column of consecutive tasks: b.task keeps it
    # as one record (the replay reads b.task's entries in insertion order: not with it)
    as_columns = len(reps) > 1 and replay is None and len(reps) == len(gpus)
    for pos, (ph, r, v) in enumerate(order):
        s = v * ranks.pp + p
        if len(g.kind) > limits.MAX_TASKS:  # the checks before building count operators, not collectives
            limits.check_tasks_built(len(g.kind), f"stage {p}'s block {pos + 1} of {len(order)}")
        pairs.before(pos, last)
        if ph == FORWARD and aligned:
            for st in dispatch.pop(forwards, ()):
                for kk in range(len(units_of[st][FORWARD])):
                    gradient_sync.gather_unit(b, comm, st, units_of[st][FORWARD], kk, FORWARD, 0, last, gathered, ts)
                    early.update(((st, kk, rep), gathered[(*rep, "unit", kk)]) for rep in b.replicas)
            forwards += 1
        if not ops[(s, ph)]:
            continue
        units = units_of.get(s)
        frac = b.fractions[r]
        unit_at: dict[int, int] = {}
        if units is not None and param_gather and r != 0:
            units = None  # gathered once, before the first micro-batch's forward
        if units is not None and units[ph]:
            unit_at = {u.first_op: k for k, u in enumerate(units[ph])}
            if aligned:  # dispatched ahead: the block's ops wait for them
                gathered.update(((*rep, "unit", kk), early[(s, kk, rep)]) for kk in range(len(units[ph]))
                                for rep in b.replicas)
        durs = seconds(s, ph, frac)
        # A forward TP collective is synchronous in Megatron (torch.distributed's blocking call
        # makes the compute stream wait for NCCL's): the op after it in program order waits for
        # it even when it does not read its result (the position embedding after the word
        # embedding's all-reduce). Backward ones are issued asynchronously beside the weight
        # gradient's GEMM, and --tp-comm-overlap's are pipelined with their GEMMs. (The per-op
        # style keeps the original's tensor parallelism, where an op waits only for what it reads.)
        # A block still ends with its last compute task (what its sends follow: blocking sends
        # look up the compute task after it), so a collective after the block's last op holds
        # only what reads it.
        stream_waits = FORWARD_TP_HOLDS_STREAM and ph == FORWARD and megatron_tp and ovl is None
        block_end = ops[(s, ph)][-1] if ops[(s, ph)] else None
        mb_s = f" mb{r}" if tagged else ""
        firsts = {rep: None for rep in b.replicas} if b.blocks is not None or b.block_first is not None else None
        firsts_open = True  # some replica's first task of the block not yet known
        rec = tally_log = None
        replayed = False
        if replay is not None and not host_waits and not (param_gather and unit_at):
            replayed = replay.replay((s, ph, frac), r, last, firsts)
            rec = None if replayed else replay.start((s, ph, frac), r, last)
            tally_log = rec.tally if rec is not None else None
        if unit_at and not aligned and not replayed:  # ZeRO-3: the block's first unit, one unit ahead
            gradient_sync.gather_unit(b, comm, s, units[ph], 0, ph, r, last, gathered, ts, tally_log)
        for (i, i_last, base, extra, seg_ops, w, phase, cs, c_names, keep_i, keep_last, part), dur in \
                zip(seg_facts[(s, ph)] if not replayed else (), durs):
            step = part.step if part is not None and part.ring is not None else 0
            k = unit_at.get(i) if unit_at else None
            if part is not None and unit_at:  # a chunked run of ops may start units after its first op
                ks = [unit_at[j] for j in seg_ops if j in unit_at] if part.first else []
                for kk in ks[:-1]:
                    if kk + 1 < len(units[ph]) and not aligned:
                        gradient_sync.gather_unit(b, comm, s, units[ph], kk + 1, ph, r, last, gathered, ts,
                                                  tally_log)
                k = ks[-1] if ks else None
            if k is not None and k + 1 < len(units[ph]) and not aligned:
                gradient_sync.gather_unit(b, comm, s, units[ph], k + 1, ph, r, last, gathered, ts, tally_log)
            label = base + mb_s
            # one attribute dict for the segment's task on every GPU (in add_compute's key order)
            tags = {"op": i, "stage": phase, "microbatch": r, "stage_index": s, **extra} if tagged \
                else {"op": i, "stage": phase, **extra}
            if i in host:  # a copy to or from host memory, beside the compute stream
                add_host_copy(b, host[i], i, r, frac, f"{base}{mb_s}", tags, reps, last, host_waits)
                continue
            if i in attention or i in exchanged:  # the op with its exchange over the context/expert ranks
                waits = {rep: [*last[rep], *(tp_done[(c_op, r, rep[0])][gpu] for c_op in w
                                             if (c_op, r, rep[0]) in tp_done)] for rep, gpu in reps}
                if i in attention:
                    ends = ring.add_attention(b, comm, context, attention[i], r, s, p, base, tags, dur, reps, waits,
                                              tally_log)
                else:
                    ends = add_expert_op(b, comm, experts, exchanged[i], r, s, p, base, tags, dur, reps, waits)
                for rep, gpu in reps:
                    task_of[(*rep, i, r)] = ends[rep][1]
                    seq.append(gpu, (ends[rep][0], seg_ops, r))
                    last[rep] = [ends[rep][1]]
                    if firsts is not None and firsts[rep] is None:  # a block may start with it (a cut before it)
                        firsts[rep] = ends[rep][0]
                continue
            if not (host_waits or w or k is not None or step):  # each GPU after its last task only
                afters = list(map(last.__getitem__, rep_keys))  # (a case-3 run: 4,096 GPUs a segment)
            elif len(reps) > 1 and not (host_waits or k is not None or step):  # … and the TP collectives of ``w``
                # (the collectives completing on each replica row d found once per row)
                dones_of = {d: [x for x in (tp_done.get((c_op, r, d)) for c_op in w) if x is not None] for d in ds}
                afters = []
                for rep, gpu in reps:
                    dones = dones_of[rep[0]]
                    after = [*last[rep], dones[0][gpu]] if len(dones) == 1 else \
                        [*last[rep], *[done[gpu] for done in dones]]
                    if len(after) == 2:  # the common pair: the GPU's last task and one collective's
                        if after[0] == after[1]:
                            del after[1]
                    elif len(after) > 2:
                        after = list(dict.fromkeys(after))
                    afters.append(after)
            else:
                afters = []
                for rep, gpu in reps:
                    after = last[rep]
                    held = host_waits.pop((rep, i, r), None) if host_waits else None
                    if held is not None:
                        after = [*after, held]
                    if w or k is not None or step:
                        after = list(after)
                        if step:  # a chunk of a GEMM waits for the ring step bringing its shard
                            after.append(ring_in[(part.ring, r, rep[0])][gpu][step - 1])
                        for c_op in w:
                            done = tp_done.get((c_op, r, rep[0]))
                            if done is not None:
                                after.append(done[gpu])
                        if k is not None:
                            after.append(gathered[(*rep, "unit", k)])
                        after = list(dict.fromkeys(after))
                    afters.append(after)
            if len(reps) == 1:
                tasks: Sequence[int] = (add_compute(gpu0, dur, f"{label} gpu{gpu0}", tags, afters[0]),)
            else:  # every built GPU's task as whole columns (a case-3 run: 4,096 GPUs a segment)
                tasks = g.add_compute_each(rep_gpus, dur, list(map(label.__add__, gpu_suffixes)), tags, afters)
            # Only a run's ends are looked up (a crossing buffer's writer or reader, a bucket's last
            # gradient, the op a TP collective follows): the cuts put them there, and only the cut
            # ones are kept (a 1T mesh would otherwise hold 10^6 keys).
            if as_columns:  # the replicas' tasks are one column: kept as one record (graph.task_of)
                if keep_i:
                    task_of.add_column(i, r, rep_position, tasks[0])
                if keep_last and (i_last != i or not keep_i):
                    task_of.add_column(i_last, r, rep_position, tasks[0])
            elif keep_i and keep_last and i != i_last:  # both keys of a replica before the next replica's
                for rep, task in zip(rep_keys, tasks):
                    task_of[(*rep, i, r)] = task_of[(*rep, i_last, r)] = task
            elif keep_i or keep_last:  # one key (a one-op segment's first op is its last)
                kept = i if keep_i else i_last
                task_of.update(zip([(*rep, kept, r) for rep in rep_keys], tasks))
            if part is None or part.first:  # a piece after the first is no memory step of its own
                if as_columns:
                    seq.add_column(rep_gpus, tasks[0], seg_ops, r)
                else:
                    for gpu, task in zip(rep_gpus, tasks):
                        seq.append(gpu, (task, seg_ops, r))
            last.update(zip(rep_keys, map(list, zip(tasks))))  # [task] each, made in C
            if firsts is not None and firsts_open:
                for rep, task in zip(rep_keys, tasks):
                    if firsts[rep] is None:
                        firsts[rep] = task
                firsts_open = len(rep_keys) < len(firsts)  # else every replica's first task is set
            if part is not None and part.rs is not None:  # pipelined: this chunk's share of the reduce-scatter
                rs_chunk(part, r, frac, mb_s, s)
            elif part is not None and part.rsring is not None:  # ring exchange: this chunk's send, or the sum
                rs_ring_chunk(part, r, frac, mb_s, s, reps)
            for k_c, (c, c_name) in enumerate(zip(cs, c_names)):
                # a second collective on the op (sequence parallel, blocks back to back) gathers
                # what the first reduced: it starts when the first is done
                # the micro-batch's share of the payload, of the rank's 1/cp of the tokens
                nbytes = c.nbytes if frac == 1.0 and ranks.cp == 1 else int(round(c.nbytes * frac / ranks.cp))
                name = f"{c_name}{mb_s} stage{s} dp"
                chained = k_c > 0 or (part is not None and (part.rs is not None or part.rsring is not None))
                if ovl is not None and c.op in ovl.ring and c.kind == "all_gather" and not c.redo:
                    ring_exchange(c, nbytes, name, r, chained)
                    continue
                held = ovl.sms(c.op, c.kind, c.redo) if ovl is not None else None
                sms = {"sms": held} if held is not None else {}
                if rep_only:  # one built GPU per group: the task its charge, found once, describes
                    charge, wire = tp_charge(comm, charged, c, nbytes, tp_groups[0], tp_parallel)
                    before = [task_of[(0, 0, i_last, r)]] if not chained else [tp_done[(i_last, r, 0)][gpu0]]
                    for call in range(c.calls):  # back-to-back calls, each waiting for the previous
                        task = comm.add_charged(charge, f"{name}0" + (f" call{call}" if call else ""), before,
                                                built0, op_index=i_last, microbatch=r, group_kind="tp", **sms)
                        before = [task]
                    tp_done[(i_last, r, 0)] = {gpu0: task}
                    tally = stats.get("tp")
                    if tally is None:
                        tally = stats["tp"] = {"collectives": 0, "payload_bytes": 0, "wire_bytes_per_gpu": 0.0}
                    tally["collectives"] += c.calls  # as b.count, without looking the group up again
                    tally["payload_bytes"] += nbytes * c.calls
                    tally["wire_bytes_per_gpu"] += wire * c.calls
                    if tally_log is not None:
                        tally_log.append(("tp", c.calls, nbytes * c.calls, wire * c.calls))
                    continue
                for d in ds:
                    group = tp_groups[d]
                    column = task_of.column(i_last, r) if not chained else None
                    if column is not None and column[0] is rep_position and d in member_at:  # one column's tasks
                        first = column[1]
                        after = {gpu: [first + k] for gpu, k in member_at[d]}
                    elif not chained:
                        after = {gpu: [task_of[(d, t, i_last, r)]] for t, gpu in members[d]}
                    else:  # a second collective on one op starts when the first is done
                        prev = tp_done[(i_last, r, d)]
                        after = {gpu: [prev[gpu]] for _, gpu in members[d]}
                    for call in range(c.calls):
                        if tagged:
                            done = comm.run(c.kind, group, nbytes, f"{name}{d}" + (f" call{call}" if call else ""),
                                            after, parallel=tp_parallel, op_index=i_last, microbatch=r,
                                            group_kind="tp", **sms)
                        else:  # the tensor-parallel preset: as case 3 named it
                            done = comm.run(c.kind, group, nbytes, c_name, after, op=i_last)
                        after = {gpu: [task] for gpu, task in done.items()}
                        if d == 0:
                            b.count("tp", c.kind, group, nbytes)
                    tp_done[(i_last, r, d)] = done
            if cs and stream_waits and i_last != block_end:
                for rep, gpu in reps:
                    done = tp_done.get((i_last, r, rep[0]))
                    if done is not None:
                        last[rep] = [done[gpu]]
        if rec is not None:
            replay.finish(rec, last, firsts)
        if firsts is not None:
            ran.append((pos, (s, ph, r), {rep: (firsts[rep], last[rep][0]) for rep in b.replicas}))
    pairs.before(len(order), last)  # the program may end with a pair
    if b.block_first is not None:  # overlapped sends: a block waits for what it receives
        for _pos, (s, ph, r), tasks in ran:
            for rep, (first, _last) in tasks.items():
                b.block_first[(*rep, s, ph, r)] = first
    if b.blocks is not None:  # blocking sends look each block's communication point up
        warm = interleaved_warmup(ranks.pp, r_count, p, plan.virtual) if plan.virtual > 1 else None
        record_comm_points(b, ran, warm, len(order))
    return last


def piece_facts(part: Part, label: str, extra: dict, seg: list[int], waits_here, cs: tuple):
    """A piece's label, attributes, the TP collectives it waits for (its ops' all, but the one it
    runs beside) and the collectives after it (its ops' own after the last piece, less a
    reduce-scatter its chunks already ran)."""
    if part.ring is not None:
        label, extra = f"{label} chunk{part.step}", {**extra, "chunk": part.step}
    elif part.rs is not None or part.rsring is not None:
        label, extra = f"{label} chunk{part.chunk}", {**extra, "chunk": part.chunk}
    else:
        half = "wgrad" if part.first is False else "dgrad"
        label, extra = f"{label} {half}", {**extra, "half": half}
    w = tuple(dict.fromkeys(c for j in seg for c in waits_here[j] if c != part.skip))
    if not part.last:
        cs = ()
    elif part.rs is not None or part.rsring is not None:
        cs = tuple(c for c in cs if c.kind != "reduce_scatter")
    return label, extra, w, cs


__all__ = ["add_rank_program"]
