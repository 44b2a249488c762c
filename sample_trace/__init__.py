"""Sample TrioSim traces made by triosim's own tracer (see README.md in this directory).

Each sub-directory holds one training iteration as ``trace.csv`` + ``tensor.csv`` (plus the
``meta.json`` the tracer wrote).  ``DEFAULT`` names the CNN trace the simulator uses by default.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT = "resnet18-cpu-bs16"
DEFAULT_BATCH_SIZE = 16


def trace_dir(name: str = DEFAULT) -> Path:
    """The directory of the sample trace ``name``."""
    return Path(__file__).resolve().parent / name
