"""The graph builder: the one way from a :class:`~triosim.graph.strategy.Strategy` to the task DAG
of one training iteration on a platform.

A run given as degrees (``--dp/--tp/--pp``) is built by the composition
(:mod:`triosim.graph.composition`). A ``-case`` run is its :class:`~triosim.graph.strategy.Preset`:
one axis spread over every GPU, built by that axis's component, whose DAG, times and JSON blocks
are those of the original's case (the composition reproduces the dp, tp and pp presets' times and
memory, tests compare them, but not their JSON blocks, case 1's whole-gradient all-reduce, case
0's memory plan or the original's replays):

- no axis: every op on GPU 0 in trace order (:mod:`triosim.graph.single`);
- dp: replicas on the platform's ring with DDP buckets or one whole-gradient all-reduce
  (:mod:`triosim.graph.data.data_parallel`);
- tp: the per-op plan on the ring (:mod:`triosim.graph.tensor.per_op`);
- pp: stages and micro-batches (:mod:`triosim.graph.pipeline.builder`).

``--reference-compat`` is a mode beside them: the same components follow the original's
choices, and the pipeline is a replay of the original's player
(:mod:`triosim.graph.pipeline.reference`).
"""

from __future__ import annotations

from ..hardware.platform import Platform
from ..limits import check_graph_size, op_copies
from ..schedule.network import attach_network
from ..schedule.tasks import TaskGraph
from ..trace import Trace
from . import composition, single
from .data import data_parallel
from .pipeline import builder as pipeline_builder
from .pipeline import reference
from .strategy import Strategy
from .tensor.megatron import plan_tensor_parallel
from .tensor.per_op import build_from_plan


class GraphBuilder:
    """Builds the DAG of ``strategy`` on ``platform`` from ``trace``: :meth:`check`, :meth:`compose`,
    then the run's ``parallel`` block and the platform's network recorded on the graph."""

    def __init__(self, trace: Trace, platform: Platform, strategy: Strategy) -> None:
        self.trace = trace
        self.platform = platform
        self.strategy = strategy

    def build(self) -> TaskGraph:
        self.check()
        graph = self.compose()
        graph.meta.setdefault("parallel", self.strategy.parallel_dict(self.platform.num_gpus))
        return attach_network(graph, self.platform)

    def check(self) -> None:
        """Refuse a bad strategy, and at once what would exhaust memory after minutes of building."""
        strategy, n = self.strategy, self.platform.num_gpus
        strategy.validate(n if strategy.hybrid else None)
        what = strategy.name if strategy.hybrid else f"-case {strategy.case}"
        check_graph_size(len(self.trace.ops), op_copies(strategy, n), n, what)

    def compose(self) -> TaskGraph:
        """The DAG without the run-level blocks: the composition, or the preset's component."""
        trace, platform, strategy = self.trace, self.platform, self.strategy
        if strategy.hybrid:
            return composition.build(trace, platform, strategy)
        axis = strategy.preset.axis
        if axis == "dp":
            return data_parallel.build(trace, platform, strategy)
        if axis == "tp":
            return self.tensor_ring()
        if axis == "pp":
            if strategy.reference_compat:
                return reference.build(trace, platform, strategy)
            return pipeline_builder.build(trace, platform, strategy)
        return single.build(trace, platform, strategy)

    def tensor_ring(self) -> TaskGraph:
        """Tensor parallelism over every GPU with the per-op plan (the original's all-reduce of
        every tpflag op's outputs under ``--reference-compat``)."""
        plan = plan_tensor_parallel(self.trace, self.platform.num_gpus, style="per-op",
                                    reference_compat=self.strategy.reference_compat)
        return build_from_plan(self.trace, self.platform, self.strategy, plan)


def build_graph(trace: Trace, platform: Platform, strategy: Strategy) -> TaskGraph:
    """The task DAG of one training iteration of ``trace`` under ``strategy`` on ``platform``."""
    return GraphBuilder(trace, platform, strategy).build()


__all__ = ["GraphBuilder", "build_graph"]
