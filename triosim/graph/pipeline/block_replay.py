"""Repeated pipeline blocks added from a template instead of op by op.

A representative pipeline rank runs the same forward (or backward) block of a stage once per
micro-batch: the same segments, TP collectives (and context parallelism's ring exchanges,
ZeRO-3's unit gathers) and dependencies, only the task ids, the micro-batch in the labels and
attributes, and the task the block starts after differ (the 1T run adds 65,536 blocks of ~28
tasks); under ZeRO-3 also the GPU's previous gather, which the block's first one follows.
:class:`BlockReplay` watches the op-by-op build of a block
(:func:`triosim.graph.pipeline.rank_program.add_rank_program`), keeps what it added with those
three things taken out, and once two builds of a block (same stage, phase and micro-batch size)
left the same template, adds every later one by extending the graph's columns with the ids
offset (its labels and attributes spelled out only when first read:
:meth:`~triosim.schedule.tasks.TaskGraph.extend_templated`). Anything a template cannot express (a task that waits for one outside the block other
than the one it starts after, a label without its micro-batch, a collective recorded for the
first time) makes two builds differ, and the block stays built op by op: the graph, the
lookups the later steps read and the counters are the same either way (a replayed block's task
lookups are only those read once the program is built: a crossing buffer's writer and readers,
a bucket's last gradient; the others serve its own build).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice, repeat
from operator import add

from ...schedule.tasks import TaskGraph
from ..tp_done import TpDone

# Templates recorded per block pattern before giving up on it (two equal ones are needed).
MAX_RECORDINGS = 4
_PLAIN = (int, float, str, bool, type(None))


@dataclass
class Recording:
    """A block being built op by op: where it starts, for :meth:`BlockReplay.finish`."""

    key: tuple
    r: int
    entry: int  # the task the block starts after
    first: int  # its first task's id
    n_task_of: int
    n_tp_done: int
    n_seq: int
    rows: list[tuple[dict, int, int]]  # each collectives row and its (calls, bytes) before
    sizes: tuple[int, ...]  # graph and builder state that a block must not grow
    second: int = -1  # ZeRO-3: the GPU's last parameter gather before the block (-1: none)
    gathered: dict = field(default_factory=dict)  # the gathers' lookup before the block
    # TP and context-parallel tally steps, in order: (stats key, calls, payload bytes, wire bytes)
    tally: list[tuple[str, int, int, float]] = field(default_factory=list)


@dataclass
class Template:
    """What a block added, its micro-batch and ids taken out (ids relative to its first task)."""

    columns: tuple[list, ...]  # kind, duration, resources, devices, nbytes, latency, npred
    labels: list[tuple[str, str]]  # each label around " mb{r} "
    attrs: list[tuple[dict, tuple[str, str] | None]]  # attributes (their microbatch and collective label replaced)
    succ: list[list[int]]  # successors inside the block
    entry_succ: list[int]  # the tasks that start after the entry task
    task_of: list[tuple[tuple, int]]  # (d, t, op) -> task, in insertion order
    tp_done: list[tuple[int, int, int]]  # (op, gpu, task), in insertion order
    seq: list[tuple[int, tuple]]  # (task, ops) of the GPU's memory steps
    last: int
    first_compute: int | None
    rows: list[tuple[dict, int, int]]  # collectives rows' calls and bytes added
    tally: list[tuple[str, int, int, float]]
    sizes: tuple[int, ...]
    # ZeRO-3: whether the block's first gather follows the GPU's previous one (the second task it
    # starts after), the tasks that start after that one, and the gathers' lookup it sets
    has_second: bool = False
    second_succ: list[int] = field(default_factory=list)
    gathered_out: list[tuple[tuple, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # each task's one successor (0 where it has none or several: those are listed apart), so
        # a replay makes the lists in C (map, zip), not in a comprehension
        self.succ_one = [ks[0] if len(ks) == 1 else 0 for ks in self.succ]
        self.succ_other = [(k, ks) for k, ks in enumerate(self.succ) if len(ks) != 1]
        self.seq_at = [k for k, _ops in self.seq]
        self.seq_ops = [ops for _k, ops in self.seq]
        self.task_keys = [dto for dto, _k in self.task_of]
        self.task_at = [k for _dto, k in self.task_of]
        # per stats key: calls and payload (integers: any order) and the wire steps in order
        self.tallies = {kind: (sum(c for k, c, _p, _w in self.tally if k == kind),
                               sum(p for k, _c, p, _w in self.tally if k == kind),
                               [w for k, _c, _p, w in self.tally if k == kind])
                        for kind in dict.fromkeys(k for k, _c, _p, _w in self.tally)}
        self.tp_done_number = -1  # its number among the TpDone's templates, once adopted
        # each task's attributes without its micro-batch's values, one dict for every replayed block
        self.shared_attrs = [{k: v for k, v in a.items() if k != "microbatch" and k != "collective"} or None
                             for a, _coll in self.attrs]

    def same(self, other: Template) -> bool:
        """Whether two recordings left the same template (attribute values that are objects
        compared by identity: a replayed task must share them as a built one would)."""
        return (self.columns == other.columns and self.labels == other.labels and self.succ == other.succ
                and self.entry_succ == other.entry_succ and self.task_of == other.task_of
                and self.tp_done == other.tp_done and _seq_key(self.seq) == _seq_key(other.seq)
                and self.last == other.last and self.first_compute == other.first_compute
                and [(id(r), c, b) for r, c, b in self.rows] == [(id(r), c, b) for r, c, b in other.rows]
                and self.tally == other.tally and self.sizes == other.sizes
                and (self.has_second, self.second_succ, self.gathered_out)
                == (other.has_second, other.second_succ, other.gathered_out)
                and list(map(_attrs_key, self.attrs)) == list(map(_attrs_key, other.attrs)))


def _seq_key(seq: list[tuple[int, tuple]]) -> list[tuple[int, int]]:
    return [(k, id(ops)) for k, ops in seq]


def _attrs_key(entry: tuple[dict, tuple[str, str] | None]) -> tuple:
    attrs, coll = entry
    return (tuple((k, v if isinstance(v, _PLAIN) else ("id", id(v))) for k, v in attrs.items()
                  if k != "microbatch" and k != "collective"), tuple(attrs), coll)


def _into_block(succ: list[int], first: int) -> list[int]:
    """The successors an outside task got from the block starting at task ``first`` (the tail of
    its list), relative to ``first``."""
    cut = len(succ)
    while cut and succ[cut - 1] >= first:
        cut -= 1
    return [k - first for k in succ[cut:]]


def _split(text: str, mark: str) -> tuple[str, str] | None:
    head, sep, tail = text.partition(mark)
    if not sep or mark in tail:
        return None
    return head, tail


class BlockReplay:
    """Templates of one pipeline rank's blocks on its one built GPU (see the module docstring)."""

    def __init__(self, graph: TaskGraph, rows: dict, task_of: dict, tp_done: TpDone, seq: list, gpu: int,
                 rep: tuple[int, int], stats: dict, state: tuple, kept_ops: frozenset[int] | None = None,
                 gathered: dict | None = None) -> None:
        self.graph = graph
        self.rows = rows  # GroupComm's rows (id(charge) -> (charge, row)), counted per call
        self.task_of = task_of
        self.tp_done = tp_done
        self.seq = seq
        self.gpu = gpu
        self.rep = rep
        self.stats = stats
        self.state = state  # builder dicts that must not grow in a replayable block
        # ops whose task is looked up after the program is built (None: every op recorded): a
        # replayed block records only theirs (the 1T run's 1.3 M other keys were never read)
        self.kept_ops = kept_ops
        # ZeRO-3's gathers: rep -> the GPU's latest, (*rep, "unit", k) -> unit k's (read and set)
        self.gathered = gathered if gathered is not None else {}
        self.templates: dict[tuple, Template] = {}
        self.candidates: dict[tuple, Template] = {}
        self.recorded: dict[tuple, int] = {}
        self.replayed = 0

    def _sizes(self) -> tuple[int, ...]:
        g = self.graph
        return (len(g.resource_names), len(g.meta), len(g.meta.get("collectives", ())), len(self.stats),
                len(self.rows), *map(len, self.state))

    def replay(self, key: tuple, r: int, last: dict, firsts: dict | None) -> bool:
        """Add block ``key`` of micro-batch ``r`` from its template, if it has one."""
        tmpl = self.templates.get(key)
        entry = last[self.rep]
        if tmpl is None or len(entry) != 1:
            return False
        second = self.gathered.get(self.rep)
        if (second is not None) != tmpl.has_second:
            return False
        g = self.graph
        base = len(g.kind)
        # The new tasks' ids, made once: every list below holds these int objects, as a build
        # task by task holds the one id each task got (a copy per reference took 200 MiB more).
        ids = list(range(base, base + len(tmpl.labels)))
        kind, duration, resources, devices, nbytes, latency, npred = tmpl.columns
        g.kind.extend(kind)
        g.duration.extend(duration)
        g.resources.extend(resources)
        g.devices.extend(devices)
        g.nbytes.extend(nbytes)
        g.latency.extend(latency)
        g.npred.extend(npred)
        g.extend_templated(r, tmpl.labels, tmpl.attrs, tmpl.shared_attrs)  # spelled out when first read
        # (most tasks have one successor in the block: their lists made in C, the others after)
        succ = list(map(list, zip(map(ids.__getitem__, tmpl.succ_one))))
        for k, ks in tmpl.succ_other:
            succ[k] = [ids[j] for j in ks]
        g.succ.extend(succ)
        g.succ[entry[0]].extend([ids[k] for k in tmpl.entry_succ])
        if second is not None:
            g.succ[second].extend([ids[k] for k in tmpl.second_succ])
        for name, k in tmpl.gathered_out:
            self.gathered[name] = ids[k]
        self.task_of.update(zip(map(add, tmpl.task_keys, repeat((r,))), map(ids.__getitem__, tmpl.task_at)))
        if tmpl.tp_done:
            self.tp_done.add_block(tmpl.tp_done_number, r, base)  # looked up from the template when read
        self.seq.extend(zip(map(ids.__getitem__, tmpl.seq_at), tmpl.seq_ops, repeat(r)))
        last[self.rep] = [ids[tmpl.last]]
        if firsts is not None and tmpl.first_compute is not None and firsts[self.rep] is None:
            firsts[self.rep] = ids[tmpl.first_compute]
        for row, calls, nb in tmpl.rows:
            row["calls"] += calls
            row["bytes"] += nb
        for kind, (calls, payload, steps) in tmpl.tallies.items():
            tally = self.stats[kind]
            tally["collectives"] += calls
            tally["payload_bytes"] += payload
            wire = tally["wire_bytes_per_gpu"]
            for step in steps:  # in the builder's order: the float sum is the same
                wire += step
            tally["wire_bytes_per_gpu"] = wire
        self.replayed += 1
        return True

    def start(self, key: tuple, r: int, last: dict) -> Recording | None:
        """Watch block ``key`` of micro-batch ``r`` being built, if its template is still sought."""
        entry = last[self.rep]
        if key in self.templates or len(entry) != 1 or self.recorded.get(key, 0) >= MAX_RECORDINGS:
            return None
        self.recorded[key] = self.recorded.get(key, 0) + 1
        rows = list({id(row): (row, row["calls"], row["bytes"]) for _charge, row in self.rows.values()}.values())
        second = self.gathered.get(self.rep)
        return Recording(key, r, entry[0], len(self.graph.kind), len(self.task_of), len(self.tp_done), len(self.seq),
                         rows, self._sizes(), -1 if second is None else second, dict(self.gathered))

    def finish(self, rec: Recording, last: dict, firsts: dict | None) -> None:
        """The block ``rec`` watched is built: keep its template; two equal in a row are used."""
        tmpl = self._template(rec, last, firsts)
        if tmpl is None:
            self.recorded[rec.key] = MAX_RECORDINGS  # never expressible: stop watching
            return
        prev = self.candidates.get(rec.key)
        if prev is not None and prev.same(tmpl):
            tmpl.tp_done_number = self.tp_done.template(tmpl.tp_done) if tmpl.tp_done else -1
            self.templates[rec.key] = tmpl
            del self.candidates[rec.key]
        else:
            self.candidates[rec.key] = tmpl

    def _template(self, rec: Recording, last: dict, firsts: dict | None) -> Template | None:
        g = self.graph
        first, end, r = rec.first, len(g.kind), rec.r
        n = end - first
        if n == 0 or len(last[self.rep]) != 1:
            return None
        mid = f" mb{r} "
        labels = [_split(label, mid) for label in g.label_rows[first:end]]  # built task by task: spelled out
        if None in labels:
            return None
        attrs: list[tuple[dict, tuple[str, str] | None]] = []
        for a in g.attr_rows[first:end]:
            if a is None or a.get("microbatch") != r:
                return None
            coll = None
            if "collective" in a:
                coll = _split(a["collective"], mid)
                if coll is None:
                    return None
            attrs.append((a, coll))
        succ = []
        count = [0] * n
        for ks in g.succ[first:end]:
            rel = [k - first for k in ks]
            if any(k < 0 for k in rel):
                return None
            for k in rel:
                count[k] += 1
            succ.append(rel)
        if rec.second == rec.entry:
            return None
        entry_succ = _into_block(g.succ[rec.entry], first)
        second_succ = _into_block(g.succ[rec.second], first) if rec.second >= 0 else []
        for k in (*entry_succ, *second_succ):
            count[k] += 1
        npred = g.npred[first:end]
        if count != npred:  # a task waits for one outside the block other than the entry (and the gather)
            return None
        gathered_out = []
        for name, task in self.gathered.items():
            if rec.gathered.get(name) != task:  # set in the block: to one of its tasks
                if not 0 <= task - first < n:
                    return None
                gathered_out.append((name, task - first))
        task_of = []
        for key in reversed(list(islice(reversed(self.task_of), len(self.task_of) - rec.n_task_of))):
            k = self.task_of[key] - first
            if len(key) != 4 or key[3] != r or not 0 <= k < n:
                return None
            if self.kept_ops is None or key[2] in self.kept_ops:
                task_of.append((key[:3], k))
        tp_done = []
        for key in reversed(list(islice(reversed(self.tp_done), len(self.tp_done) - rec.n_tp_done))):
            done = self.tp_done[key]
            if len(key) != 3 or key[1] != r or key[2] != 0 or len(done) != 1:
                return None
            (gpu, task), = done.items()
            if not 0 <= task - first < n:
                return None
            tp_done.append((key[0], gpu, task - first))
        seq = []
        for task, ops, mb in self.seq[rec.n_seq:]:
            if mb != r or not 0 <= task - first < n:
                return None
            seq.append((task - first, ops))
        last_task = last[self.rep][0] - first
        if not 0 <= last_task < n:
            return None
        first_compute = None
        if firsts is not None:
            f = firsts[self.rep]
            first_compute = None if f is None or f < first else f - first
        before = {id(row): (c, b) for row, c, b in rec.rows}
        rows = []
        for row in {id(row): row for _charge, row in self.rows.values()}.values():  # charges share rows
            c, b = before.get(id(row), (0, 0))
            if (row["calls"], row["bytes"]) != (c, b):
                rows.append((row, row["calls"] - c, row["bytes"] - b))
        columns = (g.kind[first:end], g.duration[first:end], g.resources[first:end], g.devices[first:end],
                   g.nbytes[first:end], g.latency[first:end], npred)
        return Template(columns, labels, attrs, succ, entry_succ, task_of, tp_done, seq, last_task, first_compute,
                        rows, list(rec.tally), rec.sizes + self._sizes(), rec.second >= 0, second_succ, gathered_out)


__all__ = ["BlockReplay", "Recording", "Template"]
