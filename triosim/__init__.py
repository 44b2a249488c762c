"""triosim: predict a DNN training iteration on many GPUs from a one-GPU operator trace."""

from __future__ import annotations

__version__ = "0.1.0"

from .compute.op_time import attach_op_time_model  # noqa: E402
from .compute.scale import scale_trace  # noqa: E402
from .errors import ConfigError, OutOfMemoryError, TraceError, TriosimError  # noqa: E402
from .graph.strategy import Strategy  # noqa: E402
from .hardware.platform import Platform, build_platform  # noqa: E402
from .trace import Trace, load_trace  # noqa: E402


def simulate(trace: Trace, platform: Platform, strategy: Strategy):
    """Build the task DAG, schedule it and return a :class:`triosim.report.result.Result`."""
    from .report.result import run_simulation

    return run_simulation(trace, platform, strategy)


__all__ = [
    "ConfigError",
    "OutOfMemoryError",
    "Platform",
    "Strategy",
    "Trace",
    "TraceError",
    "TriosimError",
    "attach_op_time_model",
    "build_platform",
    "load_trace",
    "scale_trace",
    "simulate",
]
