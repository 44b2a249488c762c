"""Batched pipeline estimates: the block-level recurrence of
:func:`triosim.graph.pipeline.recurrence.estimate_partition` for many partitions at once.

The recurrence's *structure* (which block waits for which, in what order each GPU runs its
blocks, which route each transfer takes) depends only on the schedule, the layout and the
number of micro-batches, not on where the cuts are. :class:`BlockProgram` works it out once and
groups the blocks into *levels*: a block's level is one more than that of every block it waits
for (the block before it on its GPU, the block whose transfer it needs), so the blocks of one
level are independent and run on distinct GPUs and routes. :class:`BatchEstimator` then runs
the recurrence for C partitions side by side, one numpy step per level over arrays of C
columns: a few hundred array operations instead of a Python loop over every block of every
partition.

The figures are the reference recurrence's to the last bit: every time is the same sequence of
IEEE additions and maxima (a transfer on a route only ever follows the previous transfer on
that route from the same GPU, so processing order cannot change it), and stage sums are taken
with Python's ``sum`` over the same slices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...hardware.platform import Platform, gpu_node
from .cuts import min_max_bound
from .schedules import BACKWARD, FORWARD, Layout, schedule_blocks
from .stage_costs import StageCosts


@dataclass(frozen=True)
class Level:
    """One level of independent blocks: rows [start, end) of the block arrays, the first
    ``sends`` of them sending over a route. ``wait_gpu``/``wait_data``: per block, the row it
    waits for on its GPU (the block before it) and for its data; ``wait_route``: per sending
    block, the row of the previous transfer on its route (the spare zero row: none)."""

    start: int
    end: int
    sends: int
    wait_gpu: np.ndarray
    wait_data: np.ndarray
    wait_route: np.ndarray


@dataclass(frozen=True)
class BlockProgram:
    """The recurrence's structure for one (schedule, layout, micro-batch count); see the module
    docstring. ``runnable`` is False when the block orders deadlock (every estimate is then
    infinite, as in the reference).

    Times live in one array of 2·B + 1 rows (B blocks, numbered level by level): row b is when
    block b ends, row B + b when its transfer arrives at the neighbouring stage (if it sends
    over a route; a block whose neighbour is on the same GPU is waited for at row b), row 2·B is
    zero. ``duration_row``/``transfer_row``: each block's row in the duration and transfer tables
    (the transfer table's spare last row, zero, for blocks that send nothing over a route);
    ``last``: the row of each GPU's last block; ``last_backward``: per stage, the row of its last
    backward block (the last micro-batch's: where its gradients are complete).
    """

    ranks: int
    num_stages: int
    num_blocks: int
    levels: tuple[Level, ...]
    duration_row: np.ndarray
    transfer_row: np.ndarray
    last: np.ndarray
    runnable: bool
    last_backward: np.ndarray | None = None


def _duration_row(phase: str, size_index: int, stage: int, num_stages: int) -> int:
    """Row of the duration table: rows (size, phase, stage), forward before backward."""
    return size_index * 2 * num_stages + (0 if phase == FORWARD else num_stages) + stage


def _transfer_row(direction: int, boundary: int, size_index: int, num_stages: int) -> int:
    """Row of the transfer table: rows (size, direction, boundary); boundary j is stage j-1 → j."""
    return (size_index * 2 + direction) * num_stages + boundary


def compile_program(schedule: str, ranks: int, virtual: int, size_index: Sequence[int],
                    routes: Sequence[tuple[tuple[str, ...], tuple[str, ...]]]) -> BlockProgram:
    """Walk the block orders once, as the reference recurrence does, recording dependencies.

    ``size_index[r]``: micro-batch r's index among the distinct sizes; ``routes[j]`` (j ≥ 1):
    the forward and backward route of boundary j (``routes[0]`` unused).
    """
    n = ranks * virtual
    num_micro = len(size_index)
    num_sizes = max(size_index, default=-1) + 1
    orders = [schedule_blocks(schedule, ranks, num_micro, p, virtual) for p in range(ranks)]
    walked, runnable = walk_blocks(orders, ranks, virtual, routes, size_index)
    # Per block in processing order: GPU, needed block, duration row, route id (-1: same GPU,
    # -2: sends nothing), transfer row.
    blocks: list[tuple[int, int, int, int, int]] = []
    level: list[int] = []
    prev_on_gpu: list[int] = []
    last_on_gpu = [-1] * ranks
    last_backward = [-1] * n
    for w in walked:
        b, p = len(blocks), w.gpu
        if w.phase != FORWARD:
            last_backward[w.stage] = b  # a stage's blocks are met in its GPU's order
        blocks.append((p, w.need, _duration_row(w.phase, size_index[w.micro], w.stage, n), w.route, w.transfer_row))
        lv = 0
        if last_on_gpu[p] >= 0:
            lv = level[last_on_gpu[p]] + 1
        if w.need >= 0:
            lv = max(lv, level[w.need] + 1)
        level.append(lv)
        prev_on_gpu.append(last_on_gpu[p])
        last_on_gpu[p] = b
    nb = len(blocks)
    zero = 2 * nb

    def done_row(rows: dict[int, int], b: int) -> int:
        return zero if b < 0 else rows[b]

    order, new, runs = block_levels(blocks, level, prev_on_gpu, done_row)
    levels = [Level(**fields) for _, fields in runs]
    spare_transfer = num_sizes * 2 * n
    return BlockProgram(
        ranks, n, nb, tuple(levels),
        duration_row=np.array([blocks[b][2] for b in order], dtype=np.intp),
        transfer_row=np.array([blocks[b][4] if blocks[b][3] >= 0 else spare_transfer for b in order], dtype=np.intp),
        last=np.array([done_row(new, b) for b in last_on_gpu], dtype=np.intp),
        runnable=runnable,
        last_backward=np.array([done_row(new, b) for b in last_backward], dtype=np.intp),
    )


@dataclass(frozen=True)
class WalkedBlock:
    """One block as :func:`walk_blocks` meets it: its GPU and position in that GPU's order, its
    phase, micro-batch and stage, the block whose data it needs (-1: none), the route id its
    transfer takes (-1: the neighbour is on the same GPU, -2: it sends nothing) and that
    transfer's row in the transfer table (-1: none)."""

    gpu: int
    position: int
    phase: str
    micro: int
    stage: int
    need: int
    route: int
    transfer_row: int


def walk_blocks(orders: Sequence[Sequence[tuple[str, int, int]]], ranks: int, virtual: int,
                routes: Sequence[tuple[tuple[str, ...], tuple[str, ...]]],
                size_index: Sequence[int]) -> tuple[list[WalkedBlock], bool]:
    """Every GPU's blocks (``orders[p]``: (phase, micro-batch, virtual stage)) in the order the
    reference recurrence processes them: a GPU goes on until a block needs data not yet sent.
    Returns them and whether every block ran (False: the orders deadlock)."""
    n = ranks * virtual
    route_id: dict[tuple[str, ...], int] = {}  # one link-free clock per distinct route, as the reference

    def rid(route: tuple[str, ...]) -> int:
        return route_id.setdefault(route, len(route_id)) if route else -1

    out: list[WalkedBlock] = []
    producer: dict[tuple[str, int, int], int] = {}  # (phase, stage, mb) -> block that sends its data
    done_forward: set[tuple[int, int]] = set()
    pos = [0] * ranks
    progress = True
    while progress:
        progress = False
        for p in range(ranks):
            while pos[p] < len(orders[p]):
                ph, r, v = orders[p][pos[p]]
                s = v * ranks + p
                if ph == FORWARD:
                    need = None if s == 0 else (FORWARD, s, r)
                else:
                    need = None if s == n - 1 else (BACKWARD, s, r)
                if need is not None and need not in producer:
                    break
                if ph == BACKWARD and s == n - 1 and (s, r) not in done_forward:
                    break
                b = len(out)
                route, row = -2, -1
                if ph == FORWARD:
                    done_forward.add((s, r))
                    if s < n - 1:
                        route = rid(routes[s + 1][0])
                        row = _transfer_row(0, s + 1, size_index[r], n)
                        producer[(FORWARD, s + 1, r)] = b
                elif s > 0:
                    route = rid(routes[s][1])
                    row = _transfer_row(1, s, size_index[r], n)
                    producer[(BACKWARD, s - 1, r)] = b
                out.append(WalkedBlock(p, pos[p], ph, r, s, producer[need] if need is not None else -1, route, row))
                pos[p] += 1
                progress = True
    return out, all(pos[p] == len(orders[p]) for p in range(ranks))


def block_levels(blocks: Sequence[tuple], level: Sequence[int], prev: Sequence[int],
                 done_row: Callable[[dict[int, int], int], int]) -> tuple[list[int], dict[int, int], list[tuple]]:
    """The blocks (``blocks[b]``: GPU, needed block, duration row, route id, transfer row, in
    processing order) numbered level by level, those sending over a route first in each level:
    (the order, block -> its row, per level (its blocks, the fields of a :class:`Level`)).
    ``prev[b]``: the block whose end block b waits for on its GPU, as a row by
    ``done_row(rows, prev)``; a transfer waits for the previous one on its route (a route's
    transfers in their sender's program order)."""
    order = sorted(range(len(blocks)), key=lambda b: (level[b], blocks[b][3] < 0, b))
    rows = {b: k for k, b in enumerate(order)}
    nb, zero = len(blocks), 2 * len(blocks)

    def data_row(b: int) -> int:  # where the data of block b's transfer is
        if b < 0:
            return zero
        return rows[b] + nb if blocks[b][3] >= 0 else rows[b]

    last_send: dict[int, int] = {}  # route id -> last block that sent on it
    route_wait = {}
    for b, block in enumerate(blocks):
        r = block[3]
        if r >= 0:
            route_wait[b] = data_row(last_send.get(r, -1))
            last_send[r] = b
    out = []
    k = 0
    while k < nb:
        end = k
        while end < nb and level[order[end]] == level[order[k]]:
            end += 1
        members = order[k:end]
        sends = sum(1 for b in members if blocks[b][3] >= 0)
        out.append((members, dict(
            start=k, end=end, sends=sends,
            wait_gpu=np.array([done_row(rows, prev[b]) for b in members], dtype=np.intp),
            wait_data=np.array([data_row(blocks[b][1]) for b in members], dtype=np.intp),
            wait_route=np.array([route_wait[b] for b in members[:sends]], dtype=np.intp))))
        k = end
    return order, rows, out


@dataclass(frozen=True)
class BatchResult:
    """Per partition: the recurrence's iteration time, the busiest stage (forward + backward at
    the first micro-batch size) and the bytes crossing all cuts."""

    seconds: float
    max_stage_s: float
    crossing_bytes: int


class BatchEstimator:
    """The block-level estimate of many partitions at once (see the module docstring).

    Built once per search from the partitioner's per-position costs; it keeps the sums of the
    stages it has seen, since a search keeps revisiting the same stages.
    """

    def __init__(self, costs: StageCosts, platform: Platform, schedule: str, layout: Layout) -> None:
        self.costs = costs
        n = layout.num_stages
        self.num_stages = n
        self.ranks = layout.ranks
        self.nf = len(costs.optimizer_s)
        distinct = list(dict.fromkeys(costs.sizes))
        self.distinct_sizes = distinct
        size_index = [distinct.index(m) for m in costs.sizes]
        routes: list[tuple[tuple[str, ...], tuple[str, ...]]] = [((), ())]
        for j in range(1, n):
            a, b = gpu_node(layout.gpu_of(j - 1)), gpu_node(layout.gpu_of(j))
            routes.append((platform.route(a, b), platform.route(b, a)))
        self.program = compile_program(schedule, layout.ranks, layout.virtual, size_index, routes)
        # Latency and bandwidth per boundary and direction, as Platform.route_time adds them.
        self.has_route = tuple(tuple(bool(routes[j][d]) for j in range(n)) for d in (0, 1))
        self.latency = np.zeros((2, n))
        self.bandwidth = np.ones((2, n))
        for j in range(1, n):
            for d in (0, 1):
                route = routes[j][d]
                if route:
                    self.latency[d, j] = platform.route_time(route, 0.0)
                    self.bandwidth[d, j] = min(platform.link(name)["bandwidth"] for name in route)
        self.fractions = [m / costs.batch for m in distinct]
        self.cut_bytes = (np.asarray(costs.cut_forward, dtype=np.float64),
                          np.asarray(costs.cut_backward, dtype=np.float64))
        self._segments: dict[tuple[int, int], tuple[float, ...]] = {}
        self._tightest: tuple[tuple[float, ...], float] | None = None

    def tightest_bound(self, weights: Sequence[float]) -> float:
        """The smallest bound on a stage's weight that the stages can meet (computed once: the
        time split and the optimal search both start from it)."""
        key = tuple(weights)
        if self._tightest is None or self._tightest[0] != key:
            self._tightest = (key, min_max_bound(weights, self.num_stages))
        return self._tightest[1]

    def _segment(self, a: int, b: int) -> tuple[float, ...]:
        """Positions [a, b) as one stage: forward time per distinct size, backward time per
        distinct size, optimizer time, and forward + backward at the first size."""
        c = self.costs
        fw = [sum(c.forward_s[m][a:b]) for m in self.distinct_sizes]
        bw = [sum(c.backward_s[m][a:b]) for m in self.distinct_sizes]
        hit = self._segments[(a, b)] = (*fw, *bw, sum(c.optimizer_s[a:b]), fw[0] + bw[0])
        return hit

    def estimate(self, partitions: Sequence[Sequence[int]]) -> list[BatchResult]:
        """The recurrence's figures for each partition (stage starts), in order."""
        if not partitions:
            return []
        prog, n, ranks = self.program, self.num_stages, self.ranks
        nsz = len(self.distinct_sizes)
        count = len(partitions)
        columns: list[tuple[float, ...]] = []  # per partition: the duration table's column
        opts: list[list[float]] = []  # per partition: each GPU's optimizer time
        busiest: list[float] = []
        crossing: list[int] = []
        cut_f, cut_b = self.costs.cut_forward, self.costs.cut_backward
        known = self._segments
        for starts in partitions:
            ends = (*starts[1:], self.nf)
            # Per field (forward/backward per size, optimizer, first-size total), per stage.
            fields = list(zip(*[known.get(key) or self._segment(*key) for key in zip(starts, ends)]))
            column: tuple[float, ...] = ()
            for z in range(nsz):
                column += fields[z] + fields[nsz + z]
            columns.append(column)
            col_opt = [0.0] * ranks
            for s, op in enumerate(fields[2 * nsz]):
                col_opt[s % ranks] += op
            opts.append(col_opt)
            busiest.append(max(fields[2 * nsz + 1]))
            crossing.append(sum(cut_f[k - 1] + cut_b[k - 1] for k in starts[1:]))
        durations = np.array(columns).T
        opt = np.array(opts).T
        if not prog.runnable:
            return [BatchResult(math.inf, busiest[c], crossing[c]) for c in range(count)]
        # Transfer table: rows (size, direction, boundary) and a zero row; one column per partition.
        transfers = np.zeros((nsz * 2 * n + 1, count))
        if n > 1:
            cuts = np.asarray([list(s[1:]) for s in partitions], dtype=np.intp).T - 1  # (n-1, C)
            for d in (0, 1):
                nbytes = self.cut_bytes[d][cuts]
                lat = self.latency[d, 1:, None]
                bw = self.bandwidth[d, 1:, None]
                for z, frac in enumerate(self.fractions):
                    row = (z * 2 + d) * n
                    transfers[row + 1 : row + n] = lat + (nbytes * frac) / bw
        nb = prog.num_blocks
        dur = durations[prog.duration_row]
        sent = transfers[prog.transfer_row]
        times = np.zeros((2 * nb + 1, count))
        for lv in prog.levels:
            a, b = lv.start, lv.end
            np.add(np.maximum(times[lv.wait_gpu], times[lv.wait_data]), dur[a:b], out=times[a:b])
            if lv.sends:
                e = a + lv.sends
                np.add(np.maximum(times[lv.wait_route], times[a:e]), sent[a:e], out=times[nb + a : nb + e])
        seconds = (times[prog.last] + opt).max(axis=0)
        return [BatchResult(float(seconds[c]), busiest[c], crossing[c]) for c in range(count)]
