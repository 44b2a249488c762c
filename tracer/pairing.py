"""Pairing execution-trace nodes with profiler operator events, by identity.

Both recordings see the same operator calls.  Since PyTorch 2.2 every profiler operator event
carries ``Record function id``, the very id the execution trace stores as ``rf_id``, so pairing is
a dictionary lookup (checked by name).  PyTorch 2.1 files lack it; there the two streams are
aligned thread by thread on their identity fields: each thread's calls are put in call-start
order (ET by ``rf_id``, the profiler by its per-thread ``External id`` counter, else by start
time), and a call is paired only when the names agree and the sequence numbers (where both have
one) agree, resyncing over calls that only one side recorded.  ET threads are mapped to profiler
threads so that the most calls pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from .etrace import PROCESS_NODE, THREAD_NODE, ExecutionTrace, Node
from .kineto import OpEvent, ProfilerTrace

RESYNC_WINDOW = 64


@dataclass
class Pairing:
    """ET node id -> profiler event, and how the pairing was made."""

    by_node: dict[int, OpEvent]
    method: str  # "record-function-id" or "aligned"
    unpaired_nodes: int
    unpaired_events: int


def _compatible(node: Node, ev: OpEvent) -> bool:
    if node.name != ev.name:
        return False
    if node.seq_id >= 0 and ev.seq is not None and ev.seq >= 0 and node.seq_id != ev.seq:
        return False
    return True


def _pair_by_rf_id(nodes: list[Node], prof: ProfilerTrace) -> dict[int, OpEvent]:
    by_rf: dict[int, OpEvent] = {}
    for ev in prof.ops:
        if ev.rf_id is not None:
            by_rf.setdefault(ev.rf_id, ev)
    out: dict[int, OpEvent] = {}
    for n in nodes:
        ev = by_rf.get(n.rf_id)
        if ev is not None and ev.name == n.name:
            out[n.id] = ev
    return out


def _align(nodes: list[Node], events: list[OpEvent]) -> list[tuple[Node, OpEvent]]:
    """Walk both call-ordered streams, pairing compatible calls and resyncing over gaps."""
    pairs: list[tuple[Node, OpEvent]] = []
    i = j = 0
    while i < len(nodes) and j < len(events):
        if _compatible(nodes[i], events[j]):
            pairs.append((nodes[i], events[j]))
            i += 1
            j += 1
            continue
        for k in range(1, RESYNC_WINDOW + 1):
            if j + k < len(events) and _compatible(nodes[i], events[j + k]):
                j += k
                break
            if i + k < len(nodes) and _compatible(nodes[i + k], events[j]):
                i += k
                break
        else:
            i += 1
            j += 1
    return pairs


def _pair_aligned(nodes: list[Node], prof: ProfilerTrace) -> dict[int, OpEvent]:
    """Per-thread alignment; the thread mapping is the one that pairs the most calls."""
    by_counter = bool(prof.ops) and all(e.external_id is not None for e in prof.ops)
    et_threads: dict[int, list[Node]] = {}
    for n in nodes:
        et_threads.setdefault(n.tid, []).append(n)
    prof_threads: dict[str, list[OpEvent]] = {}
    for e in prof.ops:
        prof_threads.setdefault(str(e.tid), []).append(e)
    for evs in prof_threads.values():
        if by_counter:  # the External id counter follows call order within a thread
            evs.sort(key=lambda e: (e.external_id, e.index))
        else:  # a parent starting in the same microsecond as its child goes first
            evs.sort(key=lambda e: (e.ts, -e.dur, e.index))
    candidates = []
    for et_tid, ns in sorted(et_threads.items()):
        for p_tid, evs in sorted(prof_threads.items()):
            pairs = _align(ns, evs)
            if pairs:
                candidates.append((-len(pairs), et_tid, p_tid, pairs))
    candidates.sort(key=lambda c: (c[0], c[1], c[2]))
    used_et: set[int] = set()
    used_prof: set[str] = set()
    out: dict[int, OpEvent] = {}
    for _, et_tid, p_tid, pairs in candidates:
        if et_tid in used_et or p_tid in used_prof:
            continue
        used_et.add(et_tid)
        used_prof.add(p_tid)
        out.update((n.id, ev) for n, ev in pairs)
    return out


def pair_events(et: ExecutionTrace, prof: ProfilerTrace) -> Pairing:
    """Pair every ET operator node with its profiler event where one exists."""
    nodes = sorted((n for n in et.nodes.values() if n.name not in (THREAD_NODE, PROCESS_NODE)),
                   key=lambda n: (n.rf_id, n.id))
    by_node: dict[int, OpEvent] = {}
    method = "aligned"
    if prof.has_record_function_ids:
        by_node = _pair_by_rf_id(nodes, prof)
        method = "record-function-id"
        if len(by_node) < len(nodes) // 2:  # ids from another run: fall back to alignment
            by_node, method = {}, "aligned"
    if method == "aligned":
        by_node = _pair_aligned(nodes, prof)
    return Pairing(by_node=by_node, method=method, unpaired_nodes=len(nodes) - len(by_node),
                   unpaired_events=len(prof.ops) - len(by_node))
