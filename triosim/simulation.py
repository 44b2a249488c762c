"""One simulation, as a pipeline of verb-named steps: build the task DAG of the strategy on the
platform, schedule it, summarize the schedule into per-GPU and per-link figures."""

from __future__ import annotations

from .graph import build_graph
from .graph.strategy import Strategy
from .hardware.platform import Platform
from .report.result import Result, summarize
from .schedule.list_scheduler import schedule
from .trace import Trace


def simulate(trace: Trace, platform: Platform, strategy: Strategy, progress=None,
             memory_twins: tuple[int, ...] = ()) -> Result:
    """Build the task DAG of one training iteration, schedule it and return the :class:`Result`.

    ``progress`` (optional) is called by the scheduler with the number of tasks placed so far;
    ``memory_twins``: ZeRO stages whose memory peaks the graph records too (:func:`build_graph`).
    """
    graph = build_graph(trace, platform, strategy, memory_twins=memory_twins)
    sched = schedule(graph, progress=progress)
    per_gpu, per_link = summarize(graph, sched, platform)
    return Result(makespan_s=sched.makespan, strategy=strategy, platform=platform, graph=graph,
                  schedule=sched, per_gpu=per_gpu, per_link=per_link)
