"""The search: estimate every candidate in closed form (on forked workers for large searches),
then time the best few with the full task-DAG simulation (the same path as ``triosim run``,
through the sweep executor) and rank them by the simulated time.

Interrupting (Ctrl-C) stops the search where it is: :class:`PlanOutcome` then holds the
estimates and DAG times done so far (``interrupted`` True), for the report to keep.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from ..errors import ConfigError
from ..graph.offload import host_link_rate
from ..graph.recompute_spec import DEFAULT_MODULES
from ..sweep.execute import OK, Outcome, prepare, run_dask, run_inprocess, run_pool, with_zero_twins
from ..sweep.grid import Point
from .candidates import Candidate
from .estimate import OVERLAP_OVER_BOUND, TIME_OVER_BOUND, Estimate, PlanSettings, estimate
from .forked_estimate import Estimated, can_fork, estimate_forked
from .fp8_recipes import recipe_of, refused_modules
from .pipeline_time import PipelineTimer
from .profile import ModelProfile
from .variants import (
    block,
    block_may_help,
    is_parent,
    may_offload,
    module_variants,
    offloaded,
    smallest_fitting,
)

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass
class Row:
    """One candidate's figures: its estimate (None when it could not be estimated: ``error``)
    and, for the best few, its DAG outcome."""

    candidate: Candidate
    estimate: Estimate | None = None
    error: str | None = None
    dag: Outcome | None = None

    @property
    def feasible(self) -> bool:
        return self.estimate is not None and self.estimate.fits and self.error is None

    @property
    def reason(self) -> str | None:
        """Why the candidate is out (None: it is in). The DAG's memory verdict, where there is
        one, overrides the estimate's (a candidate near the limit is DAG-checked)."""
        if self.error is not None:
            return self.error
        if self.dag is not None and self.dag.status != OK:
            return f"DAG: {self.dag.reason}"
        if self.dag is not None and self.dag.fits is False:
            return "DAG: memory peak over the GPU's capacity"
        if self.dag is not None and self.dag.fits is True:
            return None
        if self.estimate is not None and not self.estimate.fits:
            return self.estimate.reason
        return None

    @property
    def best_time_s(self) -> float:
        """The DAG time where there is one, else the estimate (for the ranking)."""
        if self.dag is not None and self.dag.status == OK and self.dag.makespan_ms is not None:
            return self.dag.makespan_ms / 1e3
        return self.estimate.time_s if self.estimate is not None else float("inf")


@dataclass
class PlanOutcome:
    rows: list[Row]
    ranked: list[Row] = field(default_factory=list)  # the DAG-timed ones, best first, then the rest estimated
    estimate_s: float = 0.0
    dag_s: float = 0.0
    interrupted: bool = False


FORK_MIN = 1000  # candidates from which forked workers pay off (each warms its own caches)


def estimate_all(candidates: Sequence[Candidate], profile: ModelProfile, settings: PlanSettings,
                 progress: Progress | None = None, jobs: int = 1) -> tuple[list[Row], bool]:
    """Every candidate's estimate; (rows, interrupted). With ``jobs`` > 1 and ``FORK_MIN``
    candidates or more, on forked worker processes where forking is safe
    (:mod:`triosim.plan.forked_estimate`: the same figures); interrupted, the rows estimated so
    far, in enumeration order."""
    if jobs > 1 and len(candidates) >= FORK_MIN and can_fork():
        return _estimate_forked(candidates, profile, settings, progress, jobs)
    timer = PipelineTimer(profile.platform)
    rows: list[Row] = []
    try:
        for k, c in enumerate(candidates):
            row = Row(c)
            try:
                row.estimate = estimate(c, profile, settings, timer)
            except ConfigError as exc:  # e.g. a tp the trace's tensor-parallel plan refuses
                row.error = str(exc).splitlines()[0]
            rows.append(row)
            if progress is not None and k % 64 == 0:
                progress("estimating", k + 1, len(candidates))
    except KeyboardInterrupt:
        return rows, True
    return rows, False


def _estimate_forked(candidates: Sequence[Candidate], profile: ModelProfile, settings: PlanSettings,
                     progress: Progress | None, jobs: int) -> tuple[list[Row], bool]:
    done: dict[int, Row] = {}

    def on_group(group: list[Estimated]) -> None:
        for k, est, error in group:
            done[k] = Row(candidates[k], est, error)
        if progress is not None:
            progress("estimating", len(done), len(candidates))

    interrupted = False
    try:
        estimate_forked(candidates, profile, settings, jobs, on_group)
    except KeyboardInterrupt:
        interrupted = True
    return [done[k] for k in sorted(done)], interrupted


def refine(rows: list[Row], profile: ModelProfile, settings: PlanSettings, limit_s: float,
           progress: Progress | None = None) -> list[Row]:
    """The rows of the settings between none, selective and full, and of activation offload,
    worth estimating (:mod:`triosim.plan.variants`): those of every parent that does not fit and whose
    estimate is below ``limit_s`` (of the :data:`MAX_PARENTS` fastest, when the limit is
    infinite), each estimated; in the order of their parents, then as tried."""
    parents = [r for r in rows if r.error is None and r.estimate is not None and not r.estimate.fits
               and r.estimate.time_s < limit_s and is_parent(r.candidate)]
    if limit_s == float("inf"):
        parents = sorted(parents, key=lambda r: r.estimate.time_s)[:MAX_PARENTS]
    timer = PipelineTimer(profile.platform)
    out: list[Row] = []

    def run(c: Candidate) -> Row:
        out.extend(estimated([c], profile, settings, timer))
        return out[-1]

    full = {r.candidate: r for r in rows if r.candidate.recompute == "full" and not r.candidate.detailed}
    host = has_host_link(profile)
    # --moe-a2a-overlap: Megatron-Core refuses full recomputation, block recomputation of N layers included
    blocks = not (profile.parent or profile).overlaps.a2a
    for k, parent in enumerate(parents):
        c = parent.candidate
        if c.recompute == "none":
            sibling = full.get(replace(c, recompute="full"))
            if blocks and (sibling is None or block_may_help(parent, sibling, profile.layers, limit_s)):
                smallest_fitting(c, profile.layers, block, lambda v: run(v).feasible)
            if host and may_offload(c):
                smallest_fitting(c, profile.layers, offloaded, lambda v: run(v).feasible)
        else:
            sibling = full.get(replace(c, recompute="full"))
            if sibling is None or sibling.feasible:  # none fits where full recomputation (holding least) does not
                module_variants(c, lambda v: run(v).feasible, refused_modules(recipe_of(c, profile)))
        if progress is not None and k % 16 == 0:
            progress("refining", k + 1, len(parents))
    return out


MAX_PARENTS = 64  # candidates refined when there is no time to beat (nothing fits)


def dispatcher_variants(rows: list[Row], profile: ModelProfile, settings: PlanSettings, limit_s: float) -> list[Row]:
    """The rows of the other token dispatchers (``settings.dispatchers``) on an MoE model's
    candidates whose estimate is below ``limit_s`` (the :data:`MAX_PARENTS` fastest), each
    estimated: the dispatcher changes only the token exchanges, so it can decide only among the
    fastest. Megatron-Core's conditions hold: expert tensor parallelism with alltoall only, the
    combined schedule and the shared-expert overlap with alltoall or flex."""
    if not settings.dispatchers:
        return []
    overlaps = (profile.parent or profile).overlaps
    parents = sorted((r for r in rows if r.error is None and r.estimate is not None and r.candidate.ep > 1
                      and r.candidate.etp == 1 and r.candidate.dispatcher is None and r.estimate.time_s < limit_s),
                     key=lambda r: r.estimate.time_s)[:MAX_PARENTS]
    return estimated((replace(parent.candidate, dispatcher=d) for parent in parents for d in settings.dispatchers
                      if not (d == "allgather" and (overlaps.a2a or overlaps.shared))), profile, settings)


def overlaps_could_beat(parent: Estimate, best_s: float) -> bool:
    """Whether the overlaps' variant of ``parent`` could enter :func:`dag_band` of ``best_s``: the
    variant's estimate is at least the parent's pipeline time, and its bound the larger of the
    parent's and :data:`~triosim.plan.estimate.OVERLAP_OVER_BOUND`."""
    return parent.pipeline_s <= best_s * (1 + max(parent.over_bound, OVERLAP_OVER_BOUND))


def overlap_variants(rows: list[Row], profile: ModelProfile, settings: PlanSettings, best_s: float) -> list[Row]:
    """The rows of Megatron-Core's data-parallel overlaps (``--overlap-grad-reduce``, with
    ``--overlap-param-gather`` under ZeRO 1/2) on every candidate with data ranks that fits and
    could beat a DAG time of ``best_s`` with them, each estimated, where the run pins neither
    (``settings.overlap_variants``). The overlaps hide how the gradients and the updated
    parameters move, never the pipeline: a variant's estimate is at least its parent's
    :attr:`~triosim.plan.estimate.Estimate.pipeline_s`, so a parent whose pipeline ends above
    ``best_s`` plus the over-bound its variant will have cannot give one in :func:`dag_band`
    (of those whose variant nothing bounds, the :data:`MAX_PARENTS` fastest)."""
    if not settings.overlap_variants:
        return []
    parents = [r for r in rows if r.feasible and r.candidate.data > 1 and not r.candidate.overlaps
               and overlaps_could_beat(r.estimate, best_s)]
    # those whose variant nothing bounds (every one without a best): the MAX_PARENTS fastest
    loose = sorted((r for r in parents if best_s == float("inf") or math.isinf(r.estimate.over_bound)),
                   key=lambda r: r.estimate.time_s)
    dropped = {id(r) for r in loose[MAX_PARENTS:]}
    parents = [r for r in parents if id(r) not in dropped]
    return estimated((replace(parent.candidate, overlaps=True) for parent in parents), profile, settings)


def estimated(candidates: Iterable[Candidate], profile: ModelProfile, settings: PlanSettings,
              timer: PipelineTimer | None = None) -> list[Row]:
    """A row of each of ``candidates``, estimated (a refusal kept as the row's error), in order."""
    timer = timer or PipelineTimer(profile.platform)
    out = []
    for c in candidates:
        row = Row(c)
        try:
            row.estimate = estimate(c, profile, settings, timer)
        except ConfigError as exc:
            row.error = str(exc).splitlines()[0]
        out.append(row)
    return out


def has_host_link(profile: ModelProfile) -> bool:
    """Whether the GPU's device file gives the host link activation offload copies over."""
    try:
        host_link_rate((profile.parent or profile).raw)
    except ConfigError:
        return False
    return True


def refine_and_time(rows: list[Row], profile: ModelProfile, settings: PlanSettings, base: dict, top: int,
                    jobs: int = 1, progress: Progress | None = None,
                    dask: str | None = None) -> tuple[list[Row], bool, float, float]:
    """After the DAG timing of the candidates: :func:`refine` the parents whose estimate is
    below the best DAG time plus :data:`~triosim.plan.estimate.TIME_OVER_BOUND` (a refinement is
    slower than its parent: above that it cannot beat the best; the fastest estimate that fits
    stands in for the best without a DAG time), try the other token dispatchers and the
    overlaps (:func:`dispatcher_variants`, :func:`overlap_variants`), then DAG-time the best
    ``top`` of those that could beat it (:func:`dag_band`): the fastest :data:`FIRST_ROUND`
    first, then those still in the band of the best after them. Returns (the new rows,
    interrupted, seconds estimating, seconds DAG-timing)."""
    t0 = time.perf_counter()
    best = _best_dag_s(rows)
    if best == float("inf"):
        best = min((r.estimate.time_s for r in rows if r.feasible), default=float("inf"))
    more = refine(rows, profile, settings, best * (1 + TIME_OVER_BOUND), progress)
    more += dispatcher_variants(rows + more, profile, settings, best * (1 + TIME_OVER_BOUND))
    more += overlap_variants(rows + more, profile, settings, best)
    t1 = time.perf_counter()
    interrupted = False
    if top > 0:
        timed = dag_band(best_estimated(more, top), best)
        # the fastest FIRST_ROUND first: a refinement or variant faster than the best (the
        # overlaps' variants often are) narrows the band the others are timed against
        first = with_twins(timed[:FIRST_ROUND], timed)
        if first:
            interrupted = dag_time(first, base, settings.global_batch, jobs, progress, dask)
        if len(timed) > len(first) and not interrupted:
            taken = {id(r) for r in first}
            rest = dag_band([r for r in timed if id(r) not in taken], min(best, _best_dag_s(first)))
            after_first = None
            if progress is not None:  # counted on from the first round
                def after_first(phase: str, done: int, total: int) -> None:
                    progress(phase, len(first) + done, len(first) + total)
            if rest:
                interrupted = dag_time(rest, base, settings.global_batch, jobs, after_first, dask)
    return more, interrupted, t1 - t0, time.perf_counter() - t1


# The refinements and variants DAG-timed before the band is narrowed by their best: a few, so
# that one estimated too low (the overlaps' can be 3 % below the DAG) does not set it alone;
# fixed, so the rows timed do not depend on --jobs.
FIRST_ROUND = 3

# A candidate whose estimated peak is at most this far over the capacity is DAG-checked rather
# than dropped when it is among the fastest: the DAG's memory verdict decides.
NEAR_LIMIT = 0.05


def with_twins(first: list[Row], rows: Sequence[Row]) -> list[Row]:
    """``first`` and the ZeRO 1/2 twins among ``rows`` of its rows (the other stage, every other
    field the same), so that a round times them together: one simulation gives both
    (:func:`~triosim.sweep.execute.with_zero_twins`)."""
    def twin(c: Candidate) -> Candidate | None:
        return replace(c, zero=3 - c.zero) if c.zero in (1, 2) else None

    wanted = {twin(r.candidate) for r in first} - {None}
    taken = {id(r) for r in first}
    return first + [r for r in rows if r.candidate in wanted and id(r) not in taken]


def best_estimated(rows: Sequence[Row], k: int) -> list[Row]:
    """The ``k`` feasible rows of lowest estimated time (ties: enumeration order)."""
    feasible = [r for r in rows if r.feasible]
    feasible.sort(key=lambda r: r.estimate.time_s)
    return feasible[:k]


def near_limit(rows: Sequence[Row], best: Sequence[Row], capacity: int | None) -> list[Row]:
    """Rows over ``capacity`` by their estimate but within :data:`NEAR_LIMIT` of it, no slower
    by estimate than the slowest of ``best`` (all of them when ``best`` is empty), fastest first."""
    if capacity is None:
        return []
    slowest = max((r.estimate.time_s for r in best), default=float("inf"))
    near = [r for r in rows if r.error is None and r.estimate is not None and not r.estimate.fits
            and r.estimate.peak_bytes <= capacity * (1 + NEAR_LIMIT) and r.estimate.time_s <= slowest]
    near.sort(key=lambda r: r.estimate.time_s)
    return near[:max(1, len(best))]


def candidate_config(base: dict, c: Candidate, global_batch: int) -> dict:
    """The run flags (dest → value) of candidate ``c`` on top of the plan's own ``base``; the
    batch as ``--global-batch`` where the run has that flag."""
    config = dict(base)
    if "global_batch" in base:
        config.update(global_batch=global_batch, batch_size_sim=-1)
    else:
        config.update(batch_size_sim=global_batch // c.dp)
    config.update(dp=c.dp, tp=c.tp, pp=c.pp, micro_batch_size=c.micro_batch,
                  schedule=c.schedule, virtual_stages=c.virtual, zero=str(c.zero),
                  sequence_parallel=c.sequence_parallel, gpus=None, cp=c.cp if c.cp > 1 else None,
                  ep=c.ep if c.ep > 1 else None, etp=c.etp if c.etp > 1 else None)
    if c.recompute != "none":
        config["recompute"] = c.recompute
    if c.recompute == "full" and (c.recompute_method != "uniform" or c.recompute_num_layers != 1):
        config.update(recompute_method=c.recompute_method, recompute_num_layers=c.recompute_num_layers)
    if c.recompute == "selective" and c.recompute_modules != DEFAULT_MODULES:
        config["recompute_modules"] = ",".join(c.recompute_modules)
    if c.offload is not None:
        config["offload_activations"] = c.offload
    if c.dispatcher:
        config["moe_token_dispatcher"] = c.dispatcher
    if c.overlaps:
        config.update(overlap_grad_reduce=True, overlap_param_gather=c.gathers_overlapped)
    if c.fp8_recipe:
        config["fp8_recipe"] = c.fp8_recipe
    split = c.split
    config.update(account_for_embedding_in_pipeline_split=split.account_for_embedding,
                  account_for_loss_in_pipeline_split=split.account_for_loss,
                  decoder_first_pipeline_num_layers=split.first_stage_layers,
                  decoder_last_pipeline_num_layers=split.last_stage_layers,
                  pipeline_model_parallel_layout=split.layout)
    return config


def dag_time(rows: Sequence[Row], base: dict, global_batch: int, jobs: int = 1,
             progress: Progress | None = None, dask: str | None = None,
             on_row: Callable[[Row], None] | None = None) -> bool:
    """Simulate each row's configuration with the task DAG (sweep executor: in-process, a
    local process pool with ``jobs`` > 1, or the Dask cluster at ``dask``); sets ``row.dag``
    and hands each row to ``on_row`` as its outcome arrives (a journal of a long run).
    Returns True when interrupted."""
    points = []
    for k, row in enumerate(rows):
        c = row.candidate
        config = candidate_config(base, c, global_batch)
        points.append(Point(k, (), tuple(sorted(vars(argparse.Namespace(**config)).items()))))
    prepared = prepare(points)
    done = [0]

    def on_outcome(o: Outcome) -> None:
        rows[o.index].dag = o
        if on_row is not None:
            on_row(rows[o.index])
        done[0] += 1
        if progress is not None:
            progress("DAG-timing", done[0], len(rows))

    if progress is not None:
        progress("DAG-timing", 0, len(rows))
    for o in prepared.settled:
        on_outcome(o)
    tasks = with_zero_twins(prepared.tasks)  # a ZeRO-2 row rides on its ZeRO-1 twin's simulation
    try:
        if dask is not None:
            run_dask(dask, prepared.traces, tasks, on_outcome)
        elif jobs > 1 and len(tasks) > 1:
            run_pool(prepared.traces, tasks, jobs, on_outcome)
        else:
            run_inprocess(prepared.traces, tasks, on_outcome)
    except KeyboardInterrupt:
        return True
    return False


def dag_band(rows: Sequence[Row], best_s: float) -> list[Row]:
    """The rows that could still beat a DAG time of ``best_s``: those whose estimate is within
    its :attr:`~triosim.plan.estimate.Estimate.over_bound` of it (TIME_OVER_BOUND where bounded,
    ROUGH_OVER_BOUND where only roughly, every row where nothing bounds how far above the DAG
    the estimate may be). A row estimated above that has a DAG time above ``best_s``."""
    return [r for r in rows if r.estimate.time_s <= best_s * (1 + r.estimate.over_bound)]


def _best_dag_s(rows: Sequence[Row]) -> float:
    return min((r.best_time_s for r in rows if r.dag is not None and r.reason is None), default=float("inf"))


def dag_check(rows: Sequence[Row], settings: PlanSettings, base: dict, top: int, jobs: int,
               progress: Progress | None, dask: str | None) -> bool:
    """DAG-time at most ``top`` of the best estimates, and those near the memory limit, skipping
    those that cannot beat the best DAG time: the fastest estimate is timed, then whichever of the
    rest :func:`dag_band` keeps. Returns True when interrupted."""
    best = best_estimated(rows, top)
    best += near_limit(rows, best, settings.capacity_bytes)
    best.sort(key=lambda r: r.estimate.time_s)  # stable: the fastest first, as estimated
    if not best:
        return False
    if all(math.isinf(r.estimate.over_bound) for r in best):
        return dag_time(best, base, settings.global_batch, jobs, progress, dask)
    first = with_twins(best[:1], best)  # one (and its twin), whatever --jobs: the rows timed must not depend on it
    if dag_time(first, base, settings.global_batch, jobs, progress, dask):
        return True
    taken = {id(r) for r in first}
    rest = dag_band([r for r in best if id(r) not in taken], _best_dag_s(first))
    if not rest:
        return False
    after_first = None
    if progress is not None:  # counted on from the first round
        def after_first(phase: str, done: int, total: int) -> None:
            progress(phase, len(first) + done, len(first) + total)
    return dag_time(rest, base, settings.global_batch, jobs, after_first, dask)


def rank(rows: Sequence[Row]) -> list[Row]:
    """DAG-timed rows that ran and fit, fastest first; then the other feasible ones by estimate."""
    timed = [r for r in rows if r.dag is not None and r.reason is None]
    timed.sort(key=lambda r: r.best_time_s)
    rest = [r for r in rows if r.dag is None and r.feasible]
    rest.sort(key=lambda r: r.estimate.time_s)
    return timed + rest


def search(candidates: Sequence[Candidate], profile: ModelProfile, settings: PlanSettings, base: dict,
           top: int = 20, jobs: int = 1, progress: Progress | None = None, dask: str | None = None,
           refined: bool = True) -> PlanOutcome:
    """Estimate all, DAG-time the best ``top``, refine and DAG-time the refinements that could
    beat the best (``refined``: :func:`refine_and_time`), rank (module docstring)."""
    t0 = time.perf_counter()
    rows, interrupted = estimate_all(candidates, profile, settings, progress, jobs if dask is None else 1)
    t1 = time.perf_counter()
    out = PlanOutcome(rows, estimate_s=t1 - t0, interrupted=interrupted)
    if not interrupted and top > 0:
        try:
            out.interrupted = dag_check(rows, settings, base, top, jobs, progress, dask)
        except KeyboardInterrupt:  # before the timing started (preparing its traces): the estimates stand
            out.interrupted = True
    out.dag_s = time.perf_counter() - t1
    if refined and not out.interrupted:
        try:
            more, out.interrupted, est_s, dag_s = refine_and_time(rows, profile, settings, base, top, jobs, progress,
                                                                   dask)
            rows += more
            out.estimate_s += est_s
            out.dag_s += dag_s
        except KeyboardInterrupt:
            out.interrupted = True
    out.ranked = rank(rows)
    return out


__all__ = ["NEAR_LIMIT", "PlanOutcome", "Row", "best_estimated", "candidate_config", "dag_band", "dag_check", "dag_time",
           "estimate_all", "near_limit", "overlap_variants", "rank", "refine", "refine_and_time", "search"]
