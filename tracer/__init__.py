"""triosim.tracer: record one PyTorch training step and turn it into a TrioSim trace.

The tracer models a training iteration as the sequence of *top-level* PyTorch operators the step
executes (forward ops, autograd backward nodes, optimizer ops), each with the tensors it reads and
writes and the device time it took.  Two recordings of the same step feed it: the execution-trace
observer (tensor identities, shapes, storage) and the torch.profiler Chrome trace (op and kernel
times).  `collect` makes both recordings (needs torch); `convert` pairs them and writes the
`trace.csv` + `tensor.csv` pair the simulator reads (pure Python, no torch needed);
`trace_module` does both for a training step of the user's own ``nn.Module``.
"""

from __future__ import annotations

from .convert import ConvertOptions, convert_files, convert_trace
from .errors import TracerError
from .module import trace_module

__all__ = ["ConvertOptions", "TracerError", "convert_files", "convert_trace", "trace_module"]
