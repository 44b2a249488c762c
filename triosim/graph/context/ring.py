"""One attention op of a context-parallel rank in the DAG, with its exchange of keys and values.

``p2p`` (ring attention, as Transformer Engine's ``AttnFuncWithCPAndKVP2P`` runs it): the op
becomes N partial attentions (compute tasks) and, between them, point-to-point transfers of a
key/value chunk from the ring neighbour (transfer tasks on the route between the two GPUs):

- forward, step j = 1..N−1 receives from rank c−1 the chunk it held in step j−1, once that chunk
  reached it (its own after its Q/K/V ops for j = 1) and once the receiving buffer is free (two
  buffers: step j reuses the one step j−2 read); partial attention j waits for partial j−1 (one
  stream) and for its chunk;
- backward (the reverse ring, from rank c+1): exchange j = 0..N−1 carries the keys/values of
  step j+1 (not in the last) and the key/value gradients of step j−1 (not in the first), so it
  waits for the sender's partial j−1; partial j waits for exchange j−1; the op ends when its
  last partial and the last gradients have arrived.

So a transfer runs beside the partial attention before it and is exposed only when it is
slower: the scheduler sees the overlap. A partial attention takes the op's time × its causal
work (:func:`~triosim.graph.context.plan.step_work`) / the rank's, the same for every step of
every rank under the balanced layout.

In a build of one representative (data rank 0 only), the ring neighbour is not built; it runs
the same program at the same times (every rank of the ring is alike), so a transfer from it
waits for the representative's own matching task.

``a2a`` (DeepSpeed-Ulysses style): an all-to-all of Q, K and V over the cp group before the
attention (each rank then holds the whole sequence of 1/N of the heads) and of the output after
it; backward, of the output gradient before and of the Q/K/V gradients after. ``allgather``:
keys and values all-gathered before the attention (forward and again in backward), their
gradients reduce-scattered after the backward. Both are collectives of the cp group
(:class:`~triosim.graph.collectives.group_comm.GroupComm`), not overlapped with the attention.
"""

from __future__ import annotations

from ..collectives.group_comm import GroupComm
from ..composition_state import CompositionState
from .plan import (
    BACKWARD,
    BALANCED_STEP_WORK,
    FORWARD,
    AttentionOp,
    ContextPlan,
    ring_exchange_bytes,
    step_work,
)

Rep = tuple[int, int]


def exchange_bytes(b: CompositionState, a: AttentionOp, frac: float, cp: int) -> list[int]:
    """Bytes of each ring exchange of op ``a`` on one rank, for a micro-batch of ``frac``."""
    kv = b.size(a.k, frac) + b.size(a.v, frac)
    dkv = b.size(a.grads[1], frac) + b.size(a.grads[2], frac) if a.phase == BACKWARD else 0
    return ring_exchange_bytes(kv, dkv, cp, a.phase)


def exchange_sent(b: CompositionState, plan: ContextPlan, a: AttentionOp, frac: float) -> int:
    """Bytes one rank sends in op ``a``'s exchange: the ring's sends, or what each collective
    moves out of the rank ((N−1)/N of an all-to-all's or reduce-scatter's payload, of the
    gathered size for an all-gather)."""
    cp = plan.degree
    if plan.comm_type == "p2p":
        return sum(exchange_bytes(b, a, frac, cp))
    total = sum(nbytes for _, nbytes in _collectives(b, plan, a, frac) if nbytes)
    return total * (cp - 1) // cp


def _collectives(b: CompositionState, plan: ContextPlan, a: AttentionOp, frac: float):
    """The (kind, payload) before op ``a`` and after it ((None, 0) when there is none)."""
    cp, size = plan.degree, b.size
    kv = size(a.k, frac) + size(a.v, frac)
    if plan.comm_type == "a2a":
        if a.phase == FORWARD:
            return ("all_to_all", size(a.q, frac) + kv), ("all_to_all", size(a.out, frac))
        return ("all_to_all", size(a.out, frac)), ("all_to_all", sum(size(x, frac) for x in a.grads))
    # allgather: keys and values gathered whole; backward, their gradients reduce-scattered
    if a.phase == BACKWARD:
        return ("all_gather", cp * kv), ("reduce_scatter", cp * (size(a.grads[1], frac) + size(a.grads[2], frac)))
    return ("all_gather", cp * kv), (None, 0)


def transient_bytes(b: CompositionState, plan: ContextPlan, a: AttentionOp, frac: float) -> int:
    """Bytes op ``a``'s exchange holds on one rank while it runs, beyond the trace's buffers:
    p2p, Transformer Engine's buffers (forward every step's key/value chunk, cp of them; backward
    two of keys/values and their gradients); a2a, the all-to-all's copies; allgather, the
    gathered keys and values (and their whole gradients in backward)."""
    cp, size = plan.degree, b.size
    kv = size(a.k, frac) + size(a.v, frac)
    dkv = size(a.grads[1], frac) + size(a.grads[2], frac) if a.phase == BACKWARD else 0
    if plan.comm_type == "p2p":
        return cp * kv if a.phase == FORWARD else 2 * (kv + dkv)
    if plan.comm_type == "a2a":
        if a.phase == FORWARD:
            return size(a.q, frac) + kv + size(a.out, frac)
        return size(a.out, frac) + sum(size(g, frac) for g in a.grads)
    return cp * kv if a.phase == FORWARD else cp * (kv + dkv)


def add_attention(b: CompositionState, comm: GroupComm, plan: ContextPlan, a: AttentionOp, r: int, s: int, p: int,
                  label: str, tags: dict, dur: float, reps: list[tuple[Rep, int]],
                  after: dict[Rep, list[int]], tally_log: list | None = None) -> dict[Rep, tuple[int, int]]:
    """Attention op ``a`` of micro-batch ``r`` on stage ``s`` (pipeline rank ``p``) of every
    built replica in ``reps`` (``after``: what each waits for first; ``dur``: the op's seconds on
    one rank). Returns each replica's (first task, task after which the op is done).
    ``tally_log``: where the ring's additions to the ``cp`` statistics are logged, in order (a
    block replayed from a template adds them again: graph/pipeline/block_replay)."""
    if plan.comm_type == "p2p":
        return _ring(b, plan, a, r, s, p, label, tags, dur, reps, after, tally_log)
    return _collective(b, comm, plan, a, r, s, p, label, tags, dur, reps, after)


def exchange_waits(phase: str, j: int, ready: list[int], moved: dict[int, int], sender: list[int],
                   receiver: list[int]) -> list[int]:
    """What the ring exchange of iteration ``j`` waits for: the sender holding the chunk (its Q/K/V
    ops done, ``ready``, or the chunk arrived from its own neighbour, ``moved``) and, backward,
    the gradients of its partial j−1 (``sender``); the receiver's buffer free (forward: two
    buffers, step j−2's; backward: step j−1's, ``receiver``). Not the partial attention the
    exchange runs beside: that is the overlap."""
    if phase == FORWARD:
        pre = list(ready) if j == 1 else [moved[j - 1]]
        if j >= 2:
            pre.append(receiver[j - 2])
    else:
        pre = list(ready) if j == 0 else [moved[j - 1], sender[j - 1]]
        if j >= 1:
            pre.append(receiver[j - 1])
    return list(dict.fromkeys(pre))


def _ring(b: CompositionState, plan: ContextPlan, a: AttentionOp, r: int, s: int, p: int, label: str, tags: dict,
          dur: float, reps: list[tuple[Rep, int]], after: dict[Rep, list[int]],
          tally_log: list | None) -> dict[Rep, tuple[int, int]]:
    g, ranks, cp = b.graph, b.ranks, plan.degree
    frac = b.fractions[r]
    sent = exchange_bytes(b, a, frac, cp)
    built = {rep for rep, _ in reps}
    step = -1 if a.phase == FORWARD else 1  # forward from rank c−1, backward from rank c+1
    first = 1 if a.phase == FORWARD else 0  # exchange index of sent[0]

    def peer(rep: Rep) -> Rep:
        d, t = rep
        return d - d % cp + (d % cp + step) % cp, t

    part: dict[Rep, list[int]] = {rep: [] for rep in built}
    moved: dict[Rep, dict[int, int]] = {rep: {} for rep in built}
    mb = f" mb{r}" if b.tagged else ""
    step_tags = [{**tags, "cp_step": j} for j in range(cp)]
    seconds = {}
    for rep, _ in reps:
        c = rep[0] % cp
        seconds[rep] = [dur / cp * step_work(c, j, cp, a.phase) / BALANCED_STEP_WORK for j in range(cp)]
    stats = b.stats.setdefault("cp", {"collectives": 0, "payload_bytes": 0, "wire_bytes_per_gpu": 0.0})
    for j in range(cp):
        x = j - first  # the exchange of this iteration
        if 0 <= x < len(sent):
            for rep, gpu in reps:
                src = peer(rep)
                held = src if src in built else rep  # an unbuilt neighbour runs as this rank does
                src_gpu = ranks.rank(src[0], src[1], p)
                pre = exchange_waits(a.phase, j, after[held], moved[held], part[held], part[rep])
                moved[rep][j] = g.add_transfer(
                    b.platform, src_gpu, gpu, sent[x], f"cp {'kv' if a.phase == FORWARD else 'kv+dkv'} {label}{mb} "
                    f"step{j} gpu{src_gpu}->gpu{gpu}", after=pre, op_index=a.index,
                    microbatch=r, stage_index=s, group_kind="cp", cp_step=j)
                if rep == (0, 0):
                    stats["collectives"] += 1
                    stats["payload_bytes"] += sent[x]
                    stats["wire_bytes_per_gpu"] += float(sent[x])
                    if tally_log is not None:
                        tally_log.append(("cp", 1, sent[x], float(sent[x])))
        for rep, gpu in reps:
            if j == 0:
                deps = list(after[rep])
            else:
                deps = [part[rep][j - 1], moved[rep][j - 1] if a.phase == BACKWARD else moved[rep][j]]
            part[rep].append(g.add_compute_tagged(gpu, seconds[rep][j], f"{label} ring step{j}{mb} gpu{gpu}",
                                                  step_tags[j], deps))
    out: dict[Rep, tuple[int, int]] = {}
    for rep, gpu in reps:
        end = part[rep][-1]
        if a.phase == BACKWARD:  # the last key/value gradients come home
            end = g.add_sync_tagged(f"{label} ring done{mb} gpu{gpu}", [end, moved[rep][cp - 1]], (gpu,),
                                    {"op_index": a.index, "microbatch": r})
        out[rep] = (part[rep][0], end)
    return out


def _collective(b: CompositionState, comm: GroupComm, plan: ContextPlan, a: AttentionOp, r: int, s: int, p: int,
                label: str, tags: dict, dur: float, reps: list[tuple[Rep, int]],
                after: dict[Rep, list[int]]) -> dict[Rep, tuple[int, int]]:
    ranks, cp = b.ranks, plan.degree
    before, behind = _collectives(b, plan, a, b.fractions[r])
    mb = f" mb{r}" if b.tagged else ""
    groups: dict[Rep, list[tuple[Rep, int]]] = {}  # the first data rank of each ring -> its built members
    for rep, gpu in reps:
        groups.setdefault((rep[0] - rep[0] % cp, rep[1]), []).append((rep, gpu))

    def parallel():
        return (ranks.cp_group(d, t, p) for d in range(0, ranks.data, cp) for t in range(ranks.tp))

    def run(kind: str, nbytes: int, what: str, deps: dict[Rep, list[int]], key: Rep, members) -> dict[int, int]:
        group = ranks.cp_group(key[0], key[1], p)
        done = comm.run(kind, group, nbytes, f"cp {what} {label}{mb} stage{s} dp{key[0] // cp} tp{key[1]}",
                        {gpu: deps[rep] for rep, gpu in members}, parallel=parallel, op_index=a.index,
                        microbatch=r, stage_index=s, group_kind="cp")
        if key == (0, 0):
            b.count("cp", kind, group, nbytes)
        return done

    out: dict[Rep, tuple[int, int]] = {}
    for key, members in groups.items():
        done = run(before[0], before[1], before[0].replace("_", "-"), after, key, members)
        work = {rep: b.graph.add_compute_tagged(gpu, dur, f"{label}{mb} gpu{gpu}", tags, [done[gpu]])
                for rep, gpu in members}
        ends = {rep: work[rep] for rep, _ in members}
        if behind[0] is not None:
            fin = run(behind[0], behind[1], behind[0].replace("_", "-"), {rep: [w] for rep, w in work.items()},
                      key, members)
            ends = {rep: fin[gpu] for rep, gpu in members}
        out.update({rep: (work[rep], ends[rep]) for rep, _ in members})
    return out


__all__ = ["add_attention", "exchange_bytes", "exchange_sent", "transient_bytes"]
