"""The planner's profile of a trace with activation offload (``--offload-activations``,
:mod:`triosim.graph.offload`): the trace the simulation rewrites for the candidate's model
chunks, with its offload and reload ops, and the time its host copies add.

The rewrite inserts an ``offload`` op (forward) after the forward of the layer after each
offloaded layer L, and a ``reload`` op (backward) right before that next layer's backward; both
run no compute (their tensor-parallel time scale is 0). The memory follows from the rewritten
trace as for any other (:mod:`triosim.plan.stage_memory`): L's saved activations are freed at
the offload op and re-made by the reload. The copies run on the GPU's host link, beside the
compute, as the DAG builds them (:func:`triosim.graph.offload.add_host_copy`):

- the copy to host starts when L's forward ends and the compute after the offload op waits for
  it: it costs ``max(0, bytes / rate − the next layer's forward)``, charged to the offload op's
  position in the forward block; at a chunk's end (the next layer is the chunk's last) nothing
  after it in the block waits, the send to the next stage neither: the GPU's next block (and its
  first reload) does, so it holds the GPU after the block (:meth:`OffloadProfile.held_after`);
- the copy back starts with the compute before the reload op and L's first backward op reading
  what it brings waits for it: ``max(0, bytes / rate − the backward ops in between)``, charged
  to that op's position in the backward block.

Bytes are one GPU's: the micro-batch's share of each buffer, its tensor-parallel shard. ZeRO-3's
blocks (:mod:`triosim.plan.zero3_time`) do not see the copies: beside its unit gathers they hide
in ways this does not follow (−9 … +16 % off the DAG when charged as above), so a plan does not
offload under ZeRO-3.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..graph.offload import OFFLOAD, Offloaded, OffloadSpec, carry_offload, host_link_rate, offload
from ..trace import Trace
from .profile import ModelProfile, PositionTimes


@dataclass
class OffloadProfile(ModelProfile):
    """A :class:`ModelProfile` of the parent's trace with ``spec``'s offload on the chunks that
    begin at ``cuts`` (forward ops of the parent's trace)."""

    spec: OffloadSpec | None = None
    cuts: frozenset[int] = frozenset()
    rate: float = 0.0  # the GPU's host link, B/s each way
    new_index: tuple[int, ...] = ()  # each op of the parent's trace -> its index in this one
    _offloads: dict[int, Offloaded] = field(default_factory=dict, repr=False)
    _firsts: frozenset[int] | None = field(default=None, repr=False)
    _reload_s: dict[tuple, float] = field(default_factory=dict, repr=False)  # (times key, reload op) -> seconds
    # times key -> per forward position, the seconds a chunk's last offload holds the GPU after the chunk's forward
    _held: dict[tuple, np.ndarray] = field(default_factory=dict, repr=False)
    _exposed: dict[tuple, dict[int, float]] = field(default_factory=dict, repr=False)  # times key -> {waiter: s}

    def scaled(self, batch: int) -> Trace:
        hit = self._scaled.get(batch)
        if hit is None:
            off = self._offloads[batch] = offload(self.parent.scaled(batch), self.spec, self.cuts)
            hit = self._scaled[batch] = off.trace
        return hit

    def tensor_plan(self, batch: int, tp: int, sp: bool):
        key = (batch, tp, sp)
        hit = self._plans.get(key)
        if hit is None:
            self.scaled(batch)
            hit = self._plans[key] = carry_offload(self.parent.tensor_plan(batch, tp, sp), self._offloads[batch])
        return hit

    def op_times(self, batch: int, micro_batch: int, cast_share: float | None = None) -> np.ndarray:
        key = (batch, micro_batch, cast_share)
        hit = self._op_times.get(key)
        if hit is None:  # an inserted op: its row's time, at a time scale of 0
            self.scaled(batch)
            origin = list(self._offloads[batch].origin)
            hit = self._op_times[key] = self.parent.op_times(batch, micro_batch, cast_share)[origin]
        return hit

    def _measure(self, batch: int, tp: int, sp: bool, mb: int, cast_share: float | None) -> PositionTimes:
        pt = super()._measure(batch, tp, sp, mb, cast_share)
        trace, off = self.scaled(batch), self._offloads[batch]
        shard = self.tensor_plan(batch, tp, sp).shard_divisor
        frac = mb / trace.batch_size
        invariant = trace.batch_invariant
        fops = [i for i, ph in enumerate(self.phase) if ph == "F"]
        ends = {self.new_index[j] for j in self.cuts} | {fops[-1] + 1}  # the first op after each chunk
        held = self._held[(batch, tp, sp, mb, cast_share)] = np.zeros(self.positions)
        exposed = self._exposed[(batch, tp, sp, mb, cast_share)] = {}
        for n, copy in off.copies.items():
            nbytes = 0
            for k in copy.buffers:
                b = trace.tensors[k].bytes if k in invariant else int(round(trace.tensors[k].bytes * frac))
                nbytes += -(-b // shard.get(k, 1))
            seconds = nbytes / self.rate
            if copy.direction == OFFLOAD:  # the next layer's forward runs beside it
                beside = float(pt.op_s[copy.start_after + 1:n].sum())
                if n + 1 in ends:  # at a chunk's end the send to the next stage does not wait, the GPU's next block does
                    held[self.pos[n]] += max(0.0, seconds - beside)
                else:
                    pt.fwd[self.pos[n]] += max(0.0, seconds - beside)
            elif n in self._first_reloads:  # from when the GPU is free: free_backward
                self._reload_s[(batch, tp, sp, mb, cast_share, n)] = seconds
            else:  # after the compute before it: the backward ops until the first op needing it
                beside = float(pt.op_s[n + 1:copy.waiter].sum())
                exposed[copy.waiter] = max(0.0, seconds - beside)
                pt.bwd[self.pos[copy.waiter]] += exposed[copy.waiter]
        return pt

    @property
    def _first_reloads(self) -> frozenset[int]:
        """The reload ops that open their chunk's backward block (no backward op of the chunk
        before them): the GPU's previous task is another block's, so the copy starts while the
        block still waits for its input."""
        if self._firsts is None:
            fops = [i for i, ph in enumerate(self.phase) if ph == "F"]
            starts = sorted(fops.index(self.new_index[j]) for j in self.cuts)
            seen, firsts = set(), set()
            for i in (i for i, ph in enumerate(self.phase) if ph == "B" and i in self.pos):
                chunk = sum(1 for s in starts if s <= self.pos[i])
                if chunk not in seen and trace_copy(self, i):
                    firsts.add(i)
                seen.add(chunk)
            self._firsts = frozenset(firsts)
        return self._firsts

    def free_backward(self, pt: PositionTimes, key: tuple, starts: list[int], backward: np.ndarray) -> np.ndarray:
        """Per stage, its backward block's seconds from when the GPU is free (``backward``: from
        its input's arrival): the first reload's copy, then the ops from the first one needing
        it on with what the block's later reloads leave exposed (each waits for the one before it
        on the GPU's host link) (:meth:`~triosim.plan.pipeline_time.PipelineTimer.rank_ends`'s
        ``from_free``)."""
        out = backward.copy()
        bounds = list(zip(starts, [*starts[1:], self.positions]))
        batch = key[0]
        off = self._offloads[batch]
        for n in self._first_reloads:
            j = next(k for k, (a, b) in enumerate(bounds) if a <= self.pos[n] < b)
            a, b = bounds[j]
            waiter = off.copies[n].waiter
            tail = pt.b_ops[(pt.b_pos >= a) & (pt.b_pos < b) & (pt.b_ops >= waiter)]
            # the block's later reloads wait on the same host link: what they leave exposed
            later = sum(x for w, x in self._exposed[key].items() if a <= self.pos[w] < b and w >= waiter)
            out[j] = max(out[j], self._reload_s[(*key, n)] + float(pt.op_s[tail].sum()) + later)
        return out


    def held_after(self, key: tuple, starts: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Per stage, the seconds its forward and backward blocks hold the GPU after they end
        (:meth:`~triosim.plan.pipeline_time.PipelineTimer.rank_ends`'s ``held``): the copy to host
        of the chunk's last offloaded layer, when the chunk's last layer runs beside it. The send
        to the next stage does not wait for it; whatever block the GPU runs next does (a
        forward in the warm-up, a backward in the steady state), and its first reload starts
        after it (the host copies of one GPU run one after another)."""
        prefix = np.concatenate(([0.0], np.cumsum(self._held[key])))
        bounds = zip(starts, [*starts[1:], self.positions])
        return np.array([prefix[b] - prefix[a] for a, b in bounds]), np.zeros(len(starts))


def trace_copy(profile: OffloadProfile, i: int) -> bool:
    """Whether op ``i`` of the rewritten trace is a reload (a copy back from host)."""
    return profile.raw.ops[i].name.startswith("reload::")


def for_offload(profile: ModelProfile, text: str, starts: list[int]) -> tuple[OffloadProfile, list[int]]:
    """``profile`` (without recomputation) with ``--offload-activations text`` on the chunks that
    begin at forward positions ``starts`` (built once per setting and cuts), and those starts in
    its positions (the offload ops are forward positions of their own)."""
    root = profile.parent or profile
    cuts = frozenset(root.fops[s] for s in starts[1:])
    key = ("offload", text, tuple(sorted(cuts)))
    hit = root._children.get(key)
    if hit is None:
        spec = OffloadSpec.parse(text)
        off = offload(root.raw, spec, cuts)
        hit = root._children[key] = OffloadProfile(
            off.trace, root.platform, root.reference_compat, root.precision, recompute=key, parent=root, cp=root.cp,
            experts=root.experts, moe=root.moe, overlaps=root.overlaps, spec=spec, cuts=cuts,
            rate=host_link_rate(root.raw), new_index=off.new_index)
    return hit, [hit.pos[hit.new_index[root.fops[s]]] for s in starts]


__all__ = ["OffloadProfile", "for_offload"]
