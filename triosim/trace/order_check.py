"""Rules on the order of a trace's ops that no single row can break: a tensor read before the op
that makes it, and two ops each reading what the other writes (a 2-cycle).

The data-flow model (:mod:`triosim.trace.dataflow`) calls a tensor *external* when it is read
before (or by the same op as) its first write: parameters, optimizer state, the input batch.
That is right for state the step carries in and the optimizer (or an in-place op) updates, and
wrong for anything else: an activation or a gradient read by op 5 and first written by op 9 was
not fetched from memory, the rows are out of order, and simulating it would silently drop the
dependency. So a tensor first read by op ``a`` and first written by a *later* op ``b`` is

* an error when ``b`` also reads something ``a`` writes (each op waits for the other: a cycle);
* accepted when the tensor is parameter-like (``weight``, ``bias``, a running statistic), or
  when ``b`` is an optimizer op (the step's update of state it read earlier);
* an error otherwise (naming both lines).

Measured on the shipped traces (``sample_trace/*``, CPU and H200) and the original's H100
reference traces: the only tensors read before their first write are one ``weight`` in each
reference trace (read by NllLossBackward0, first written by a later ConvolutionBackward0), which
stays accepted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import TraceError
from .model import CATEGORY_RANK, Op, Tensor

# Categories a step carries in and may update later: parameters and running statistics.
STATE_RANK = 4


def _state_like(tensor: Tensor | None) -> bool:
    return tensor is not None and CATEGORY_RANK.get(tensor.category, 2) >= STATE_RANK


def check_read_order(ops: Sequence[Op], tensors: Mapping[str, Tensor], ids: Sequence[str],
                     reads: Sequence[tuple[str, ...]], writes: Sequence[tuple[str, ...]],
                     first_read: np.ndarray, first_write: np.ndarray) -> None:
    """Raise a TraceError for the first tensor (in op order) read before its first write that is
    neither state nor updated by the optimizer, or that closes a 2-cycle. ``first_read`` and
    ``first_write`` give per tensor code (``ids[code]``) the first reading/writing op (``len(ops)``:
    none); ``reads``/``writes`` are the ops' buffer lists."""
    n = len(ops)
    early = np.flatnonzero((first_write < n) & (first_read < first_write))
    if not len(early):
        return
    for code in early[np.argsort(first_read[early], kind="stable")].tolist():
        a, b = int(first_read[code]), int(first_write[code])
        tid = ids[code]
        if not set(reads[b]).isdisjoint(writes[a]):
            both = sorted(set(reads[b]) & set(writes[a]))[0]
            raise TraceError(
                "trace.csv", f"reads tensor {tid}, which line {ops[b].line} writes later, while line {ops[b].line} "
                f"reads tensor {both}, which this op writes: the two ops form a cycle",
                row=ops[a].line, field="Operator_input")
        if ops[b].stage == "optimizer" or _state_like(tensors.get(tid)):
            continue
        raise TraceError(
            "trace.csv", f"reads tensor {tid} before line {ops[b].line} writes it (only parameters, running "
            "statistics and what the optimizer updates may be read before their first write; are rows out of order?)",
            row=ops[a].line, field="Operator_input")


__all__ = ["check_read_order"]
