"""When each pipeline rank finishes its last backward block: the block-level pipeline recurrence
of :mod:`triosim.graph.pipeline.estimate` (each GPU runs one stage's ops for one micro-batch as a
block, in the schedule's order; a block waits for the previous block on its GPU and for the
bytes from the neighbouring stage, sent over the boundary's route one micro-batch after another).

It is the task DAG at block granularity, so the bubble comes out as the DAG has it, including
the extra wait that transfers add in the steady state of 1F1B — which no single closed form
captures for every (pp, micro-batches, forward/backward ratio). The block program (which block
waits for which) depends only on (schedule, pp, V, micro-batches) and the boundary routes, so it
is compiled once per such key and then evaluated with each candidate's stage times: a few numpy
operations per level of independent blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..graph.pipeline.estimate import BlockProgram, compile_program
from ..graph.pipeline.schedules import BACKWARD, FORWARD
from ..hardware.platform import Platform, gpu_node
from .combined_pipeline import combined_ends, compile_combined


@dataclass
class PipelineTimer:
    """Compiled block programs of one platform, cached by (schedule, pp, V, micro-batches, which
    boundaries share a route)."""

    platform: Platform
    _programs: dict[tuple, BlockProgram] = field(default_factory=dict, repr=False)
    _routes: dict[tuple[int, int, int], tuple] = field(default_factory=dict, repr=False)
    _ends: dict[tuple, tuple] = field(default_factory=dict, repr=False)
    _apart: dict[tuple, PipelineTimer] = field(default_factory=dict, repr=False)

    def memo(self, key: tuple, compute):
        """``compute()`` once per ``key``: candidates that differ only in what the pipeline does
        not see (the ZeRO stage) share their stage times and rank ends."""
        hit = self._ends.get(key)
        if hit is None:
            hit = self._ends[key] = compute()
        return hit

    def apart(self, key: tuple) -> PipelineTimer:
        """A timer with its own memo (another FP8 recipe's stage times: the memo keys do not name
        the recipe), sharing this one's compiled programs and routes; one per ``key``."""
        hit = self._apart.get(key)
        if hit is None:
            hit = self._apart[key] = PipelineTimer(self.platform, self._programs, self._routes)
        return hit

    def boundaries(self, pp: int, virtual: int, stride: int) -> tuple:
        """Which boundaries share a route (the pattern the block program depends on), each
        boundary's latency and bandwidth per direction (forward, backward; boundary j between
        stages j − 1 and j, j ≥ 1) and its routes, stage GPUs ``stride`` apart."""
        key = (pp, virtual, stride)
        hit = self._routes.get(key)
        if hit is not None:
            return hit
        n = pp * virtual
        gpu_of = [(j % pp) * stride for j in range(n)]  # rank (dp 0, tp 0, stage j mod pp)
        lat, bw = np.zeros((2, n)), np.ones((2, n))
        ids: dict[tuple[str, ...], int] = {}
        pattern = [((), ())]  # which boundaries share a route: all the program depends on
        routes: list[tuple[tuple[str, ...], tuple[str, ...]]] = [((), ())]
        for j in range(1, n):
            a, b = gpu_node(gpu_of[j - 1]), gpu_node(gpu_of[j])
            pair = (self.platform.route(a, b), self.platform.route(b, a))
            routes.append(pair)
            pattern.append(tuple((f"route{ids.setdefault(r, len(ids))}",) if r else () for r in pair))
            for d, route in enumerate(pair):
                if route:
                    lat[d, j] = self.platform.route_time(route, 0.0)
                    bw[d, j] = min(self.platform.link(name)["bandwidth"] for name in route)
        hit = self._routes[key] = (tuple(pattern), lat, bw, tuple(routes))
        return hit

    def _program(self, schedule: str, pp: int, virtual: int, micro: int, tp: int, combined: bool = False,
                 first_apart: bool = False):
        """The compiled recurrence; ``first_apart``: the first micro-batch's blocks with their own
        duration rows (the second size of :func:`~triosim.graph.pipeline.estimate.compile_program`)."""
        pattern, lat, bw, _ = self.boundaries(pp, virtual, tp)
        key = (schedule if virtual == 1 else "interleaved", pp, virtual, micro, pattern, combined, first_apart)
        prog = self._programs.get(key)
        if prog is None:
            sizes = [1] + [0] * (micro - 1) if first_apart else [0] * micro
            prog = self._programs[key] = compile_combined(pp, virtual, micro, list(pattern)) if combined else \
                compile_program(key[0], pp, virtual, sizes, list(pattern))
        return prog, lat, bw

    def rank_ends(self, schedule: str, pp: int, virtual: int, micro: int, tp: int, forward: np.ndarray,
                  backward: np.ndarray, cut_fwd: np.ndarray, cut_bwd: np.ndarray,
                  from_free: tuple[np.ndarray, np.ndarray] | None = None,
                  held: tuple[np.ndarray, np.ndarray] | None = None,
                  pairs: Callable[[tuple[str, int], tuple[str, int]], tuple[float, float]] | None = None,
                  slowed: tuple[np.ndarray, np.ndarray] | None = None, blocking: bool = False,
                  stage_ends: bool = False, first: tuple[np.ndarray, np.ndarray] | None = None):
        """Per pipeline rank, when its last block ends; ``forward``/``backward``: seconds of each of
        the pp · V stages per micro-batch; ``cut_fwd``/``cut_bwd``: bytes crossing boundary j
        (between stage j − 1 and j, j ≥ 1; index 0 unused) per micro-batch. ``from_free``: the
        forward and backward seconds counted from when the GPU is free rather than from the
        input's arrival (ZeRO-3's first gather: :mod:`triosim.plan.zero3_time`); a block then
        ends at max(GPU free + those, input + ``forward``/``backward``). ``held``: the forward and
        backward seconds each block holds its GPU after it ends without holding back its send
        (activation offload's copy at a chunk's end: :mod:`triosim.plan.offload_profile`); the
        GPU's next block starts after them. ``pairs`` (``--moe-a2a-overlap``: Megatron-Core's
        combined 1F1B, :mod:`triosim.plan.combined_time`): the seconds a pair of blocks takes
        started together, (first block's (phase, stage), second's) -> (when each one's chain
        ends); one stage pairs each backward with the next forward, the
        interleaved schedule each steady-state forward with the backward after it. ``slowed``:
        the forward and backward transfers' seconds beyond their time alone, per boundary as
        ``cut_fwd``/``cut_bwd`` (sharing links with TP collectives:
        :func:`~triosim.plan.pipeline_sends.beside_sends`). ``blocking`` (``--pipeline-send
        blocking``, Megatron's batched send/receive): a block's GPU goes on only once the block's
        transfer to another GPU has arrived; the wait for the receiver to post its receive is
        left out, as the stages of a balanced pipeline post theirs in step. ``stage_ends``: return
        (the ranks' ends, per stage when its last backward block ends) instead, the latter None
        for one stage and for the combined schedule (where its gradients are complete: the
        interleaved schedule's model chunks finish their backward at different times). ``first``:
        the first micro-batch's forward seconds per stage, from the input's arrival and from the
        GPU free (``--overlap-param-gather``'s gathers: :mod:`triosim.plan.param_gather_time`);
        not with ``pairs``."""
        n = pp * virtual
        if n == 1:
            f, b = (forward, backward) if from_free is None else from_free
            hf, hb = (0.0, 0.0) if held is None else (float(held[0][0]), float(held[1][0]))
            if pairs is not None and micro > 1:  # F0, then (B_i, F_i+1) pairs, then the last B
                both = max(pairs((BACKWARD, 0), (FORWARD, 0)))
                out = np.array([float(f[0]) + (micro - 1) * both + float(b[0])])
            else:
                out = np.array([micro * (float(f[0]) + float(b[0]) + hf + hb)])
                if first is not None:  # the first forward block, from the start (the GPU free and the input)
                    out += max(float(first[0][0]), float(first[1][0])) - float(f[0])
            return (out, None) if stage_ends else out
        combined = pairs is not None and virtual > 1
        apart = first is not None and not combined and micro > 1
        prog, lat, bw = self._program(schedule, pp, virtual, micro, tp, combined, apart)
        if not prog.runnable:
            return (np.full(pp, np.inf), None) if stage_ends else np.full(pp, np.inf)
        durations = np.concatenate((forward, backward))  # rows (phase, stage), forward first
        transfers = np.zeros(2 * n + 1)  # rows (direction, boundary), then the zero row
        for d, cut in ((0, cut_fwd), (1, cut_bwd)):
            transfers[d * n + 1: d * n + n] = lat[d, 1:] + cut[1:] / bw[d, 1:]
            if slowed is not None:
                transfers[d * n + 1: d * n + n] += slowed[d][1:]
        if combined:
            together = np.array([pairs(*key) for key in prog.pairs]).reshape(len(prog.pairs), 2)
            out = combined_ends(prog, durations, transfers, together)
            return (out, None) if stage_ends else out
        nb = prog.num_blocks
        free_rows = None if from_free is None else np.concatenate(from_free)
        held_rows = None if held is None else np.concatenate(held)
        if first is not None:
            # the first micro-batch's rows (size 1): its forward blocks' own, the backward's as the rest
            if not apart:  # one micro-batch: every block is the first's
                durations[:n] = first[0]
                free_rows = np.concatenate((first[1], backward if from_free is None else from_free[1]))
            else:
                free_rows = durations if free_rows is None else free_rows
                durations = np.concatenate((durations, first[0], backward))
                free_rows = np.concatenate((free_rows, first[1], free_rows[n:]))
                transfers = np.concatenate((transfers[:-1], transfers[:-1], [0.0]))
                if held_rows is not None:
                    held_rows = np.concatenate((held_rows, held_rows))
        dur = durations[prog.duration_row]
        dur_free = None if free_rows is None else free_rows[prog.duration_row]
        sent = transfers[prog.transfer_row]
        times = np.zeros(2 * nb + 1)
        after = np.zeros(2 * nb + 1)  # per block row, the seconds its GPU stays held after it ends
        if held_rows is not None:
            after[:nb] = held_rows[prog.duration_row]
        if blocking:  # the block's own transfer (the spare zero row where it sends over no route)
            after[:nb] += sent
        hold = held is not None or blocking
        for lv in prog.levels:
            a, b = lv.start, lv.end
            free = times[lv.wait_gpu] + after[lv.wait_gpu] if hold else times[lv.wait_gpu]
            if dur_free is None:
                times[a:b] = np.maximum(free, times[lv.wait_data]) + dur[a:b]
            else:
                times[a:b] = np.maximum(free + dur_free[a:b], times[lv.wait_data] + dur[a:b])
            if lv.sends:
                e = a + lv.sends
                times[nb + a: nb + e] = np.maximum(times[lv.wait_route], times[a:e]) + sent[a:e]
        out = times[prog.last] + after[prog.last]
        return (out, times[prog.last_backward]) if stage_ends else out


__all__ = ["PipelineTimer"]
