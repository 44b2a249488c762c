"""Reading, checking, repeating and synthesizing single-GPU operator traces.

The public names: :class:`Trace` (a validated trace and its data-flow facts), :class:`Op` and
:class:`Tensor` (its records), :func:`load_trace`, :func:`derive`, :func:`read_trace_info` and
:func:`trace_batch_size`. Batch scaling, which needs the op-time model, is
:func:`triosim.compute.scale.scale_trace`.
"""

from .dataflow import Trace, derive
from .load import load_trace, read_trace_info, trace_batch_size
from .model import Op, Tensor

__all__ = ["Op", "Tensor", "Trace", "derive", "load_trace", "read_trace_info", "trace_batch_size"]
