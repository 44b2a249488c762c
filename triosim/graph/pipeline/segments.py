"""Where a pipeline rank's block of ops is cut into segments: runs of ops its GPU runs back to
back, between the points where something outside the GPU's stream enters or leaves (a TP
collective after an op, an op reading its result, a buffer crossing stages, a DDP bucket's last
gradient, a ZeRO-3 unit's gather, a recomputation run, an exchange, a host copy). Each segment
becomes one task of the ops' summed time, with the start and end they would have."""

from __future__ import annotations

from ..composition_state import CompositionState
from ..data import gradient_sync


def segment_cuts(b: CompositionState, s: int, params: list[str], waits_here, colls,
                  units) -> tuple[set[int], set[int], set[int]]:
    """Ops of stage ``s`` that something outside its GPU's stream waits for (cut after them) or
    that wait for something outside it (cut before them): TP collectives and what reads their
    result, buffers crossing stages, DDP buckets, ZeRO-3 unit gathers. Between two cuts a GPU runs
    its ops back to back, so one task of their summed time starts and ends when they would.
    Third: the ops whose task is looked up once the rank's program is built (a crossing buffer's
    writer and readers, a bucket's last gradient); the others only while their block is built."""
    before = {i for i, w in waits_here.items() if w}
    after = {i for i in colls if b.plan.stage[i] == s}
    writers, readers = crossing_ops(b).get(s, ((), ()))
    after.update(writers)
    before.update(readers)
    later = {*writers, *readers}
    if gradient_sync.overlapped(b):  # else every bucket waits for the rank's last task
        ready = [bk.ready_op for bk in gradient_sync.sync_buckets(b, params, s)]
        after.update(ready)
        later.update(ready)
    if units is not None:
        for phase_units in units.values():
            before.update(u.first_op for u in phase_units)
    # A run of re-runs (activation recomputation) is a task of its own, so that the time
    # breakdown tells recomputation from the backward ops it precedes.
    reruns = getattr(b, "reruns", frozenset())
    before.update(i for i in reruns if i - 1 not in reruns)
    before.update(i + 1 for i in reruns if i + 1 not in reruns)
    context = getattr(b, "context", None)
    if context is not None:  # an attention op runs with its exchange (graph/context/ring.py): a task of its own
        before.update(context.ops)
        after.update(context.ops)
    experts = getattr(b, "experts", None)
    if experts is not None:  # so is a grouped GEMM with its token exchange (graph/expert/dispatch.py)
        before.update(experts.ops)
        after.update(experts.ops)
        after.update(e.source for e in experts.ops.values() if e.source is not None)  # a dispatch may start there
    host = getattr(b, "host_copies", None)
    if host:  # activation offload: each copy a task of its own, the ops it starts after or holds back cut
        before.update(host)
        after.update(host)
        after.update(c.start_after for c in host.values() if c.start_after is not None)
        before.update(c.waiter for c in host.values() if c.waiter is not None)
    return before, after, later


def crossing_ops(b: CompositionState) -> dict[int, tuple[list[int], list[int]]]:
    """Per stage, the ops writing a buffer read on another stage and the ops reading one written
    on another stage (found once per build: every pipeline rank's cuts read them)."""
    if b.crossing_ops is None:
        stage = b.plan.stage
        out: dict[int, tuple[list[int], list[int]]] = {}
        for v in b.versions:
            src = stage[v.writer]
            readers = [c for c in v.readers if stage[c] != src]
            if not readers:
                continue
            out.setdefault(src, ([], []))[0].append(v.writer)
            for c in readers:
                out.setdefault(stage[c], ([], []))[1].append(c)
        b.crossing_ops = out
    return b.crossing_ops


def split_segments(block: list[int], cut_before: set[int], cut_after: set[int], fuse: bool) -> list[list[int]]:
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


__all__ = ["crossing_ops", "segment_cuts", "split_segments"]
