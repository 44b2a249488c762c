"""Collapsing a task DAG by its repeats: a run of identical layers, or of identical micro-batches,
drawn as one node that says how many it stands for.

A training step repeats itself: each pass runs the same transformer layer L times, and each GPU
runs the same passes for each of M micro-batches. ``collapse_repeats`` keeps what differs and the
first and last of what repeats, so a 70B model on hundreds of GPUs is a picture of a few hundred
nodes that still shows what the schedule does:

1. Start from the per-layer grouping (:func:`triosim.report.collapse.collapse`, ``layer``).
2. Each GPU's groups (with the collectives that run on that GPU alone), in program order, are cut
   into *blocks*: one pass (forward, backward, optimizer) of one micro-batch.
3. A unit of up to :data:`MAX_PERIOD` blocks repeated back to back at least :data:`MIN_REPEATS`
   times (``forward mb i``; 1F1B's ``backward mb i, forward mb i+p``) keeps its first and last
   unit; the units between are one node, ``×n``.
4. The blocks that stay are drawn with their layers (``detail``), where runs of identical layer
   groups are collapsed the same way, or as one node each.
5. Work between GPUs (pipeline transfers, collectives over several GPUs) with the same name
   pattern and the same neighbours is one node.

A collapsed node stands for a loop, so arrows may run both ways between two of them (a pipeline's
steady state sends activations one way and gradients the other); the other modes stay DAGs.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, field

from ..schedule.tasks import TaskGraph
from .collapse import Collapsed, Group, _edges, collapse

MAX_PERIOD = 16  # the longest unit looked for, in groups or blocks (a layer, 1F1B's steady state: 2 blocks)
MIN_REPEATS = 4  # first, last and at least two between: collapsing fewer would hide one unit
# How much of what stays is drawn, most first: which blocks show their layers ("all" that stay,
# the "first" of each pass on each GPU, "none") and whether a layer run's first and last unit
# show each of their groups (True) or are one node each.
DETAIL_LEVELS = (("all", True), ("first", True), ("first", False), ("none", False))
_NUMBERS = re.compile(r"\d+")
_PLACE_WORD = re.compile(r"^(mb|gpu|stage|dp|tp)\d+$")  # where a task runs, said by its node's cluster
_WORD_NUMBER = re.compile(r"(?<=[A-Za-z])\d+\b|#\d+")  # bucket3, ViewBackward0, linear#16
_UNIT_TEXT_MAX = 72  # characters of a run's "unit:" line


@dataclass
class _Block:
    """One micro-batch's work on one GPU, run back to back: base group ids in program order."""

    lane: int
    mb: int | None
    groups: list[int] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)  # its passes in order (collectives: none)

    @property
    def stage(self) -> str:
        return "+".join(self.stages) or "collectives"


def find_runs(sigs: Sequence[Hashable], prefer_start: Callable[[int], bool] | None = None,
              max_period: int = MAX_PERIOD, min_repeats: int = MIN_REPEATS) -> list[tuple[int, int, int]]:
    """Cover ``sigs`` left to right with ``(start, period, count)``: a unit of ``period`` items
    repeated ``count`` times back to back (``count >= min_repeats``), else one item ``(i, 1, 1)``.
    At each position the run covering most items wins (the shorter unit on ties); a run is moved
    up to ``period - 1`` items later when that starts its unit where ``prefer_start`` says (a
    layer starts at its compute, not at the collective that closes the layer before) and covers
    as many units."""

    def count_at(i: int, p: int) -> int:
        c = 1
        while i + (c + 1) * p <= len(sigs) and sigs[i + c * p:i + (c + 1) * p] == sigs[i:i + p]:
            c += 1
        return c

    out: list[tuple[int, int, int]] = []
    i = 0
    while i < len(sigs):
        best_p, best_c = 1, 1
        for p in range(1, max_period + 1):
            if i + p * min_repeats > len(sigs):
                break
            c = count_at(i, p)
            if c >= min_repeats and c * p > best_p * best_c:
                best_p, best_c = p, c
        if best_c >= min_repeats and prefer_start is not None and not prefer_start(i):
            for s in range(1, best_p):
                if prefer_start(i + s) and count_at(i + s, best_p) >= best_c:
                    out.extend((i + k, 1, 1) for k in range(s))
                    i += s
                    break
        out.append((i, best_p, best_c) if best_c >= min_repeats else (i, 1, 1))
        i += best_p * best_c if best_c >= min_repeats else 1
    return out


def _first(graph: TaskGraph, tasks: Sequence[int]) -> int:
    computes = [t for t in tasks if graph.kind[t] == "compute"]
    return min(computes or tasks)


def _attr(graph: TaskGraph, t: int, name: str):
    attrs = graph.attrs[t]
    return attrs.get(name) if attrs else None


def _short(label: str) -> str:
    """``add#10 .. linear#16 mb0 gpu0`` → ``add … linear``: without op numbers or GPU/mb words."""
    words = [w for w in label.split() if not _PLACE_WORD.match(w)]
    return re.sub(r"#\d+", "", " ".join(words) or label).replace(" .. ", " … ")


def _span(values: Sequence[int | None]) -> str:
    nums = sorted(v for v in values if v is not None)
    if not nums:
        return ""
    return f"{nums[0]}" if nums[0] == nums[-1] else f"{nums[0]}–{nums[-1]}"


def _block_name(stage: str, mbs: Sequence[int | None]) -> str:
    span = _span(mbs)
    return stage + (f" mb {span}" if span else "")


@dataclass
class _Base:
    """The per-layer grouping and what the repeats are found from, computed once for every level."""

    groups: list[Group]
    group_of: list[int | None]
    sig: list[tuple]  # what each group is, whatever its layer, micro-batch or GPU
    lane: list[int | None]  # the one GPU all its tasks run on; None between GPUs
    start: list[int]  # its first task: program order
    blocks: dict[int, list[_Block]]  # each GPU's blocks in program order
    graph: TaskGraph
    names: dict[int, str] = field(default_factory=dict)

    def name(self, gi: int) -> str:
        """What a node of this group is called (only the groups drawn are named)."""
        if gi not in self.names:
            self.names[gi] = _group_name(self.graph, self.groups[gi])
        return self.names[gi]


def _group_name(graph: TaskGraph, group: Group) -> str:
    ordered = sorted(group.tasks)
    first, last = _first(graph, ordered), ordered[-1]
    coll = _attr(graph, first, "collective")
    if group.kind == "collective" and coll is not None:
        return _short(str(coll))
    direction = _attr(graph, first, "direction")
    if group.kind == "transfer" and direction is not None:
        return f"{direction} send {_attr(graph, first, 'src')}->{_attr(graph, first, 'dst')}"
    a = _short(graph.label[first]).split(" … ")[0]
    b = _short(graph.label[last]).split(" … ")[-1]
    return a if a == b or group.kind != "compute" or graph.kind[last] != "compute" else f"{a} … {b}"


def _base(graph: TaskGraph, gpus: Collection[int] | None, param_ops: Collection[int] | None) -> _Base:
    layered = collapse(graph, "layer", gpus=gpus, param_ops=param_ops)
    groups = layered.groups
    sig, lane, start = [], [], []
    for g in groups:
        ordered = sorted(g.tasks)
        first = _first(graph, ordered)
        devs = {d for t in ordered for d in graph.devices[t]}
        kinds = Counter(graph.kind[t] for t in ordered)
        # Fused ops count too: attention and MLP halves of a layer are both "add .. linear".
        ops = sum(len(_attr(graph, t, "ops") or ()) for t in ordered if graph.kind[t] == "compute")
        sig.append((g.kind, _NUMBERS.sub("#", graph.label[first]), _NUMBERS.sub("#", graph.label[ordered[-1]]),
                    tuple(sorted(kinds.items())), ops))
        lane.append(next(iter(devs)) if len(devs) == 1 else None)
        start.append(ordered[0])
    # Each GPU's groups in program order, cut where the micro-batch changes: a pass (1F1B), or
    # a forward and backward run back to back (one stage, or a recomputed forward before each
    # layer's backward); a collective on that GPU alone belongs to the block it runs in.
    blocks: dict[int, list[_Block]] = {}
    for gi in sorted(range(len(groups)), key=start.__getitem__):
        d = lane[gi]
        if d is None:
            continue
        t = _first(graph, groups[gi].tasks)
        mb = _attr(graph, t, "microbatch")
        stage = _attr(graph, t, "stage") if graph.kind[t] == "compute" else None if mb is not None else "collectives"
        seq = blocks.setdefault(d, [])
        if not seq or seq[-1].mb != mb:
            seq.append(_Block(d, mb))
        seq[-1].groups.append(gi)
        if stage is not None and stage not in seq[-1].stages:
            seq[-1].stages.append(str(stage))
    return _Base(groups, layered.group_of, sig, lane, start, blocks, graph)


def collapse_repeats(graph: TaskGraph, gpus: Collection[int] | None = None,
                     param_ops: Collection[int] | None = None, detail: tuple[str, bool] = DETAIL_LEVELS[0],
                     base: _Base | None = None) -> Collapsed:
    """Group ``graph`` by its repeats (module docstring) at ``detail``, one of :data:`DETAIL_LEVELS`."""
    base = base or _base(graph, gpus, param_ops)
    which_blocks, split_units = detail
    nodes: list[Group] = []
    node_of: list[int] = [-1] * len(base.groups)

    def add(gids: Sequence[int], title: str, device: int | None, repeats: int = 1) -> None:
        tasks = sorted(t for gi in gids for t in base.groups[gi].tasks)
        kinds = {graph.kind[t] for t in tasks}
        kind = "compute" if "compute" in kinds else base.groups[gids[0]].kind
        for gi in gids:
            node_of[gi] = len(nodes)
        nodes.append(Group(("repeat", len(nodes)), kind, tasks, device=device, title=title, repeats=repeats))

    def single(gi: int, device: int | None) -> None:
        mb = _attr(graph, _first(graph, base.groups[gi].tasks), "microbatch")
        add([gi], base.name(gi) + (f" · mb {mb}" if mb is not None else ""), device)

    def unit_text(gids: Sequence[int]) -> str:
        names = [_WORD_NUMBER.sub("", base.name(gi)) for gi in gids]
        text = " → ".join(names)
        return text if len(text) <= _UNIT_TEXT_MAX else text[:_UNIT_TEXT_MAX - 1] + "…"

    def detailed(block: _Block) -> None:
        gids = block.groups
        for s, p, c in find_runs([base.sig[gi] for gi in gids], lambda i: base.groups[gids[i]].kind == "compute"):
            if c < MIN_REPEATS:
                single(gids[s], block.lane)
                continue
            t = _first(graph, base.groups[gids[s]].tasks)
            stage = _attr(graph, t, "stage") if graph.kind[t] == "compute" else None
            where = _block_name(str(stage or "collectives"), [block.mb])
            unit = f"unit: {unit_text(gids[s:s + p])}"
            if split_units:
                for k in range(s, s + p):
                    single(gids[k], block.lane)
            else:
                add(gids[s:s + p], f"{where} · repeat 1 of {c}\\n{unit}", block.lane)
            add(gids[s + p:s + (c - 1) * p], f"{where} · repeats 2–{c - 1} of {c} (×{c - 2})\\n{unit}",
                block.lane, repeats=c - 2)
            if split_units:
                for k in range(s + (c - 1) * p, s + c * p):
                    single(gids[k], block.lane)
            else:
                add(gids[s + (c - 1) * p:s + c * p], f"{where} · repeat {c} of {c}\\n{unit}", block.lane)

    def keep(block: _Block, seen_stages: set[str]) -> None:
        first_of_stage = block.stage not in seen_stages
        seen_stages.add(block.stage)
        if which_blocks == "all" or (which_blocks == "first" and first_of_stage):
            detailed(block)
        else:
            add(block.groups, _block_name(block.stage, [block.mb]), block.lane)

    for d in sorted(base.blocks):
        seq = base.blocks[d]
        seen: set[str] = set()
        for s, p, c in find_runs([(b.stage, tuple(base.sig[gi] for gi in b.groups)) for b in seq]):
            if c < MIN_REPEATS:
                keep(seq[s], seen)
                continue
            for b in seq[s:s + p]:
                keep(b, seen)
            middle = seq[s + p:s + (c - 1) * p]
            name = ", ".join(_block_name(middle[j].stage, [b.mb for b in middle[j::p]]) for j in range(p))
            add([gi for b in middle for gi in b.groups], f"{name} (×{c - 2})", d, repeats=c - 2)
            for b in seq[s + (c - 1) * p:s + c * p]:
                keep(b, seen)

    # Work between GPUs: one node per name pattern and neighbours on the GPUs.
    near: dict[int, tuple[set[int], set[int]]] = {}
    for u, vs in enumerate(graph.succ):
        gu = base.group_of[u]
        if gu is None:
            continue
        for v in vs:
            gv = base.group_of[v]
            if gv is None or gv == gu:
                continue
            if base.lane[gu] is None and base.lane[gv] is not None:
                near.setdefault(gu, (set(), set()))[1].add(node_of[gv])
            if base.lane[gv] is None and base.lane[gu] is not None:
                near.setdefault(gv, (set(), set()))[0].add(node_of[gu])
    between: dict[tuple, list[int]] = {}
    for gi in sorted((gi for gi, d in enumerate(base.lane) if d is None), key=base.start.__getitem__):
        before, after = near.get(gi, ((), ()))
        between.setdefault((base.sig[gi], frozenset(before), frozenset(after)), []).append(gi)
    for gids in between.values():
        if len(gids) == 1:
            single(gids[0], None)
            continue
        span = _span([_attr(graph, _first(graph, base.groups[gi].tasks), "microbatch") for gi in gids])
        add(gids, f"{base.name(gids[0])}{f' · mb {span}' if span else ''} (×{len(gids)})", None,
            repeats=len(gids))

    group_of: list[int | None] = [None] * len(graph)
    for gi, node in enumerate(nodes):
        for t in node.tasks:
            group_of[t] = gi
    return Collapsed(nodes, group_of, _edges(graph, group_of))


def repeats_picture(graph: TaskGraph, max_nodes: int, gpus: Collection[int] | None = None,
                    param_ops: Collection[int] | None = None) -> Collapsed:
    """The most detailed :func:`collapse_repeats` within ``max_nodes`` nodes, else the coarsest."""
    base = _base(graph, gpus, param_ops)
    for level in DETAIL_LEVELS:
        collapsed = collapse_repeats(graph, detail=level, base=base)
        if len(collapsed.groups) <= max_nodes:
            break
    return collapsed
