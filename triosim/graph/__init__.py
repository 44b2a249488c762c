"""Task-DAG builders, one module per parallelism strategy, and what they share."""

from __future__ import annotations

import importlib

from ..errors import ConfigError
from ..hardware.platform import Platform
from ..limits import check_graph_size, op_copies
from ..trace import Trace
from .strategy import Strategy
from .tasks import TaskGraph

# case -> module under triosim.graph exposing ``build(trace, platform, strategy) -> TaskGraph``
BUILDER_MODULES = {
    0: "single",
    1: "data.data_parallel",
    2: "data.data_parallel",
    3: "tensor.per_op",
    4: "pipeline.builder",
}


def build_graph(trace: Trace, platform: Platform, strategy: Strategy) -> TaskGraph:
    """The task DAG of one training iteration of ``trace`` under ``strategy`` on ``platform``."""
    strategy.validate(platform.num_gpus if strategy.hybrid else None)
    # Refuse at once what would exhaust memory after minutes of building.
    what = strategy.name if strategy.hybrid else f"-case {strategy.case}"
    check_graph_size(len(trace.ops), op_copies(strategy, platform.num_gpus), platform.num_gpus, what)
    name = "hybrid" if strategy.hybrid else BUILDER_MODULES[strategy.case]
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise ConfigError(f"-case {strategy.case} ({strategy.name}) is not implemented yet") from None
    from ..hardware.flow_network import attach_network

    graph = module.build(trace, platform, strategy)
    graph.meta.setdefault("parallel", strategy.parallel_dict(platform.num_gpus))
    return attach_network(graph, platform)


__all__ = ["TaskGraph", "build_graph", "BUILDER_MODULES"]
