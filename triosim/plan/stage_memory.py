"""A candidate's peak memory per GPU from the buffer lifetimes the DAG's memory plan uses.

The DAG plans each GPU's memory over its program (:mod:`triosim.graph.memory`): when everything
fits, a buffer is resident from its first use (from the start when it exists before the program:
read first and not sent by another stage, or preallocated) to its last use (to the end for
parameters, optimizer state and what the optimizer touches); a micro-batch's buffers are keys of
their own. This module takes the same view one pipeline block at a time (one stage's forward or
backward ops for one micro-batch, on the trace the simulation runs: scaled, sized for the
training precision, with its recomputation re-runs and tensor-parallel shards):

- per stage and micro-batch, the most its own buffers hold during its forward block
  (``f_peak``), what they hold from the end of the forward block to the backward block
  (``kept``: what backward reads — with recomputation only what the re-runs read), the most
  during the backward block (``b_peak``, the kept bytes included) and the trace inputs it reads
  (resident from the start, as the plan keeps every micro-batch's);
- per stage, the batch-invariant buffers it touches (weights, gradients, casts and FP8 copies)
  by role and by the blocks they live between (from the start or from the stage's first forward
  or backward block, to the end or to its last forward or backward block);

and walks each pipeline rank's blocks in the schedule's order (:func:`triosim.graph.pipeline.
schedules.schedule_blocks`): at a block the rank holds its invariant buffers alive then, the
kept bytes of every micro-batch in flight, and the block's own peak. The largest over blocks is
the rank's peak, ZeRO's shards applied by role (:func:`triosim.graph.data.zero.zero_divisor`'s
rule), the optimizer state as the estimator spreads it over the stages' parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..graph.pipeline.schedules import BACKWARD, FORWARD, OPTIMIZER, schedule_blocks

# Where an invariant buffer's life starts and ends within a rank's program.
START, FIRST_F, FIRST_B = 0, 1, 2
END, LAST_F, LAST_B = 0, 1, 2
ROLES = ("weights", "gradients", "optimizer", None)


@dataclass(frozen=True)
class StageMemory:
    """One stage's buffers (bytes on one GPU of its TP group)."""

    f_peak: float  # most one micro-batch's own buffers hold during its forward block
    kept: float  # held from the end of its forward block until its backward block
    b_peak: float  # most during its backward block (the kept bytes included)
    inputs: float  # trace inputs it reads, per micro-batch (resident from the start)
    invariant: dict[tuple[int, int, int], float]  # (role index, start, end) -> bytes
    f_peak_zero3: float = 0.0  # f_peak and b_peak with ZeRO-3's gathered copies
    b_peak_zero3: float = 0.0
    # Step by step, for the chunk's first forward and backward blocks (where its invariant
    # buffers come to life one op after another): the micro-batch's bytes (without, with ZeRO-3's
    # gathered copies) and, per role (rows), the invariant bytes allocated so far.
    f_steps: np.ndarray | None = None
    b_steps: np.ndarray | None = None
    f_steps3: np.ndarray | None = None
    b_steps3: np.ndarray | None = None
    f_new: np.ndarray | None = None
    b_new: np.ndarray | None = None


@dataclass(frozen=True)
class _Touches:
    """Every buffer use of the forward and backward ops of one (batch, tp, sp) key."""

    pos: np.ndarray  # the position of each use's op; uses in program order: forward ops, then
    op: np.ndarray  # backward ops, each in trace order, reads before writes within an op
    backward: np.ndarray  # a backward op's use
    buf: np.ndarray  # buffer id
    read: np.ndarray  # a read (else a write)
    full: np.ndarray  # per buffer id: bytes of the scaled trace
    div: np.ndarray  # per buffer id: its TP shard divisor
    keyed: np.ndarray  # per buffer id: per micro-batch (not batch-invariant)
    made: np.ndarray  # per buffer id: some op writes it (a trace input otherwise)
    lasting: np.ndarray  # per buffer id: alive to the end once touched (persistent, or the optimizer uses it)
    early: np.ndarray  # per buffer id: allocated before the program (preallocated)
    role: np.ndarray  # per buffer id: index into ROLES
    grad_op: np.ndarray | None = None  # per buffer id: the backward op making its gradient (-1: none)
    names: tuple[str, ...] = ()  # the buffers by id; with the op count, what another key's reuse checks
    ops: int = 0


def touches(trace, phase, pos, plan, roles, persistent: set[str], like: _Touches | None = None) -> _Touches:
    """The buffer uses the stage profiles are cut from (one pass over the trace); ``like``: those
    of the same profile at another key (batch, tp, sp), whose uses are these when the trace has
    the same buffers and ops (a copy scaled to another batch): only the bytes and the TP shards
    are found again."""
    names = list(trace.tensors)
    if like is not None and len(trace.ops) == like.ops and tuple(names) == like.names:
        shard = plan.shard_divisor
        return replace(like, full=np.array([float(trace.tensors[k].bytes) for k in names]),
                       div=np.array([float(shard.get(k, 1)) for k in names]))
    ids = {k: n for n, k in enumerate(names)}
    op, buf, read = [], [], []
    by_optimizer: set[str] = set()
    for i, ph in enumerate(phase):
        if ph == OPTIMIZER:
            by_optimizer.update(trace.reads[i])
            by_optimizer.update(trace.writes[i])
            continue
        if i not in pos or ph not in (FORWARD, BACKWARD):
            continue
        for k in trace.reads[i]:
            op.append(i)
            buf.append(ids[k])
            read.append(True)
        for k in trace.writes[i]:
            op.append(i)
            buf.append(ids[k])
            read.append(False)
    inv = trace.batch_invariant
    shard = plan.shard_divisor
    role_index = {r: n for n, r in enumerate(ROLES)}
    at = np.array([pos[i] for i in op], dtype=np.intp)
    backward = np.array([phase[i] == BACKWARD for i in op], dtype=bool)
    order = np.argsort(backward, kind="stable")
    return _Touches(
        at[order], np.array(op, dtype=np.intp)[order], backward[order], np.array(buf, dtype=np.intp)[order],
        np.array(read, dtype=bool)[order],
        np.array([float(trace.tensors[k].bytes) for k in names]),
        np.array([float(shard.get(k, 1)) for k in names]),
        np.array([k not in inv for k in names], dtype=bool),
        np.array([k in trace.producer for k in names], dtype=bool),
        np.array([k in persistent or k in by_optimizer for k in names], dtype=bool),
        np.array([k in trace.preallocated for k in names], dtype=bool),
        np.array([role_index[roles.role(k)] for k in names], dtype=np.intp),
        np.array([trace.grad_ready_op.get(k, -1) for k in names], dtype=np.intp),
        tuple(names), len(trace.ops),
    )


def _gathered_steps(stage: np.ndarray, step: np.ndarray, buf: np.ndarray, size_of: np.ndarray,
                    n: int, unit_bytes: float) -> np.ndarray:
    """Per step, ZeRO-3's gathered copies resident (:func:`triosim.graph.data.zero.fsdp_units` and
    ``gathered_copies``): per stage and pass, its weights in the order the pass first reads them
    (weights first read by one op kept together) cut into units closed at ``unit_bytes``; unit k
    is allocated at the first op of unit k − 1 (one unit of prefetch; unit 0 at its own) and
    freed after the last op of the pass that reads one of its weights. ``stage``, ``step``,
    ``buf``: one pass's uses of weights, in program order; ``size_of``: per buffer, its bytes."""
    occ = np.zeros(n + 1)
    if not len(buf):
        return occ[:n]
    key = stage * len(size_of) + buf
    uniq, first_at = np.unique(key, return_index=True)
    last_at = np.zeros(len(uniq), dtype=np.intp)
    _, inverse = np.unique(key, return_inverse=True)
    np.maximum.at(last_at, inverse, np.arange(len(key)))
    w_stage, w_buf = uniq // len(size_of), uniq % len(size_of)
    first, last = step[first_at], step[last_at]
    # weights first read by one op go together: one group per (stage, first step)
    order = np.lexsort((first, w_stage))
    g_key = w_stage[order] * (n + 1) + first[order]
    starts = np.flatnonzero(np.concatenate(([True], g_key[1:] != g_key[:-1])))
    g_stage = w_stage[order][starts].tolist()
    g_lo = first[order][starts].tolist()
    g_hi = np.maximum.reduceat(last[order], starts).tolist()
    g_bytes = np.add.reduceat(size_of[w_buf[order]], starts).tolist()
    units: list[tuple[int, int, float]] = []  # (first step, last step, bytes), one stage after another
    cur = None
    for j, lo, hi, nbytes in zip(g_stage, g_lo, g_hi, g_bytes):
        if cur is not None and (cur[0] != j or cur[3] >= unit_bytes):
            units.append(cur)
            cur = None
        cur = [j, lo, hi, nbytes] if cur is None else [j, cur[1], max(cur[2], hi), cur[3] + nbytes]
    if cur is not None:
        units.append(cur)
    for k, (j, lo, hi, nbytes) in enumerate(units):
        start = units[k - 1][1] if k and units[k - 1][0] == j else lo
        occ[start] += nbytes
        occ[hi + 1] -= nbytes
    return np.cumsum(occ[:n])


def _with_gradient_producers(t: _Touches, w_stage: np.ndarray, w_step: np.ndarray, w_buf: np.ndarray,
                             stage: np.ndarray, op: np.ndarray, step: np.ndarray, backward: np.ndarray):
    """The backward pass's weight uses with each weight's gradient producer as one more use on
    the producer's stage (the weight read on that stage or not), in program order."""
    weights = np.flatnonzero((t.role == 0) & ~t.keyed & (t.grad_op >= 0))
    if not len(weights):
        return w_stage, w_step, w_buf
    b_op, first = np.unique(op[backward], return_index=True)
    at = np.searchsorted(b_op, t.grad_op[weights])
    ok = (at < len(b_op)) & (b_op[np.minimum(at, len(b_op) - 1)] == t.grad_op[weights])
    if not ok.any():
        return w_stage, w_step, w_buf
    where = np.flatnonzero(backward)[first[at[ok]]]
    all_stage = np.concatenate((w_stage, stage[where]))
    all_step = np.concatenate((w_step, step[where]))
    all_buf = np.concatenate((w_buf, weights[ok]))
    order = np.argsort(all_step, kind="stable")  # a producer after the reads of its own op
    return all_stage[order], all_step[order], all_buf[order]


@dataclass(frozen=True)
class StageLayout:
    """What :func:`stage_memories` finds of a cut that does not depend on the micro-batch's size:
    each stage's steps, each (stage, buffer)'s first and last step, the invariant buffers (their
    sizes do not change with the micro-batch) by role and block, and ZeRO-3's gathered copies
    step by step (per pass). Worked out once per (key, cut) and shared by every micro-batch size."""

    S: int
    n: int
    seen: np.ndarray
    stage_lo: np.ndarray
    f_end: np.ndarray
    stage_hi: np.ndarray
    used: np.ndarray  # per (stage, buffer) pair: the buffer
    st: np.ndarray  # and the stage
    f: np.ndarray  # first step
    lst: np.ndarray  # last step
    live: np.ndarray  # a micro-batch buffer made on the stage
    leaving: np.ndarray  # made in the forward block, read after it: kept until the backward
    inputs_mask: np.ndarray  # a trace input: resident from the start
    inv: tuple[dict[tuple[int, int, int], float], ...]  # per stage: (role, start, end) -> bytes
    f_new: tuple[np.ndarray | None, ...]  # per stage: invariant bytes allocated so far, by role
    b_new: tuple[np.ndarray | None, ...]
    gathered: tuple[np.ndarray, ...]  # ZeRO-3's gathered copies per step, one array per pass
    step_op: np.ndarray | None = None  # the op of each step


def stage_layout(t: _Touches, starts: list[int], unit_bytes: float = float("inf")) -> StageLayout:
    """The micro-batch-independent part of :func:`stage_memories` (``starts``: each stage's first
    forward position; ``unit_bytes``: ZeRO-3's unit size)."""
    S = len(starts)
    stage = np.searchsorted(np.asarray(starts), t.pos, side="right") - 1
    # each stage's program: its forward ops in trace order, then its backward ops (the uses are
    # in that order already: a stable sort by stage keeps it)
    order = np.argsort(stage, kind="stable")
    stage, op, buf, is_read, backward = stage[order], t.op[order], t.buf[order], t.read[order], t.backward[order]
    fresh = np.concatenate(([True], (op[1:] != op[:-1]) | (stage[1:] != stage[:-1])))
    step = np.cumsum(fresh) - 1  # steps numbered across stages; a stage's are contiguous
    stage_lo = np.zeros(S, dtype=np.intp)
    stage_hi = np.zeros(S, dtype=np.intp)  # one past each stage's last step
    f_end = np.zeros(S, dtype=np.intp)  # one past each stage's last forward step
    seen = np.zeros(S, dtype=bool)
    seen[stage] = True
    stage_lo[stage[::-1]] = step[::-1]
    np.maximum.at(stage_hi, stage, step + 1)
    f_end[:] = stage_lo
    np.maximum.at(f_end, stage[~backward], step[~backward] + 1)
    nb = len(t.full)
    key = stage * nb + buf  # a buffer's uses on one stage
    uniq, first_at, inverse = np.unique(key, return_index=True, return_inverse=True)
    last_at = np.zeros(len(uniq), dtype=np.intp)
    np.maximum.at(last_at, inverse, np.arange(len(key)))
    used = uniq % nb
    st = uniq // nb
    f, lst = step[first_at], step[last_at]
    first_read = is_read[first_at]
    keyed = t.keyed[used]
    inputs_mask = keyed & first_read & ~t.made[used]  # a trace input: resident from the start
    live = keyed & ~inputs_mask
    n = int(step[-1]) + 1 if len(step) else 0
    in_f = f < f_end[st]
    # the invariant buffers (sized as the batch's: the micro-batch does not change them) by
    # (stage, role, from which block, to which block)
    size = -np.floor_divide(-t.full[used], t.div[used])
    k = np.flatnonzero(~keyed & (size > 0))
    u = used[k]
    external = (first_read[k] & ~t.made[u]) | t.early[u]
    start = np.where(external, START, np.where(in_f[k], FIRST_F, FIRST_B))
    end = np.where(t.lasting[u], END, np.where(lst[k] < f_end[st[k]], LAST_F, LAST_B))
    # ZeRO-3: each pass's gathered copies beside the micro-batch's buffers
    gathered: list[np.ndarray] = []
    if np.isfinite(unit_bytes):
        w_size = np.zeros(nb)
        w_size[used[k]] = size[k]
        is_w = (t.role[buf] == 0) & ~t.keyed[buf]
        m = is_w & ~backward
        gathered.append(_gathered_steps(stage[m], step[m], buf[m], w_size, n, unit_bytes))
        m = is_w & backward
        w_stage, w_step, w_buf = stage[m], step[m], buf[m]
        if t.grad_op is not None:  # a gradient's producer needs its weight whole too (as the DAG's units)
            w_stage, w_step, w_buf = _with_gradient_producers(t, w_stage, w_step, w_buf, stage, op, step, backward)
        gathered.append(_gathered_steps(w_stage, w_step, w_buf, w_size, n, unit_bytes))
    cells = np.zeros((S, len(ROLES), 3, 3))
    np.add.at(cells, (st[k], t.role[u], start, end), size[k])
    fresh_inv = start != START  # allocated by an op of the stage's first forward or backward block
    alloc = np.zeros((len(ROLES), n))
    np.add.at(alloc, (t.role[u[fresh_inv]], f[k[fresh_inv]]), size[k[fresh_inv]])
    inv, f_new, b_new = [], [], []
    for j in range(S):
        lo, mid, hi = int(stage_lo[j]), int(f_end[j]), int(stage_hi[j])
        inv.append({(int(r), int(s0), int(e)): float(cells[j, r, s0, e]) for r, s0, e in zip(*np.nonzero(cells[j]))})
        f_new.append(np.cumsum(alloc[:, lo:mid], axis=1) if seen[j] else None)
        b_new.append(np.cumsum(alloc[:, mid:hi], axis=1) if seen[j] else None)
    return StageLayout(S, n, seen, stage_lo, f_end, stage_hi, used, st, f, lst, live,
                       live & in_f & (lst >= f_end[st]), inputs_mask, tuple(inv), tuple(f_new), tuple(b_new),
                       tuple(gathered), op[fresh])


def stage_memories(t: _Touches, starts: list[int], fraction: float, unit_bytes: float = float("inf"),
                   layout: StageLayout | None = None, held: dict[int, float] | None = None) -> list[StageMemory]:
    """The buffers of each stage (``starts``: each stage's first forward position) for a
    micro-batch of ``fraction`` of the batch (module docstring), all stages in one pass;
    ``unit_bytes``: ZeRO-3's unit size; ``layout``: :func:`stage_layout` of the same cut, if at
    hand; ``held``: per op, bytes held beside its buffers while it runs (a context-parallel
    attention's exchange buffers, as the DAG's memory plan adds them to the op's step)."""
    g = stage_layout(t, starts, unit_bytes) if layout is None else layout
    S, n, used, st = g.S, g.n, g.used, g.st
    # per-GPU bytes as CompositionState.size: the micro-batch's share rounded, then the TP shard
    keyed = t.keyed[used]
    whole = np.where(keyed, np.round(t.full[used] * fraction), t.full[used])
    size = -np.floor_divide(-whole, t.div[used])
    live = g.live
    delta = np.zeros(n + 1)
    np.add.at(delta, g.f[live], size[live])
    np.add.at(delta, g.lst[live] + 1, -size[live])
    occ = np.cumsum(delta[:n])
    if held:
        occ += np.array([held.get(i, 0.0) for i in g.step_op.tolist()])
    kept = np.bincount(st[g.leaving], weights=size[g.leaving], minlength=S)
    inputs = np.bincount(st[g.inputs_mask], weights=size[g.inputs_mask], minlength=S)
    occ3 = occ.copy()
    for copies in g.gathered:
        occ3 += copies
    out = []
    for j in range(S):
        if not g.seen[j]:
            out.append(StageMemory(0.0, 0.0, 0.0, 0.0, {}))
            continue
        lo, mid, hi = int(g.stage_lo[j]), int(g.f_end[j]), int(g.stage_hi[j])
        out.append(StageMemory(float(occ[lo:mid].max()) if mid > lo else 0.0, float(kept[j]),
                               float(occ[mid:hi].max()) if hi > mid else 0.0, float(inputs[j]), dict(g.inv[j]),
                               float(occ3[lo:mid].max()) if mid > lo else 0.0,
                               float(occ3[mid:hi].max()) if hi > mid else 0.0,
                               occ[lo:mid], occ[mid:hi], occ3[lo:mid], occ3[mid:hi], g.f_new[j], g.b_new[j]))
    return out


@dataclass(frozen=True)
class RankBlocks:
    """A pipeline rank's blocks in program order: per block its phase (0 forward, 1 backward)
    and chunk (virtual stage); per chunk the index of its first and last forward and backward
    block."""

    backward: np.ndarray
    chunk: np.ndarray
    first_f: np.ndarray
    first_b: np.ndarray
    last_f: np.ndarray
    last_b: np.ndarray


def rank_blocks(schedule: str, ranks: int, micro: int, rank: int, virtual: int) -> RankBlocks:
    blocks = schedule_blocks(schedule, ranks, micro, rank, virtual)
    backward = np.array([ph == BACKWARD for ph, _, _ in blocks], dtype=bool)
    chunk = np.array([v for _, _, v in blocks], dtype=np.intp)
    k = np.arange(len(blocks))
    ends = []
    for mask in (~backward, backward):
        ends.append([int(k[mask & (chunk == v)].min()) for v in range(virtual)])
        ends.append([int(k[mask & (chunk == v)].max()) for v in range(virtual)])
    return RankBlocks(backward, chunk, *(np.array(e, dtype=np.intp) for e in (ends[0], ends[2], ends[1], ends[3])))


def rank_activations(blocks: RankBlocks, stages: list[StageMemory]) -> np.ndarray:
    """Per block, the micro-batch buffers the rank holds at the block's peak: the kept bytes of
    every chunk in flight before it, and the block's own peak (``stages``: the rank's chunks)."""
    kept = np.array([s.kept for s in stages])[blocks.chunk]
    f_peak = np.array([s.f_peak for s in stages])[blocks.chunk]
    b_peak = np.array([s.b_peak for s in stages])[blocks.chunk]
    delta = np.where(blocks.backward, -kept, kept)
    before = np.cumsum(delta) - delta
    return before + np.where(blocks.backward, b_peak - kept, f_peak)


def rank_invariant(blocks: RankBlocks, stages: list[StageMemory]) -> np.ndarray:
    """Per role (rows: ROLES) and block, the invariant bytes alive (columns: the blocks)."""
    n = len(blocks.backward)
    delta = np.zeros((len(ROLES), n + 1))
    for v, s in enumerate(stages):
        for (role, start, end), nbytes in s.invariant.items():
            lo = 0 if start == START else int((blocks.first_f if start == FIRST_F else blocks.first_b)[v])
            hi = n - 1 if end == END else int((blocks.last_f if end == LAST_F else blocks.last_b)[v])
            delta[role, lo] += nbytes
            delta[role, hi + 1] -= nbytes
    return np.cumsum(delta[:, :n], axis=1)


def first_block_corrections(s: StageMemory, div: np.ndarray, zero3: bool) -> tuple[float, float]:
    """(forward, backward): what a chunk's first forward (backward) block holds at its fullest
    less what :func:`rank_activations` and :func:`rank_invariant` count there (the block's peak
    plus every invariant buffer the block allocates, as if all from its first op). ``div``: per
    role, its ZeRO divisor."""
    out = []
    for steps, new, peak in ((s.f_steps3 if zero3 else s.f_steps, s.f_new, s.f_peak_zero3 if zero3 else s.f_peak),
                             (s.b_steps3 if zero3 else s.b_steps, s.b_new, s.b_peak_zero3 if zero3 else s.b_peak)):
        if steps is None or not len(steps):
            out.append(0.0)
            continue
        grown = (new / div[:, None]).sum(axis=0)
        out.append(float((steps + grown).max()) - peak - float(grown[-1]))
    return out[0], out[1]


def gpu_bytes(full: np.ndarray, invariant: np.ndarray, div: np.ndarray, frac: float) -> np.ndarray:
    """One GPU's bytes per buffer in a micro-batch of ``frac``, as CompositionState.size."""
    b = np.where(invariant, full, np.round(full * frac))
    return -np.floor_divide(-b, div)


def role_divisors(zero: int, dp: int) -> np.ndarray:
    """Per role of ROLES, how many DP ranks share it at ZeRO stage ``zero`` (the rule of
    :func:`triosim.graph.data.zero.zero_divisor`)."""
    if dp <= 1 or zero <= 0:
        return np.ones(len(ROLES))
    return np.array([dp if zero >= 3 else 1, dp if zero >= 2 else 1, dp, 1], dtype=float)


__all__ = ["ROLES", "RankBlocks", "StageLayout", "StageMemory", "first_block_corrections", "gpu_bytes", "rank_activations", "rank_blocks", "rank_invariant",
           "role_divisors", "stage_layout", "stage_memories", "touches"]
