"""The configurations no other beats on both iteration time and peak memory per GPU: the Pareto
set of a plan, from the DAG's figures where a candidate was DAG-timed, else its estimate."""

from __future__ import annotations

from collections.abc import Sequence

from ..sweep.execute import OK
from .search import Row


def time_and_memory(row: Row) -> tuple[float, float]:
    """(seconds, peak bytes per GPU): the DAG's where it timed the row, else the estimate's."""
    d = row.dag
    if d is not None and d.status == OK and d.makespan_ms is not None:
        return d.makespan_ms / 1e3, float(d.max_peak_memory_bytes or row.estimate.peak_bytes)
    return row.estimate.time_s, float(row.estimate.peak_bytes)


def pareto_set(ranked: Sequence[Row]) -> list[Row]:
    """The rows of ``ranked`` (every one in, as :func:`triosim.plan.search.rank` returns them)
    that no other row is at least as fast and as small as, and strictly one of them; fastest
    first (ties: the smaller, then rank order)."""
    order = sorted(range(len(ranked)), key=lambda k: (*time_and_memory(ranked[k]), k))
    out: list[Row] = []
    smallest = float("inf")
    for k in order:
        _, memory = time_and_memory(ranked[k])
        if memory < smallest:
            out.append(ranked[k])
            smallest = memory
    return out


__all__ = ["pareto_set", "time_and_memory"]
