"""What the pipeline partitioner weighs, per forward position of the trace.

Each forward position weighs its forward time and the time of the backward ops that follow it,
per micro-batch size (op times come from the trace's op-time model, so a small micro-batch is
not simply a fraction of the batch), its share of the optimizer (which follows the parameters
the position reads first), and the bytes crossing the cut after it in each direction: a buffer
version written at one position and read at others crosses, hop by hop, every cut between the
writer and its farthest reader on each side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...compute.op_time import op_seconds
from ...trace import Trace
from .schedules import BACKWARD, OPTIMIZER


@dataclass(frozen=True)
class Version:
    """A buffer as last written by ``writer`` and the ops (elsewhere) that read that version."""

    buffer: str
    writer: int
    readers: tuple[int, ...]


def buffer_versions(trace: Trace, phase: Sequence[str]) -> list[Version]:
    """Every (buffer, last writer) read by a later forward/backward op, in trace order."""
    last_writer: dict[str, int] = {}
    readers: dict[tuple[str, int], list[int]] = {}
    for i, p in enumerate(phase):
        if p == OPTIMIZER:
            continue
        for k in trace.reads[i]:
            w = last_writer.get(k)
            if w is not None and w != i:
                readers.setdefault((k, w), []).append(i)
        for k in trace.writes[i]:
            last_writer[k] = i
    return [Version(k, w, tuple(r)) for (k, w), r in readers.items()]


def _cut_costs(trace: Trace, versions: list[Version], pos: dict[int, int], nf: int) -> tuple[list[int], list[int]]:
    """Bytes crossing the cut after each forward position, forward and backward direction.

    A version written at position p and read at positions c crosses (hop by hop) every cut
    between p and the farthest reader on each side.
    """
    fwd = [0] * (nf + 1)
    bwd = [0] * (nf + 1)
    for v in versions:
        p = pos[v.writer]
        cs = [pos[c] for c in v.readers]
        size = trace.tensors[v.buffer].bytes
        hi, lo = max(cs), min(cs)
        if hi > p:
            fwd[p] += size
            fwd[hi] -= size
        if lo < p:
            bwd[lo] += size
            bwd[p] -= size
    out_f, out_b, af, ab = [], [], 0, 0
    for k in range(nf - 1):
        af += fwd[k]
        ab += bwd[k]
        out_f.append(af)
        out_b.append(ab)
    return out_f, out_b


@dataclass(frozen=True)
class StageCosts:
    """What the partitioner weighs, per forward position.

    ``forward_s[m]`` / ``backward_s[m]``: forward and attached backward time at micro-batch size
    m, for each micro-batch size of ``sizes``; ``optimizer_s``: optimizer time (once per
    iteration); ``cut_forward`` / ``cut_backward``: bytes at the full ``batch`` crossing the cut
    after each position (scaled by m / batch per micro-batch).
    """

    batch: int
    sizes: tuple[int, ...]
    forward_s: dict[int, tuple[float, ...]]
    backward_s: dict[int, tuple[float, ...]]
    optimizer_s: tuple[float, ...]
    cut_forward: tuple[int, ...]
    cut_backward: tuple[int, ...]
    backward_ops: tuple[int, ...] = ()  # backward ops anchored at each position

    @property
    def weights(self) -> list[float]:
        """Forward + backward time per position at the first (largest) micro-batch size."""
        m = self.sizes[0]
        return [f + b for f, b in zip(self.forward_s[m], self.backward_s[m])]


def stage_costs(trace: Trace, phase: Sequence[str], fops: list[int], pos: dict[int, int],
                sizes: Sequence[int]) -> StageCosts:
    """Per-position costs (``pos``: op -> forward position; ``sizes``: the micro-batch sizes)."""
    nf = len(fops)
    fwd: dict[int, tuple[float, ...]] = {}
    bwd: dict[int, tuple[float, ...]] = {}
    count = [0] * nf
    for i, k in pos.items():
        if phase[i] == BACKWARD:
            count[k] += 1
    for m in dict.fromkeys(sizes):
        fwd[m] = tuple(op_seconds(trace, i, m) for i in fops)
        b = [0.0] * nf
        for i, k in pos.items():
            if phase[i] == BACKWARD:
                b[k] += op_seconds(trace, i, m)
        bwd[m] = tuple(b)
    # Optimizer time follows the parameters, which belong to the position of their first reader.
    param_bytes = [0] * nf
    first: dict[str, int] = {}
    for i in sorted(pos):
        for k in trace.reads[i]:
            first.setdefault(k, pos[i])
    for prm in trace.parameters:
        if prm in first:
            param_bytes[first[prm]] += trace.tensors[prm].bytes
    total_bytes = sum(param_bytes)
    opt_s = sum(op.duration_s for op, p in zip(trace.ops, phase) if p == OPTIMIZER)
    opt = [opt_s * b / total_bytes if total_bytes else opt_s / nf for b in param_bytes]
    cut_f, cut_b = _cut_costs(trace, buffer_versions(trace, phase), pos, nf)
    return StageCosts(trace.batch_size, tuple(sizes), fwd, bwd, tuple(opt), tuple(cut_f), tuple(cut_b), tuple(count))
