"""Memory plans of the composition's GPUs (:mod:`triosim.graph.composition`): each built GPU's
program in run order with buffers keyed per micro-batch (as case 4), sized per GPU (TP shards,
ZeRO shards, the micro-batch's share, the context-parallel share), ZeRO-3's gathered copies added
where they live, the buffers a context-parallel attention's exchange holds while it runs
(:func:`triosim.graph.context.ring.transient_bytes`), and at the optimizer's steps the fp32 copy
of 16-bit gradients the step makes. GPUs of one stage run the same program, so
one plan serves them all when it needs no memcpy; when every buffer a stage touches fits at
once (beside the most the exchanges, the gradient copy and ZeRO-3's gathered copies hold at one
step), the plan is the buffers' lifetimes, computed vectorised."""

from __future__ import annotations

import copy
from dataclasses import replace
from operator import itemgetter

import numpy as np

from ...trace import Trace
from ..composition_state import CompositionState
from ..context.ring import transient_bytes
from ..data.zero import alive_bytes
from ..expert.dispatch import exchange_buffer_bytes
from ..pipeline.stages import optimizer_buffers
from ..single import persistent_buffers
from .plan import MemoryReport, Step, plan_replicas
from .stage import stage_occupancy


def _plan_memory(b: CompositionState) -> list[MemoryReport]:
    """Each built GPU's program in run order, buffers keyed per micro-batch (as case 4); GPUs of
    one stage run the same program, so one plan serves them all when it needs no memcpy."""
    trace = b.trace
    persistent = persistent_buffers(trace)
    pre = trace.preallocated
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
        where = b.step_label(s)
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
            held = _exchange_bytes(b, i, r) if r is not None else _gradient_copy_bytes(b, s)
            if held:  # an exchange's buffers (or the fp32 gradient copy), allocated here and freed after
                key = f"{b.prefixes[r]}cp-exchange:{i}" if r is not None else f"gradient-copy:{i}"
                writes = (*writes, key)
                sizes[key] = held
                touched[key] = False
            label = labels.get(i)
            if label is None:
                op = trace.ops[i]
                label = labels[i] = f"{trace.op_label(op)}{where}"
            program.append((reads, writes, label))
        if b.gathered_sizes:
            b.gathered_at[s] = _gathered_alive(b, s, b.seq[gpus[0]])
        delivered = _delivered(b, received.get(s, []))
        # Read first, or allocated before the iteration (a training precision's gradient buffer).
        external = [k for k, is_read in touched.items() if (is_read or k in pre) and k not in delivered]

        def steps(gpu: int, program=program) -> list[Step]:
            return [Step(task=task, reads=rd, writes=wr, label=lb)
                    for (task, _, _), (rd, wr, lb) in zip(_op_steps(b, gpu), program)]

        reports += plan_replicas(b.graph, b.platform, gpus, steps, sizes, external=external,
                                 persistent=[k for k in touched if k in persistent],
                                 placement=b.strategy.initial_placement)
    return reports


def peaks_under_zero(b: CompositionState, zero: int) -> dict[int, int]:
    """Each built GPU's memory peak had ``b``'s strategy been at ZeRO stage ``zero``, one that
    shards more than its own among 1 and 2: ZeRO-2 shards the gradient buffers as well as the
    optimizer state of ZeRO-1, and nothing else (the same reduce-scatter, the same gathers, the
    same tasks), so its memory plan is the only thing that differs. It holds less at every
    step: where ``b``'s plan needed no memcpy, neither does this one, and the graph is left as
    it is."""
    if not (1 <= b.strategy.zero < zero <= 2):
        raise ValueError(f"peaks_under_zero: ZeRO-{zero} from ZeRO-{b.strategy.zero} changes more than memory")
    twin = copy.copy(b)
    twin.strategy = replace(b.strategy, zero=zero)
    twin.size_cache, twin.gradient_copy = {}, {}  # sizes under the other stage's shards
    return {r.device: r.peak_bytes for r in _plan_memory(twin)}


def _op_steps(b: CompositionState, gpu: int) -> list[tuple[int, int, int | None]]:
    """``gpu``'s program one op at a time: (task, op, micro-batch or None)."""
    return [(task, i, r) for task, ops, r in b.seq[gpu] for i in ops]


def _stage_memory_fits(b: CompositionState, s: int, persistent: set[str], received: list[str]) -> list[MemoryReport] | None:
    """Stage ``s``'s memory reports when every buffer it touches fits at once (the plan is then
    each buffer's lifetime, computed vectorised); ``None`` otherwise."""
    trace = b.trace
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
    copy = _gradient_copy_bytes(b, s)
    exchanges = getattr(b, "experts", None) is not None or getattr(b, "context", None) is not None
    ops_in = np.fromiter(map(len, map(itemgetter(1), runs)), dtype=np.int64, count=len(runs))  # ops per task
    held = None  # per op step, bytes held beside the buffers (None: nothing)
    if exchanges:
        held = np.fromiter((_exchange_bytes(b, i, r) if r is not None else copy for _, ops, r in runs for i in ops),
                           dtype=np.int64)
    elif copy:  # only the optimizer steps' gradient copy: per run, not per op (millions at 1T)
        per_run = np.fromiter((copy if r is None else 0 for _, _, r in runs), dtype=np.int64, count=len(runs))
        held = np.repeat(per_run, ops_in)
    if b.gathered_sizes:  # ZeRO-3's gathered copies, each whole from its gather to its last use
        alive = b.gathered_at[s] = _gathered_alive(b, s, runs)
        gathered = np.array(alive, dtype=np.int64)
        held = gathered if held is None else held + gathered
    top = int(held.max()) if held is not None and len(held) else 0
    got = stage_occupancy(runs, template, size_of, b.fractions, nb, delivered, b.persistent_ids,
                          b.platform.capacity_bytes - top, resident={ids[k] for k in trace.preallocated if k in ids})
    if got is None:
        return None
    occ, _total = got
    if top:  # context parallelism: the exchange's buffers while its attention op runs
        occ = occ + held
    peak = int(occ.max()) if len(occ) else 0
    if b.gathered_sizes:  # one counter value per op step, as the step-by-step plan of ZeRO-3 gives them
        return [MemoryReport(device=g, peak_bytes=peak, step_tasks=tuple(task for task, ops, _ in b.seq[g] for _ in ops),
                             step_bytes=occ) for g in gpus]
    # One counter value per task: the most its ops hold (a task of one op: that op's).
    starts = np.concatenate(([0], np.cumsum(ops_in)[:-1])).astype(np.int64)
    step_bytes = np.maximum.reduceat(occ, starts) if len(occ) else occ
    # each GPU's step tasks written out only if the timeline reads them (graph.step_lists)
    return [MemoryReport(device=g, peak_bytes=peak, step_tasks=b.seq.tasks(g), step_bytes=step_bytes) for g in gpus]


def _gathered_alive(b: CompositionState, s: int, runs) -> list[int]:
    """Bytes of ZeRO-3's gathered copies alive at each op step of stage ``s``'s program
    (``runs``: its (task, ops, micro-batch) in order), as the step-by-step plan counts them."""
    get, sizes = b.gathered.get, b.gathered_sizes
    span: dict[str, list[int]] = {}  # key -> its first and last step (as zero.bytes_per_step's)
    j = 0
    for _, ops, r in runs:
        if r is not None:
            for i in ops:
                extra = get((s, i, r))
                if extra is not None:
                    for k in (*extra[0], *extra[1]):
                        if k in sizes:
                            span.setdefault(k, [j, j])[1] = j
                j += 1
        else:
            j += len(ops)
    return alive_bytes(span, sizes, j)


def _exchange_bytes(b: CompositionState, i: int, r: int | None) -> int:
    """Bytes op ``i``'s context-parallel exchange (or expert-parallel token exchange) holds in
    micro-batch ``r`` (0 for other ops)."""
    experts = getattr(b, "experts", None)
    if experts is not None and r is not None and i in experts.ops:
        return exchange_buffer_bytes(b, experts, experts.ops[i], b.fractions[r])
    context = getattr(b, "context", None)
    if context is None or r is None or i not in context.ops:
        return 0
    return transient_bytes(b, context, context.ops[i], b.fractions[r])


def _gradient_copy_bytes(b: CompositionState, s: int) -> int:
    """Bytes of the fp32 copy of stage ``s``'s 16-bit gradients (its optimizer share) that the
    optimizer step makes and holds through the step (:attr:`~triosim.trace.precision.
    TrainingPrecision.gradient_copy_bytes`): the trace's share of the stage's optimizer state."""
    num, den = b.trace.gradient_copy
    if not num:
        return 0
    got = b.gradient_copy.get(s)
    if got is None:
        state: dict[str, int] = {}
        for i in {i for _, ops, r in b.seq[b.gpus(s)[0]] if r is None for i in ops}:
            for k, buf, frac in _step_keys(b, s, i, None)[2]:
                if b.roles.role(buf) == "optimizer":
                    state[k] = b.size(buf, frac)
        got = b.gradient_copy[s] = -(-sum(state.values()) * num // den)
    return got


def _step_keys(b: CompositionState, s: int, i: int, r: int | None):
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


def _optimizer_split(b: CompositionState, i: int) -> dict[int, tuple[tuple[str, ...], tuple[str, ...], tuple]]:
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


def _received(b: CompositionState) -> dict[int, list[str]]:
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


def _delivered(b: CompositionState, received: list[str]) -> set[str]:
    """Keys of the ``received`` buffers, every micro-batch's."""
    return {_key(b.trace, k, r) for k in received for r in range(len(b.fractions))}


def _key(trace: Trace, buffer: str, r: int) -> str:
    return buffer if buffer in trace.batch_invariant else f"mb{r}:{buffer}"


__all__ = ["_plan_memory", "peaks_under_zero"]  # _plan_memory: the name tests spy on
