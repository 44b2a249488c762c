"""One cross-stage buffer version's sends for every micro-batch at once.

:meth:`~triosim.graph.composition.CompositionBuilder.add_crossings` sends each version of a
buffer that another stage reads, per micro-batch and replica, hop by hop
(:func:`~triosim.graph.pipeline.sends.send_hop_by_hop`), makes the hops blocking where Megatron
pairs them (:func:`~triosim.graph.pipeline.blocking.block_hops`) and makes the readers wait for
the arriving transfer. The 1T run does that 64,512 times, one Python call chain each. The hops
of a version are the same in every micro-batch (the same stages, GPUs and routes; only the
micro-batch's bytes, its label and the tasks it starts after differ), so this module finds them
once, adds every micro-batch's transfer tasks as whole columns, and then adds the edges micro-batch
by micro-batch in the order the per-call path adds them: the same task ids, rows, successor lists
and predecessor counts. It serves the sends that add nothing but transfers (not the
scatter/gather sends, whose all-gathers add collectives between micro-batches).
"""

from __future__ import annotations

from itertools import chain

from ...hardware.platform import gpu_node
from ..composition_state import CompositionState
from .blocking import StreamNeighbours, after_send, receiving_block
from .schedules import BACKWARD, FORWARD


def sent_last(b: CompositionState, rep: tuple[int, int], src: int, writer_task: int) -> list[int]:
    """With overlapped sends: what waits for a send of replica ``rep`` leaving stage ``src``
    after ``writer_task``: when that task is in its pipeline rank's last block, what follows the
    rank's program (Megatron-Core waits on the last send's handle before ``finalize_model_grads``);
    else nothing."""
    span = b.last_block.get((*rep, b.plan.rank_of(src)))
    if span is None or not span[0] <= writer_task <= span[1]:
        return []
    return b.after_program[span[1]]


def send_version_in_bulk(b: CompositionState, near: StreamNeighbours | None, buffer: str, writer: int, src: int,
                         readers: list[tuple[int, int]], writer_phase: str, read_in: dict[int, str],
                         c_op: int | None, rows: dict) -> None:
    """What the per-call path adds for one version of ``buffer`` written by op ``writer`` on
    stage ``src`` and read by ``readers`` ((op, stage) on other stages, ``read_in`` each reader
    stage's earliest reading phase), every micro-batch's sends whole (no scatter/gather);
    ``rows``: the hops' resolved rows, shared with :func:`~triosim.graph.pipeline.sends.send_hop_by_hop`."""
    graph, plan, ranks, platform = b.graph, b.plan, b.ranks, b.platform
    task, tp_done, blocks = b.task, b.tp_done, b.blocks
    stages = [st for _, st in readers]
    reached = list(set(stages))  # the per-call path's order of reader stages (a set of the same list)
    ds = sorted({d for d, _ in b.replicas})
    reps = [(d, t) for d in ds for dd, t in b.replicas if dd == d]

    # Each replica's hops, forward then backward, as send_hop_by_hop walks them: (a, step, direction).
    hops: list[tuple[int, int, str]] = []
    for step, direction in ((1, "forward"), (-1, "backward")):
        dests = [st for st in stages if (st - src) * step > 0]
        if dests:
            far = max(dests) if step > 0 else min(dests)
            hops += [(a, step, direction) for a in range(src, far, step)]
    per_rep = len(hops)
    per_mb = per_rep * len(reps)
    if not per_mb:
        return
    gpu = {(d, t, a): ranks.rank(d, t, plan.rank_of(a)) for d, t in reps for a in {src, *stages, *(a for a, _, _ in hops)}}

    # Every micro-batch's rows (resolved in the per-call path's order, so resource ids come out alike).
    fractions = b.fractions
    size_at: dict[int, int] = {}  # bytes -> its index in ``resolved``
    resolved: list[list[tuple]] = []  # per distinct size, each (replica, hop)'s (row, latency, s_node, d_node, size)
    mb_size: list[int] = []
    for r, frac in enumerate(fractions):
        nbytes = b.size(buffer, frac)
        k = size_at.get(nbytes)
        if k is None:
            k = size_at[nbytes] = len(resolved)
            got = []
            for d, t in reps:
                for a, step, _ in hops:
                    ga, gb = gpu[(d, t, a)], gpu[(d, t, a + step)]
                    hit = rows.get((ga, gb, nbytes))
                    if hit is None:  # what add_transfer resolves (TaskGraph.add_route_task)
                        s_node, d_node = gpu_node(ga), gpu_node(gb)
                        route = tuple(platform.route(s_node, d_node))
                        hit = rows[(ga, gb, nbytes)] = (
                            graph.resolved_row("transfer", f"send {buffer} mb{r} gpu{ga}->gpu{gb}",
                                               platform.route_time(route, nbytes), route, (ga, gb)),
                            float(platform.route_time(route, 0.0)), s_node, d_node, int(nbytes))
                    got.append(hit)
            resolved.append(got)
        mb_size.append(k)

    # The tasks, as whole columns (TaskGraph.add_row per task, micro-batch after micro-batch).
    base = len(graph.kind)
    count = per_mb * len(fractions)
    per_mb_rows = [[hit[0] for hit in got] for got in resolved]
    mb_rows = per_mb_rows[0] * len(fractions) if len(resolved) == 1 else \
        list(chain.from_iterable(per_mb_rows[k] for k in mb_size))
    graph.kind.extend([row[0] for row in mb_rows])
    graph.duration.extend([row[1] for row in mb_rows])
    graph.resources.extend([row[2] for row in mb_rows])
    graph.devices.extend([row[3] for row in mb_rows])
    per_mb_size = [[hit[4] for hit in got] for got in resolved]
    per_mb_latency = [[row[1] if row[1] < hit[1] else hit[1] for row, hit in zip(rows_k, got)]
                      for rows_k, got in zip(per_mb_rows, resolved)]
    graph.nbytes.extend(chain.from_iterable(per_mb_size[k] for k in mb_size))
    graph.latency.extend(chain.from_iterable(per_mb_latency[k] for k in mb_size))
    names = [(f"send {buffer} mb", f" gpu{gpu[(d, t, a)]}->gpu{gpu[(d, t, a + step)]}") for d, t in reps for a, step, _ in hops]
    graph.label_rows.extend([f"{head}{r}{tail}" for r in range(len(fractions)) for head, tail in names])
    ends = [(hit[2], hit[3]) for hit in resolved[0]]  # the GPUs' nodes: the same for every size
    facts = [(s_node, d_node, a, direction, a + step)
             for (s_node, d_node), (a, step, direction) in zip(ends, hops * len(reps))]
    graph.attr_rows.extend([{"src": s_node, "dst": d_node, "microbatch": r, "stage_index": a, "buffer": buffer,
                         "direction": direction, "dst_stage": dst}
                        for r in range(len(fractions)) for s_node, d_node, a, direction, dst in facts])
    succ, npred = graph.succ, graph.npred
    succ.extend([[] for _ in range(count)])
    npred.extend([1] * count)  # each hop starts after one task (the previous hop or the sender's)

    # The edges, micro-batch by micro-batch in the per-call path's order.
    block_plan = []  # per hop: the (sent, read) phases it blocks in, or None when it stays overlapped
    for a, step, _ in hops:
        st = a + step
        along = FORWARD if step > 0 else BACKWARD
        sent_in = writer_phase if a == src else along
        got_in = read_in.get(st, along)
        block_plan.append((sent_in, got_in) if sent_in == got_in and near is not None and blocks is not None else None)
    readers_at = [[c for c, cst in readers if cst == st] for st in reached]
    hop_to = {a + step: j for j, (a, step, _) in enumerate(hops)}  # a reached stage -> the hop arriving there
    starts = [a == src for a, _, _ in hops]  # each direction starts after the sender's task
    mbs = range(len(fractions))
    # What the edges look up, per replica and micro-batch (nothing below changes these lookups:
    # the loop only adds edges): the sender's task, each blocking hop's edges, the readers.
    plans = []
    for d, t in reps:
        firsts = [task[(d, t, writer, r)] for r in mbs]
        if c_op is not None:
            g_src = gpu[(d, t, src)]
            for r in mbs:
                done = tp_done.get((c_op, r, d))
                if done is not None:  # a buffer a TP collective completes leaves after it
                    firsts[r] = done[g_src]
        blocking = []
        for j, ((a, step, _), phases) in enumerate(zip(hops, block_plan)):
            if phases is None:
                continue  # not a pair Megatron batches: the send stays overlapped
            st = a + step
            ga, gb = gpu[(d, t, a)], gpu[(d, t, st)]
            per = []
            for r in mbs:
                sender = blocks.get((d, t, a, phases[0], r))
                receiver = blocks.get((d, t, st, phases[1], r))
                if sender is None or receiver is None:
                    per.append(None)
                    continue
                # The send is posted after the sender's block, the receive after the receiver's
                # previous task, and the sender's next task waits for the transfer.
                nxt = near.after(ga, sender[1])
                per.append((sender[1], near.before(gb, receiver[0]), nxt, after_send(b, sender[1], nxt)))
            blocking.append((j, per))
        reading = [(hop_to[st], [[task[(d, t, c, r)] for r in mbs] for c in cs]) for st, cs in zip(reached, readers_at)]
        # the receiving group or block starts once the tensor is there (blocking.receiving_block),
        # unless its first task reads it anyway
        gates = []
        if (near is not None and blocks is not None) or b.block_first is not None:
            for (_j, tasks), st in zip(reading, reached):
                got = [receiving_block(b, (d, t), r, src, st, writer_phase, read_in) for r in mbs]
                gates.append([g if g is not None and all(g != tasks[y][r] for y in range(len(tasks))) else None
                              for r, g in enumerate(got)])
        plans.append((firsts, blocking, reading, gates))
    groups = [[k for k, rep in enumerate(reps) if rep[0] == d] for d in ds]
    for r in mbs:
        at_mb = base + r * per_mb
        for group in groups:
            for k in group:
                firsts, blocking, _, _ = plans[k]
                first = firsts[r]
                tid = at_mb + k * per_rep
                prev = first
                later = sent_last(b, reps[k], src, first) if blocks is None else ()
                for opens in starts:
                    if opens:
                        prev = first
                        for x in later:  # the program's last send: what follows the program waits for it
                            succ[tid].append(x)
                            npred[x] += 1
                    succ[prev].append(tid)
                    prev = tid
                    tid += 1
                own = at_mb + k * per_rep
                for j, per in blocking:
                    edges = per[r]
                    if edges is None:
                        continue
                    transfer = own + j
                    sender, posted, nxt, later = edges
                    succ[sender].append(transfer)
                    npred[transfer] += 1
                    if posted is not None:
                        succ[posted].append(transfer)
                        npred[transfer] += 1
                    if nxt is not None:
                        succ[transfer].append(nxt)
                        npred[nxt] += 1
                    for x in later:
                        succ[transfer].append(x)
                        npred[x] += 1
            for x in range(len(reached)):  # the readers wait for the transfer arriving on their GPU
                for y in range(len(readers_at[x])):
                    for k in group:
                        j, tasks = plans[k][2][x]
                        reader = tasks[y][r]
                        succ[at_mb + k * per_rep + j].append(reader)
                        npred[reader] += 1
                for k in group:
                    gates = plans[k][3]
                    if gates and gates[x][r] is not None:
                        j = plans[k][2][x][0]
                        succ[at_mb + k * per_rep + j].append(gates[x][r])
                        npred[gates[x][r]] += 1
