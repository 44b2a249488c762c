"""The hardware a run is simulated on: GPUs and their memory, the interconnect graph with its links,
topology files, and the flow network that shares links between concurrent transfers."""

from __future__ import annotations

from .platform import Platform, gpu_node, link_name
from .presets import build_platform

__all__ = ["Platform", "build_platform", "gpu_node", "link_name"]
