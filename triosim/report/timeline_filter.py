"""Which part of a schedule the ``--timeline`` file holds: some GPUs, the first micro-batches.

A 256-GPU run of a 70B model is half a million trace events, a file of 100 MB and more that a
browser will not open. ``--timeline-gpus 0,1,8`` keeps those GPUs' compute tracks, memory
counters and the links with an end at one of them (with the transfers and collectives they
carry); ``--timeline-micro-batches N`` keeps the first N micro-batches' tasks and everything
that belongs to no micro-batch (gradient collectives, the optimizer). ``all`` keeps everything.

Left to their defaults, both keep everything while the full timeline has at most
:data:`LARGE_SLICES` slices; a larger one keeps the first pipeline (the GPUs of data-parallel
replica 0 and tensor-parallel rank 0, one per pipeline stage) and its first
``max(8, 2 × pp)`` micro-batches (the warm-up and some steady state), and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..graph.rank_map import rank_map
from ..schedule.list_scheduler import Schedule
from ..schedule.tasks import TaskGraph
from .timeline import _drawn, shown_links

LARGE_SLICES = 200_000  # about 40 MB of JSON: beyond it the defaults cut the timeline
MIN_DEFAULT_MICRO_BATCHES = 8


def parse_gpu_indices(raw: str, flag: str, num_gpus: int | None, expected: str) -> frozenset[int]:
    """A comma list of GPU indices (``--show-gpus``, ``--timeline-gpus``), each checked against
    ``num_gpus`` when given; ``expected`` says what the flag takes, for the error."""
    try:
        gpus = frozenset(int(tok) for tok in str(raw).split(","))
    except ValueError:
        raise ConfigError(f"{flag} must be {expected}, got {raw!r}") from None
    bad = sorted(g for g in gpus if g < 0 or (num_gpus is not None and g >= num_gpus))
    if bad:
        have = f" (the platform has GPUs 0..{num_gpus - 1})" if num_gpus is not None else ""
        raise ConfigError(f"{flag}: GPU {bad[0]} does not exist{have}")
    return gpus


def parse_timeline_gpus(raw: str | None, num_gpus: int | None = None) -> frozenset[int] | str | None:
    """``--timeline-gpus``: None (not given), ``"all"``, or the GPU indices (checked against
    ``num_gpus`` when given)."""
    if raw is None:
        return None
    text = str(raw).strip().lower()
    if text == "all":
        return "all"
    return parse_gpu_indices(raw, "--timeline-gpus", num_gpus,
                             "'all' or a comma list of GPU indices (e.g. 0,1,8)")


def parse_timeline_micro_batches(raw: str | None) -> int | str | None:
    """``--timeline-micro-batches``: None (not given), ``"all"``, or N >= 1."""
    if raw is None:
        return None
    text = str(raw).strip().lower()
    if text == "all":
        return "all"
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"--timeline-micro-batches must be 'all' or a whole number >= 1, got {raw!r}")
    return n


def first_pipeline(strategy, num_gpus: int) -> frozenset[int]:
    """The GPUs of data-parallel replica 0 and tensor-parallel rank 0: one per pipeline stage."""
    dp, tp, pp = strategy.degrees(num_gpus)
    if dp * tp * pp * strategy.context_degree != num_gpus:  # a composition that does not fill the platform: GPU 0
        return frozenset({0})
    return frozenset(rank_map(strategy, num_gpus).stage_gpus(0, 0))


@dataclass(frozen=True)
class TimelineSelection:
    """What the timeline keeps, and why."""

    gpus: frozenset[int] | None  # None: every GPU
    micro_batches: int | None  # the first N; None: every micro-batch
    keep: list[bool] | None  # per task; None: every task
    by_default: bool  # chosen because the full timeline is large
    full_slices: int  # the full timeline's slices
    total_micro_batches: int
    num_gpus: int
    idle_gpus: tuple[int, ...]  # asked-for GPUs the graph gives no task of its own
    representatives: bool  # the graph builds one GPU per role (a hybrid run without --exact)

    def summary(self, path: str, nbytes: int, events: Sequence[dict]) -> str:
        """One line for stderr: what was written, what was left out and how to get it."""
        phases = {"X": 0, "C": 0, "s": 0, "M": 0}
        for ev in events:
            if ev["ph"] in phases:
                phases[ev["ph"]] += 1
        counts = (f"{len(events):,} events: {phases['X']:,} slices, {phases['C']:,} memory samples, "
                  f"{phases['s']:,} dependency arrows")
        size = f"{nbytes / 1e6:.1f} MB" if nbytes >= 100_000 else f"{nbytes / 1e3:.1f} kB"
        text = f"timeline: wrote {path}: {size}, {counts}"
        if self.gpus is None and self.micro_batches is None:
            return text + "; every GPU and micro-batch"
        kept, left, get = [], [], []
        if self.gpus is not None:
            shown = ", ".join(str(g) for g in sorted(self.gpus))
            many = len(self.gpus) > 1
            kept.append(f"GPU{'s' if many else ''} {shown} (of {self.num_gpus}) and {'their' if many else 'its'} links")
            left.append("the other GPUs' tracks")
            get.append("--timeline-gpus all")
        if self.micro_batches is not None:
            kept.append(f"micro-batches 0–{self.micro_batches - 1} of {self.total_micro_batches} and the work "
                        "outside them")
            left.append(f"micro-batches {self.micro_batches}–{self.total_micro_batches - 1}")
            get.append("--timeline-micro-batches all")
        why = (f" (by default: the full timeline would have {self.full_slices:,} slices)" if self.by_default
               else "")
        text += f"; kept {' and '.join(kept)}; left out {' and '.join(left)}{why}; {' '.join(get)} keeps them"
        if self.idle_gpus:
            text += (f"; note: GPU {', '.join(str(g) for g in self.idle_gpus)} runs no task of its own in this "
                     "graph" + (" (one GPU stands for each role: --exact builds every GPU)"
                                if self.representatives else ""))
        return text


def _slices(graph: TaskGraph, sched: Schedule, keep: list[bool] | None, shown: list[bool]) -> int:
    n = 0
    for t, kind in enumerate(graph.kind):
        if (keep is None or keep[t]) and _drawn(graph, sched, t):
            n += 1 if kind == "compute" else sum(1 for r in graph.resources[t] if shown[r])
    return n


def select_timeline(graph: TaskGraph, sched: Schedule, strategy, num_gpus: int,
                    gpus_flag: frozenset[int] | str | None, micro_batches_flag: int | str | None) -> TimelineSelection:
    """The tasks and links the timeline keeps: the flags' choice, or the defaults for the size
    (module docstring)."""
    full = _slices(graph, sched, None, shown_links(graph, None))
    mbs = [a.get("microbatch") for a in graph.attrs if a and a.get("microbatch") is not None]
    total_mbs = max(mbs) + 1 if mbs else 0
    large = full > LARGE_SLICES
    gpus: frozenset[int] | None
    if gpus_flag is None:
        gpus = first_pipeline(strategy, num_gpus) if large else None
    else:
        gpus = None if gpus_flag == "all" else frozenset(gpus_flag)  # type: ignore[arg-type]
    n: int | None
    if micro_batches_flag is None:
        pp = strategy.degrees(num_gpus)[2]
        n = max(MIN_DEFAULT_MICRO_BATCHES, 2 * pp) if large else None
    else:
        n = None if micro_batches_flag == "all" else int(micro_batches_flag)
    if n is not None and n >= total_mbs:
        n = None  # nothing to leave out
    if gpus is not None and gpus >= frozenset(range(num_gpus)):
        gpus = None
    keep = None
    if gpus is not None or n is not None:
        keep = [(gpus is None or any(d in gpus for d in devs)) and (n is None or not a or a.get("microbatch") is None
                                                                     or a["microbatch"] < n)
                for devs, a in zip(graph.devices, graph.attrs)]
    has_work = {d for devs in graph.devices for d in devs}
    idle = tuple(sorted(g for g in (gpus or ()) if g not in has_work))
    by_default = large and (gpus_flag is None or micro_batches_flag is None) and keep is not None
    reps = bool((graph.meta.get("hybrid") or {}).get("representatives"))
    return TimelineSelection(gpus, n, keep, by_default, full, total_mbs, num_gpus, idle, reps)
