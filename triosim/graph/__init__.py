"""Task-DAG building: one builder (:mod:`triosim.graph.builder`) composing data, tensor and
pipeline parallel parts, and what they share."""

from __future__ import annotations

from ..schedule.tasks import TaskGraph
from .builder import GraphBuilder, build_graph

__all__ = ["GraphBuilder", "TaskGraph", "build_graph"]
