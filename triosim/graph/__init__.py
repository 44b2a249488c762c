"""Task-DAG building: one builder (:mod:`triosim.graph.builder`) composing data, tensor and
pipeline parallel parts, and what they share."""

from __future__ import annotations

from .builder import GraphBuilder, build_graph
from .tasks import TaskGraph

__all__ = ["GraphBuilder", "TaskGraph", "build_graph"]
