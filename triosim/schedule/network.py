"""The platform's network model recorded on a task graph, for the scheduler."""

from __future__ import annotations

from ..hardware.platform import Platform
from .tasks import TaskGraph

NETWORK_META = "network"
BANDWIDTH_META = "link_bandwidth"


def attach_network(graph: TaskGraph, platform: Platform) -> TaskGraph:
    """Record the platform's network model and link bandwidths on ``graph`` for the scheduler."""
    graph.meta[NETWORK_META] = platform.network
    links = set(platform.links())
    graph.meta[BANDWIDTH_META] = {name: platform.link_bandwidth(name) for name in graph.resource_names
                                  if name in links}
    return graph
