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

Each GEMM's method and SMs are Transformer Engine's defaults unless a userbuffer table
(``--tp-comm-overlap-cfg``, :mod:`triosim.graph.tensor.userbuffers`) says otherwise; a table may
also reduce-scatter a row GEMM by **ring exchange**: the GEMM in ``tp`` chunks, each chunk's partial
output sent to the rank that owns it while the next chunk runs (the last chunk is the rank's own),
then one memory-bound kernel sums the ``tp`` partial chunks. A GEMM whose setting keeps an SM
margin runs on the GPU's SMs less the communication's for its whole run (its pieces take
``N / (N - num_sm)`` of their time) and its collective takes no SMs beside it.

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
from .userbuffers import DEFAULT_TABLE, UserbufferSetting, UserbufferTable

# Transformer Engine's defaults (graph.tensor.userbuffers): the pipelined reduce-scatter splits
# its GEMM in 4; a ring-exchange step takes 1 SM (the copy engines move the data).
PIPELINE_SPLITS = DEFAULT_TABLE["proj_fprop"].num_splits
RING_SMS = DEFAULT_TABLE["qkv_fprop"].num_sm


@dataclass(frozen=True)
class Part:
    """A piece of one or more ops run as its own compute task (``frac`` of their time)."""

    frac: float
    ring: int | None = None  # the all-gather (by the op it follows) whose ring step this waits for
    step: int = 0  # that step (0: the rank's own shard, no wait)
    skip: int | None = None  # a collective (by its op) this piece does not wait for
    rs: int | None = None  # pipelined reduce-scatter: the op whose chunk follows this piece
    rsring: int | None = None  # ring-exchange reduce-scatter: the op whose chunk this piece computes
    chunk: int = 0
    splits: int = 1  # the chunks of its GEMM (rs, rsring)
    first: bool = True  # its ops' first piece (their memory step)
    last: bool = True  # their last piece (what later steps look up)
    margin: int = 0  # SMs the GEMM leaves to its communication for its whole run


@dataclass(frozen=True)
class TpOverlapPlan:
    """Which TP collectives run beside which GEMMs, and each one's userbuffer setting.
    Collectives are named by the op they follow."""

    splits: int  # ring-exchange chunks (the TP degree)
    ring: dict[int, tuple[int, ...]]  # all-gather -> the run of ops chunked against it
    pipelined: frozenset[int]  # row linears whose reduce-scatter is pipelined
    bulk: dict[int, tuple[int, tuple[int, ...], int]]  # re-gather -> (its block's last backward op,
    # the column linears' backward ops split in dgrad and wgrad halves, the input-gradient reduce-scatter op)
    ring_rs: frozenset[int] = frozenset()  # row linears whose reduce-scatter runs by ring exchange
    # each overlap's setting, by ("ag", its all-gather's op), ("rs", its row linear), ("regather", the
    # bulk re-gather's op) or ("wgrad", the bulk reduce-scatter's op); None: TE's defaults
    setting: dict[tuple[str, int], UserbufferSetting] | None = None

    def setting_of(self, role: str, op: int, name: str) -> UserbufferSetting:
        """The setting of overlap (``role``, ``op``); TE's default for GEMM ``name`` if none."""
        got = self.setting.get((role, op)) if self.setting else None
        return got if got is not None else DEFAULT_TABLE[name]

    @property
    def cut_ops(self) -> set[int]:
        """Ops that must be tasks of their own (never fused with neighbours)."""
        out = set(self.pipelined) | set(self.ring_rs)
        for run in self.ring.values():
            out.update(run)
        for last, split, _ in self.bulk.values():
            out.update(split)
            out.add(last)
        return out

    def sms(self, c_op: int, kind: str, redo: bool) -> int | None:
        """The SMs a TP collective's kernels take beside a GEMM (TE's), or None for NCCL's."""
        if c_op in self.ring and kind == "all_gather" and not redo:
            return self.setting_of("ag", c_op, "qkv_fprop").comm_sms()
        if kind == "reduce_scatter" and (c_op in self.pipelined or c_op in self.ring_rs):
            return self.setting_of("rs", c_op, "proj_fprop").comm_sms()
        if redo and c_op in self.bulk:
            return self.setting_of("regather", c_op, "qkv_dgrad").comm_sms()
        if kind == "reduce_scatter" and any(rs == c_op for _, _, rs in self.bulk.values()):
            return self.setting_of("wgrad", c_op, "qkv_wgrad").comm_sms()
        return None

    def pieces(self, segments: list[list[int]]) -> list[tuple[list[int], Part | None]]:
        """One (stage, phase) block's segments as the compute tasks the overlap runs: chunked
        GEMM runs, pipelined row GEMMs and reordered dgrad/wgrad halves (see the module
        docstring); other segments unchanged (part None)."""
        by_first = {run[0]: (c_op, run) for c_op, run in self.ring.items()}
        wgrad_after = {last: (c_op, split, rs) for c_op, (last, split, rs) in self.bulk.items()}
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
                    margin = self.setting_of("ag", c_op, "qkv_fprop").margin()
                    for step in range(self.splits):
                        out.append((list(run), Part(1.0 / self.splits, ring=c_op, step=step, skip=c_op,
                                                    first=step == 0, last=step == self.splits - 1, margin=margin)))
                    k += n
                    continue
            if len(seg) == 1 and (i in self.pipelined or i in self.ring_rs):
                ub = self.setting_of("rs", i, "proj_fprop")
                ring = i in self.ring_rs
                n = self.splits if ring else ub.num_splits
                for j in range(n):
                    out.append((seg, Part(1.0 / n, rs=None if ring else i, rsring=i if ring else None, chunk=j,
                                          splits=n, first=j == 0, last=j == n - 1, margin=ub.margin())))
                k += 1
                continue
            if len(seg) == 1 and i in dgrad_of:
                margin = self.setting_of("regather", dgrad_of[i], "qkv_dgrad").margin()
                out.append((seg, Part(0.5, skip=dgrad_of[i], last=False, margin=margin)))
            else:
                out.append((seg, None))
            if seg[-1] in wgrad_after:
                _, split, rs = wgrad_after[seg[-1]]
                margin = self.setting_of("wgrad", rs, "qkv_wgrad").margin()
                for j in split:
                    out.append(([j], Part(0.5, first=False, margin=margin)))
            k += 1
        return out


def plan_overlap(trace: Trace, tpp, stage_of: Sequence[int], index: Sequence[int] | None = None,
                 table: UserbufferTable = DEFAULT_TABLE) -> TpOverlapPlan:
    """The overlaps of a sequence-parallel Megatron plan ``tpp`` on ``trace`` (see the module
    docstring); ``stage_of``: each op's pipeline stage (a collective and its GEMMs must share
    one); ``index``: the op of ``trace`` each op of the plan's blocks became (activation
    recomputation rewrites the trace; its re-run forward ops keep their plain collectives);
    ``table``: each GEMM's userbuffer setting (an attention block's linears are TE's ``qkv`` and
    ``proj``, an MLP block's ``fc1`` and ``fc2``)."""
    at = (lambda o: o) if index is None else (lambda o: index[o])  # noqa: E731
    column_of: dict[int, str] = {}  # a column linear -> its block's kind
    row_of: dict[int, str] = {}  # a row linear -> its block's kind
    row_backward_of: dict[int, str] = {}  # a row linear's first backward op -> its block's kind
    for blk in tpp.blocks:
        column_of.update((at(o), blk.kind) for o in blk.column)
        row_of[at(blk.row)] = blk.kind
        if blk.backward:
            row_backward_of[at(blk.backward[0])] = blk.kind
    setting: dict[tuple[str, int], UserbufferSetting] = {}
    ring: dict[int, tuple[int, ...]] = {}
    pipelined: set[int] = set()
    ring_rs: set[int] = set()
    for c in tpp.collectives:
        if c.kind == "all_gather" and not c.redo and c.buffers:
            first = min((j for j in trace.consumers.get(c.buffers[0], ()) if j > c.op), default=None)
            if first is not None and (first in column_of or first in row_backward_of) \
                    and stage_of[first] == stage_of[c.op]:
                ring[c.op] = _reading_run(trace, first, c.buffers[0], stage_of)
                attention = column_of.get(first, row_backward_of.get(first)) == "attention"
                name = ("qkv_fprop" if attention else "fc1_fprop") if first in column_of else \
                    ("proj_dgrad" if attention else "fc2_dgrad")
                setting[("ag", c.op)] = table[name]
        elif c.kind == "reduce_scatter" and c.op in row_of:
            ub = table["proj_fprop" if row_of[c.op] == "attention" else "fc2_fprop"]
            (ring_rs if ub.method == "ring_exchange" else pipelined).add(c.op)
            setting[("rs", c.op)] = ub
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
            prefix = "qkv" if blk.kind == "attention" else "fc1"
            setting[("regather", regather.op)] = table[f"{prefix}_dgrad"]
            setting[("wgrad", rs.op)] = table[f"{prefix}_wgrad"]
    return TpOverlapPlan(tpp.degree, ring, frozenset(pipelined), bulk, frozenset(ring_rs), setting)


def add_ring_steps(graph: TaskGraph, platform: Platform, group: Sequence[int], built: Sequence[tuple[int, int]],
                   nbytes: int, after: dict[int, list[int]], label: str, sms: int = RING_SMS,
                   **attrs: Any) -> dict[int, list[int]]:
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
                                              after=deps, sms=sms, **attrs))
    if every:
        return {gpu: sent[(t - 1) % n] for t, gpu in built}
    return {gpu: sent[t] for t, gpu in built}


def add_chunk_sends(graph: TaskGraph, platform: Platform, group: Sequence[int], built: Sequence[tuple[int, int]],
                    nbytes: int, chunk: int, after: dict[int, list[int]], label: str, sms: int,
                    **attrs: Any) -> dict[int, int]:
    """Ring-exchange reduce-scatter: each built rank's send of its partial chunk ``chunk`` (of
    ``len(group) − 1`` sent; the last chunk is the rank's own) to the rank that owns it, the
    ``chunk + 1``-th after it in ``group``; ``built``: the (position in the group, GPU) of the
    members built, ``after`` each one's predecessors (its chunk's GEMM, its previous send).
    Returns each built GPU's send."""
    n = len(group)
    prime_routes(platform, ((group[t], group[(t + chunk + 1) % n]) for t, _ in built))
    out = {}
    for t, gpu in built:
        dest = group[(t + chunk + 1) % n]
        out[gpu] = graph.add_transfer(platform, gpu, dest, nbytes, f"{label} send{chunk} gpu{gpu}->gpu{dest}",
                                      after=after[gpu], sms=sms, **attrs)
    return out


def chunk_senders(group: Sequence[int], built: Sequence[tuple[int, int]], sent: dict[int, list[int]]
                  ) -> dict[int, list[int]]:
    """The sends each built rank's sum waits for: every chunk sent to it when the whole group is
    built (chunk k comes from the rank k + 1 before it), else its own sends (a representative's,
    which end when the symmetric arriving ones do)."""
    n = len(group)
    if len(built) < n:
        return {gpu: list(sent[gpu]) for _, gpu in built}
    gpu_at = dict(built)
    return {gpu: [*sent[gpu], *(sent[gpu_at[(t - k - 1) % n]][k] for k in range(n - 1))] for t, gpu in built}


def _reading_run(trace: Trace, start: int, buffer: str, stage_of: Sequence[int]) -> tuple[int, ...]:
    """The consecutive ops from ``start`` that all read ``buffer`` (the GEMMs fed by a gather)."""
    run = []
    i = start
    while i < len(trace.ops) and buffer in trace.reads[i] and stage_of[i] == stage_of[start]:
        run.append(i)
        i += 1
    return tuple(run)


__all__ = ["PIPELINE_SPLITS", "Part", "RING_SMS", "TpOverlapPlan", "add_chunk_sends",
           "add_ring_steps", "chunk_senders", "plan_overlap"]
