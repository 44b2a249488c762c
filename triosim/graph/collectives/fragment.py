"""What every collective's task-DAG fragment is built from, whatever its algorithm.

- the **detail**: ``expanded`` (one ``transfer`` task per chunk and hop), ``macro`` (one
  ``collective`` task per phase holding the phase's links for its closed-form time) or ``auto``
  (expanded while it needs at most :data:`EXPAND_LIMIT` transfers);
- the payload cut into integer **chunks** that add up to it exactly;
- per-GPU **predecessors** (``after``), the **macro** tasks of a plan's phases, and the
  per-GPU **done** syncs a builder returns: a GPU holds the result when its sync ends.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain, repeat
from typing import Any

from ...hardware.platform import Platform
from ...schedule.tasks import TaskGraph
from .phases import Phase

DETAILS = ("auto", "expanded", "macro")
# "auto" expands a collective while it needs at most this many transfer tasks.
EXPAND_LIMIT = 512

After = Iterable[int] | Mapping[int, Iterable[int]]


def chunk_sizes(nbytes: int, n: int) -> list[int]:
    """``n`` integer chunk sizes summing to ``nbytes``; the first ``nbytes mod n`` get one more."""
    base, extra = divmod(int(nbytes), n)
    return [base + (1 if c < extra else 0) for c in range(n)]


def resolve_detail(detail: str, transfers: int) -> str:
    """``detail`` checked, and ``auto`` made concrete for a fragment of ``transfers`` transfers."""
    if detail not in DETAILS:
        raise ValueError(f"collective detail must be one of {DETAILS}, got {detail!r}")
    if detail == "auto":
        return "expanded" if transfers <= EXPAND_LIMIT else "macro"
    return detail


# The GPUs a folded build builds (graph.composition.folds), while it adds its collectives.
FOLD_BUILT_META = "fold_built"


def preds(graph: TaskGraph, group: tuple[int, ...], after: After, label: str) -> dict[int, list[int]]:
    """Per-GPU predecessors; common predecessors are joined once so edges stay O(N)."""
    if isinstance(after, Mapping):
        # a list given is shared, not copied: the algorithms copy before they add to one
        return {g: v if (v := after.get(g, ())).__class__ is list else list(v) for g in group}
    common = list(after)
    if len(common) > 1 and len(group) > 1:
        common = [graph.add_sync(f"{label} start", common, devices=group)]
    return dict.fromkeys(group, common)  # one list for every GPU


def done_syncs(graph: TaskGraph, label: str, attrs: dict[str, Any], deps: Mapping[int, Iterable[int]]) -> dict[int, int]:
    """One ``done`` sync per GPU of ``deps`` (in its order), after that GPU's tasks in it. In a
    folded build (``graph.meta["fold_built"]``: the GPUs built) where every GPU waits for the same
    tasks, only the built GPUs' syncs are added and the others share the first: they would end
    together."""
    tags = {"collective": label, **attrs}  # one dict for every GPU's sync
    built = graph.meta.get(FOLD_BUILT_META)
    if built is not None and deps:
        first = next(iter(deps.values()))
        # (map and filter over 4,096 GPUs a collective: a folded case-3 run adds a hundred)
        if all(map(operator.eq, repeat(first), deps.values())):
            mine = {g: graph.add_sync_tagged(f"{label} done gpu{g}", first, (g,), tags)
                    for g in filter(built.__contains__, deps)}
            if mine:
                out = dict.fromkeys(deps, next(iter(mine.values())))
                out.update(mine)
                return out
    gpus = list(deps)
    afters = [a if a.__class__ is list or a.__class__ is tuple else list(a) for a in deps.values()]
    return dict(zip(gpus, graph.add_sync_each(gpus, [f"{label} done gpu{g}" for g in gpus], tags, afters)))


def phase_macros(graph: TaskGraph, platform: Platform, group: tuple[int, ...], op: str, nbytes: int,
                 phases: Sequence[Phase], label: str, pre: dict[int, list[int]], attrs: dict[str, Any],
                 ) -> dict[int, int]:
    """One ``collective`` task per phase holding the phase's links for its closed-form time."""
    # Each distinct predecessor list once (every GPU often shares one), then their tasks once.
    lists = list(map(pre.__getitem__, group))
    deps = list(dict.fromkeys(chain.from_iterable(dict(zip(map(id, lists), lists)).values())))
    tags = {"collective": label, **attrs}
    for ph in phases:
        load = dict(ph.link_load)  # bytes per link, fractional: the flow model's shares use them
        task = graph.add_task(
            "collective", f"{label} {ph.name}", ph.seconds(platform), tuple(load), group, nbytes, after=deps,
            latency_s=ph.latency_seconds(), **{"op": op, **tags, "phase": ph.name, "link_load": load},
        )
        deps = [task]
    return done_syncs(graph, label, attrs, {g: deps for g in group})
