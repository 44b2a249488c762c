"""triosim: predict a DNN training iteration on many GPUs from a one-GPU operator trace.

The Python API mirrors ``triosim run`` in four steps (``docs/api.md`` walks through them)::

    import triosim

    trace = triosim.load_trace("my_trace", batch_size=128)      # trace.csv + tensor.csv (+ meta.json)
    platform = triosim.build_platform(8, ptp_bandwidth_gbps=300, network="flow")
    strategy = triosim.Strategy(dp=2, tp=2, pp=2, micro_batch_size=16)
    result = triosim.simulate(trace, platform, strategy)
    print(result.makespan_ms, result.per_gpu[0], result.to_dict()["per_link"][:3])

``configure(...)`` builds the same three objects from the command line's flag names. Every bad
input raises a :class:`TriosimError` (``TraceError`` for a trace file, ``ConfigError`` for a
setting, ``OutOfMemoryError`` when an op cannot fit), whose message is the CLI's one-line error.
"""

from __future__ import annotations

from .compute.op_time import attach_op_time_model
from .compute.scale import scale_trace
from .config import configure
from .errors import ConfigError, OutOfMemoryError, TraceError, TriosimError
from .graph.strategy import Strategy
from .hardware.platform import Platform
from .hardware.presets import build_platform
from .report.result import GpuStats, LinkStats, Result
from .simulation import simulate
from .trace import Trace
from .trace.load import load_trace
from .version import __version__

__all__ = [
    "__version__",
    # the four steps
    "load_trace",
    "build_platform",
    "Strategy",
    "simulate",
    # what they return
    "Trace",
    "Platform",
    "Result",
    "GpuStats",
    "LinkStats",
    # the command line's flags as Python keywords
    "configure",
    # op times at another batch
    "scale_trace",
    "attach_op_time_model",
    # errors
    "TriosimError",
    "TraceError",
    "ConfigError",
    "OutOfMemoryError",
]
