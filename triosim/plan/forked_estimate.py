"""Estimating a plan's candidates on worker processes forked from the plan's own.

The candidates are grouped by data-parallel degree. Every figure the estimator caches is keyed
by the per-replica batch (global batch / dp), so a group's candidates fill and read the caches in
the same order as they would in one process and get the same floats. The groups go to a pool of
``jobs`` processes, largest first; the workers inherit the model profile through ``fork`` (it is
never pickled) and send back each group's estimates when it ends, so an interruption keeps the
groups done so far.

Only where forking is safe: a platform with ``fork`` and no other thread in this process (the
sweep executor's rule). Elsewhere the caller estimates in its own process.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..sweep.execute import _terminate_workers, pool_context
from .candidates import Candidate
from .estimate import Estimate, PlanSettings, estimate
from .pipeline_time import PipelineTimer
from .profile import ModelProfile

# A candidate's index in the plan, its estimate, and why there is none (a ConfigError's line).
Estimated = tuple[int, "Estimate | None", "str | None"]


def can_fork() -> bool:
    """Whether worker processes can be forked from this one now."""
    return pool_context().get_start_method() == "fork"


def estimate_one(c: Candidate, profile: ModelProfile, settings: PlanSettings,
                 timer: PipelineTimer) -> tuple[Estimate | None, str | None]:
    """A candidate's estimate, or the first line of the ConfigError that refuses it (e.g. a tp
    the trace's tensor-parallel plan does not allow)."""
    try:
        return estimate(c, profile, settings, timer), None
    except ConfigError as exc:
        return None, str(exc).splitlines()[0]


@dataclass
class _WorkerSlot:
    profile: ModelProfile | None = None
    settings: PlanSettings | None = None
    timer: PipelineTimer | None = None


# Filled once in each forked worker by the pool initializer (never in the plan's own process):
# tasks then carry candidates, not the profile.
_WORKER = _WorkerSlot()


def _init(profile: ModelProfile, settings: PlanSettings) -> None:
    # Ctrl-C reaches the whole process group; the parent keeps what is done and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER.profile, _WORKER.settings = profile, settings
    _WORKER.timer = PipelineTimer(profile.platform)


def _estimate_group(group: list[tuple[int, Candidate]]) -> list[Estimated]:
    profile, settings, timer = _WORKER.profile, _WORKER.settings, _WORKER.timer
    assert profile is not None and settings is not None and timer is not None, "worker used without its initializer"
    return [(k, *estimate_one(c, profile, settings, timer)) for k, c in group]


def groups_by_dp(candidates: Sequence[Candidate]) -> list[list[tuple[int, Candidate]]]:
    """The candidates (with their indices) grouped by data-parallel degree, in enumeration order
    within a group; the largest group first (ties: the first enumerated)."""
    groups: dict[int, list[tuple[int, Candidate]]] = {}
    for k, c in enumerate(candidates):
        groups.setdefault(c.dp, []).append((k, c))
    return sorted(groups.values(), key=len, reverse=True)


def estimate_forked(candidates: Sequence[Candidate], profile: ModelProfile, settings: PlanSettings, jobs: int,
                    on_group: Callable[[list[Estimated]], None]) -> None:
    """Estimate ``candidates`` on ``jobs`` forked processes, calling ``on_group`` with each
    group's estimates as it ends (in the order groups end). Needs :func:`can_fork`."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    groups = groups_by_dp(candidates)
    executor = ProcessPoolExecutor(max_workers=max(1, min(jobs, len(groups))), mp_context=pool_context(),
                                   initializer=_init, initargs=(profile, settings))
    try:
        futures = [executor.submit(_estimate_group, g) for g in groups]
        for fut in as_completed(futures):
            on_group(fut.result())
    except BaseException:
        _terminate_workers(executor)
        executor.shutdown(wait=False, cancel_futures=True)
        raise
    executor.shutdown(wait=True)


__all__ = ["Estimated", "can_fork", "estimate_forked", "estimate_one", "groups_by_dp"]
