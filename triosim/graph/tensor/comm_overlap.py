"""Tensor-parallel communication overlapped with its GEMMs (``--tp-comm-overlap``), as Megatron-Core
runs it through Transformer Engine's userbuffers (``TransformerConfig.tp_comm_overlap``; Transformer
Engine's ``initialize_ub`` default methods per GEMM).

Sequence parallelism puts an all-gather before each column-parallel GEMM and a reduce-scatter
after each row-parallel one. With the overlap on, each becomes tasks beside the GEMM's own chunks
(the scheduler sees the overlap; nothing is patched on times):

- **ring exchange** (TE's ``ring_exchange``: ``qkv_fprop``, ``fc1_fprop``, ``proj_dgrad``,
  ``fc2_dgrad``): the all-gather of a block's input before its column GEMMs (forward) and of
  the output gradient before the row GEMM's backward. The GEMM runs in ``tp`` chunks (TE's
  ``num_splits = tp_size``); chunk 0 is the rank's own shard and starts at once, chunk k waits
  for ring step k, a point-to-point send of one shard to the next rank of the group; step k + 1
  follows step k. What stays exposed is whatever the steps take beyond the chunks before them
  (nothing while a step is shorter than a chunk).
- **pipelined reduce-scatter** (TE's ``pipeline``: ``proj_fprop``, ``fc2_fprop``): the row GEMM
  of the forward runs in ``PIPELINE_SPLITS`` chunks, each followed by the reduce-scatter of its
  share of the output, one after another beside the next chunks: the last chunk's
  reduce-scatter stays exposed.
- **bulk** (TE's ``bulk``: ``qkv_dgrad``/``fc1_dgrad`` and ``qkv_wgrad``/``fc1_wgrad``): in a
  block's backward the column linears' input-gradient (dgrad) GEMMs run first, beside the
  re-gather of the block input that their weight-gradient (wgrad) GEMMs need; the
  reduce-scatter of the input gradient then runs beside the wgrad GEMMs. Each column linear's
  backward op is split in a dgrad and a wgrad half (the two GEMMs have the same FLOPs), and the
  halves are reordered so (all dgrads, then the gradient sums, then all wgrads), as TE's fused
  QKV and FC1 GEMMs run them.

Without the overlap every such collective runs alone and the GEMM waits for all of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...hardware.platform import Platform
from ...schedule.tasks import TaskGraph
from ...trace import Trace
from ..collectives.star_routes import prime_routes

# Transformer Engine's defaults (transformer_engine/pytorch/module/base.py, ``initialize_ub``):
# the pipelined reduce-scatter splits its GEMM in 4; ring exchange and pipeline/bulk kernels use
# 1 and 16 SMs (ring exchange copies with the copy engines).
PIPELINE_SPLITS = 4
RING_SMS = 1
USERBUFFER_SMS = 16


@dataclass(frozen=True)
class Part:
    """A piece of one or more ops run as its own compute task (``frac`` of their time)."""

    frac: float
    ring: int | None = None  # the all-gather (by the op it follows) whose ring step this waits for
    step: int = 0  # that step (0: the rank's own shard, no wait)
    skip: int | None = None  # a collective (by its op) this piece does not wait for
    rs: int | None = None  # pipelined reduce-scatter: the op whose chunk follows this piece
    chunk: int = 0
    first: bool = True  # its ops' first piece (their memory step)
    last: bool = True  # their last piece (what later steps look up)


@dataclass(frozen=True)
class TpOverlapPlan:
    """Which TP collectives run beside which GEMMs. Collectives are named by the op they follow."""

    splits: int  # ring-exchange chunks (the TP degree)
    ring: dict[int, tuple[int, ...]]  # all-gather -> the run of ops chunked against it
    pipelined: frozenset[int]  # row linears whose reduce-scatter is pipelined
    bulk: dict[int, tuple[int, tuple[int, ...], int]]  # re-gather -> (its block's last backward op,
    # the column linears' backward ops split in dgrad and wgrad halves, the input-gradient reduce-scatter op)

    @property
    def cut_ops(self) -> set[int]:
        """Ops that must be tasks of their own (never fused with neighbours)."""
        out = set(self.pipelined)
        for run in self.ring.values():
            out.update(run)
        for last, split, _ in self.bulk.values():
            out.update(split)
            out.add(last)
        return out

    def sms(self, c_op: int, kind: str, redo: bool) -> int | None:
        """The SMs a TP collective's kernels take (TE's), or None for NCCL's."""
        if c_op in self.ring and kind == "all_gather" and not redo:
            return RING_SMS
        if (kind == "reduce_scatter" and c_op in self.pipelined) or (redo and c_op in self.bulk) or \
                (kind == "reduce_scatter" and any(rs == c_op for _, _, rs in self.bulk.values())):
            return USERBUFFER_SMS
        return None

    def pieces(self, segments: list[list[int]]) -> list[tuple[list[int], Part | None]]:
        """One (stage, phase) block's segments as the compute tasks the overlap runs: chunked
        GEMM runs, pipelined row GEMMs and reordered dgrad/wgrad halves (see the module
        docstring); other segments unchanged (part None)."""
        by_first = {run[0]: (c_op, run) for c_op, run in self.ring.items()}
        wgrad_after = {last: (c_op, split) for c_op, (last, split, _) in self.bulk.items()}
        dgrad_of = {j: c_op for c_op, (_, split, _) in self.bulk.items() for j in split}
        out: list[tuple[list[int], Part | None]] = []
        k = 0
        while k < len(segments):
            seg = segments[k]
            i = seg[0]
            hit = by_first.get(i)
            if hit is not None and len(seg) == 1:
                c_op, run = hit
                n = len(run)
                if [s[0] for s in segments[k:k + n]] == list(run) and all(len(s) == 1 for s in segments[k:k + n]):
                    for step in range(self.splits):
                        out.append((list(run), Part(1.0 / self.splits, ring=c_op, step=step, skip=c_op,
                                                    first=step == 0, last=step == self.splits - 1)))
                    k += n
                    continue
            if len(seg) == 1 and i in self.pipelined:
                for j in range(PIPELINE_SPLITS):
                    out.append((seg, Part(1.0 / PIPELINE_SPLITS, rs=i, chunk=j, first=j == 0,
                                          last=j == PIPELINE_SPLITS - 1)))
                k += 1
                continue
            if len(seg) == 1 and i in dgrad_of:
                out.append((seg, Part(0.5, skip=dgrad_of[i], last=False)))
            else:
                out.append((seg, None))
            if seg[-1] in wgrad_after:
                for j in wgrad_after[seg[-1]][1]:
                    out.append(([j], Part(0.5, first=False)))
            k += 1
        return out


def plan_overlap(trace: Trace, tpp, stage_of: Sequence[int], index: Sequence[int] | None = None) -> TpOverlapPlan:
    """The overlaps of a sequence-parallel Megatron plan ``tpp`` on ``trace`` (see the module
    docstring); ``stage_of``: each op's pipeline stage (a collective and its GEMMs must share
    one); ``index``: the op of ``trace`` each op of the plan's blocks became (activation
    recomputation rewrites the trace; its re-run forward ops keep their plain collectives)."""
    at = (lambda o: o) if index is None else (lambda o: index[o])  # noqa: E731
    columns: set[int] = set()
    rows: set[int] = set()
    row_backward: set[int] = set()
    for blk in tpp.blocks:
        columns.update(at(o) for o in blk.column)
        rows.add(at(blk.row))
        if blk.backward:
            row_backward.add(at(blk.backward[0]))
    ring: dict[int, tuple[int, ...]] = {}
    pipelined: set[int] = set()
    for c in tpp.collectives:
        if c.kind == "all_gather" and not c.redo and c.buffers:
            first = min((j for j in trace.consumers.get(c.buffers[0], ()) if j > c.op), default=None)
            if first is not None and (first in columns or first in row_backward) and stage_of[first] == stage_of[c.op]:
                ring[c.op] = _reading_run(trace, first, c.buffers[0], stage_of)
        elif c.kind == "reduce_scatter" and c.op in rows:
            pipelined.add(c.op)
    bulk: dict[int, tuple[int, tuple[int, ...], int]] = {}
    for blk in tpp.blocks:
        if not blk.backward:
            continue
        run = [at(o) for o in blk.backward]
        lo, last = run[0], run[-1]
        regather = next((c for c in tpp.collectives if c.redo and c.kind == "all_gather" and lo - 1 <= c.op < last),
                        None)
        rs = next((c for c in tpp.collectives if c.kind == "reduce_scatter" and c.op == last), None)
        if regather is None or rs is None or stage_of[regather.op] != stage_of[last]:
            continue
        split = tuple(i for i in run if regather.buffers[0] in trace.reads[i] and regather.op < i < last)
        if split:
            bulk[regather.op] = (last, split, rs.op)
    return TpOverlapPlan(tpp.degree, ring, frozenset(pipelined), bulk)


def add_ring_steps(graph: TaskGraph, platform: Platform, group: Sequence[int], built: Sequence[tuple[int, int]],
                   nbytes: int, after: dict[int, list[int]], label: str, **attrs: Any) -> dict[int, list[int]]:
    """The ``len(group) − 1`` steps of a ring exchange on ``group`` (GPUs in ring order), each a
    send of one ``nbytes`` shard from every rank to the next; ``built``: the (position in the
    group, GPU) of the members built, ``after`` each one's predecessors. Step k + 1 of a rank
    forwards what it received in step k. Returns each built GPU's arriving steps, in order (a
    representative alone: its own sends, which end when the symmetric arriving ones do)."""
    n = len(group)
    prime_routes(platform, ((group[t], group[(t + 1) % n]) for t, _ in built))
    every = len(built) == n
    sent: dict[int, list[int]] = {t: [] for t, _ in built}
    for step in range(1, n):
        for t, gpu in built:
            if step == 1:
                deps = list(after[gpu])
            else:
                deps = [sent[t][-1]]
                if every:  # forward what came from the previous rank
                    deps.append(sent[(t - 1) % n][step - 2])
            nxt = group[(t + 1) % n]
            sent[t].append(graph.add_transfer(platform, gpu, nxt, nbytes, f"{label} step{step} gpu{gpu}->gpu{nxt}",
                                              after=deps, sms=RING_SMS, **attrs))
    if every:
        return {gpu: sent[(t - 1) % n] for t, gpu in built}
    return {gpu: sent[t] for t, gpu in built}


def _reading_run(trace: Trace, start: int, buffer: str, stage_of: Sequence[int]) -> tuple[int, ...]:
    """The consecutive ops from ``start`` that all read ``buffer`` (the GEMMs fed by a gather)."""
    run = []
    i = start
    while i < len(trace.ops) and buffer in trace.reads[i] and stage_of[i] == stage_of[start]:
        run.append(i)
        i += 1
    return tuple(run)


__all__ = ["PIPELINE_SPLITS", "Part", "RING_SMS", "TpOverlapPlan", "USERBUFFER_SMS", "add_ring_steps",
           "plan_overlap"]
