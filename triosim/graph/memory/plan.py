"""GPU memory: residency, prefetch from remote memory, eviction and write-back, peak usage.

A GPU's compute stream runs its steps in program order, so memory can be planned statically
along that order. For each step the buffers it reads must be resident and the
buffers it writes get allocated. A buffer that sits in remote memory is fetched by a ``memcpy``
task that starts as early as there is room for it (overlapping compute), and the step waits for
it to arrive. When a step's working set does not fit, resident buffers not needed by the step
are evicted, the one needed farthest in the future first (Belady); a dirty one is written back
first and re-fetched at its next use. A step whose own buffers exceed the capacity is an
out-of-memory error. Buffers die after their last use unless they are persistent (parameters,
optimizer state).

Occupancy is tracked per step (numpy array): ``occ[j]`` is the bytes resident while step ``j``
runs, which is the peak reported for the GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, repeat
from typing import NamedTuple

import numpy as np

from ...errors import OutOfMemoryError
from ...hardware.platform import REMOTE, Platform, gpu_node
from ...schedule.tasks import TaskGraph


class Step(NamedTuple):
    """One task of a GPU's program and the buffers it touches (a named tuple: a program of a
    200k-op trace makes as many, and a tuple is made several times faster than a dataclass)."""

    task: int
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    label: str = ""


@dataclass
class MemoryReport:
    """What the planner did on one GPU."""

    device: int
    peak_bytes: int = 0
    fetched_bytes: int = 0
    written_back_bytes: int = 0
    evictions: int = 0
    fetch_tasks: list[int] = field(default_factory=list)
    # Bytes resident while each step runs (``step_bytes[j]`` during task ``step_tasks[j]``): the
    # timeline's memory counter (a sequence read on demand: graph.step_lists).
    step_tasks: Sequence[int] = ()
    step_bytes: np.ndarray | None = None


def plan_memory(
    graph: TaskGraph,
    platform: Platform,
    device: int,
    steps: Sequence[Step],
    sizes: dict[str, int],
    external: Iterable[str],
    persistent: Iterable[str] = (),
    placement: str = "gpu",
    capacity: int | None = None,
) -> MemoryReport:
    """Add the memcpy tasks (and their edges) that keep ``steps`` fed on ``device``.

    ``external`` buffers exist before the first step: resident (``placement='gpu'``, as many as
    fit, in order of first use) or in remote memory (``'remote'``). Every other buffer is
    allocated by the step that first writes it.
    """
    cap = platform.capacity_bytes if capacity is None else capacity
    n = len(steps)
    report = MemoryReport(device=device)
    if n == 0:
        return report
    gpu = gpu_node(device)
    persistent = set(persistent)

    external = list(dict.fromkeys(external))
    if placement == "gpu":
        # Everything fits at once: nothing is evicted or fetched, so the plan is each buffer's
        # lifetime (externals from the start) and the peak their sum, found in linear time
        # from each buffer's first and last step alone.
        keys = list(chain.from_iterable(chain.from_iterable(map(_touched, steps))))
        step_of = list(chain.from_iterable(map(repeat, range(n), (len(st.reads) + len(st.writes) for st in steps))))
        last_use = dict(zip(keys, step_of))
        if sum(map(sizes.get, last_use, repeat(0))) <= cap:
            first_use = dict(zip(reversed(keys), reversed(step_of)))
            occ = _lifetime_occupancy(last_use, first_use, sizes, set(external), persistent, n)
            report.peak_bytes = int(occ.max())
            report.step_tasks = tuple(st.task for st in steps)
            report.step_bytes = occ
            return report

    uses: dict[str, list[int]] = {}
    for j, st in enumerate(steps):
        for key in (*st.reads, *st.writes):
            lst = uses.get(key)
            if lst is None:
                uses[key] = [j]
            elif lst[-1] != j:
                lst.append(j)

    def end_of_life(key: str) -> int:
        return n - 1 if key in persistent else uses[key][-1]

    def next_use(key: str, after: int) -> int:
        lst = uses[key]
        lo, hi = 0, len(lst)
        while lo < hi:
            mid = (lo + hi) // 2
            if lst[mid] <= after:
                lo = mid + 1
            else:
                hi = mid
        return lst[lo] if lo < len(lst) else n

    occ = np.zeros(n, dtype=np.int64)
    resident: dict[str, tuple[int, int]] = {}  # key -> (first step resident, last step resident)
    in_remote: dict[str, int | None] = {}  # key -> write-back task that put it there (None: always)
    dirty: set[str] = set()
    writebacks_at: dict[int, list[int]] = {}
    writeback_step: dict[int, int] = {}  # write-back task -> the step whose room it made

    external = [k for k in external if k in uses and sizes.get(k, 0) > 0]
    # Steady state: an external buffer stays resident if it fits beside the activations the
    # step will produce; the rest waits in remote memory.
    probe = np.zeros(n, dtype=np.int64)
    if placement == "gpu":
        ext = set(external)
        for key, lst in uses.items():
            if key not in ext and sizes.get(key, 0) > 0:
                probe[lst[0] : end_of_life(key) + 1] += sizes[key]
    for key in external:
        size = sizes[key]
        last = end_of_life(key)
        if placement == "gpu" and int(probe[: last + 1].max()) + size <= cap:
            probe[: last + 1] += size
            occ[: last + 1] += size
            resident[key] = (0, last)
            dirty.add(key)  # no copy in remote memory: evicting it costs a write-back
        else:
            in_remote[key] = None

    for j, st in enumerate(steps):
        needed = [k for k in dict.fromkeys((*st.reads, *st.writes)) if sizes.get(k, 0) > 0]
        need_bytes = sum(sizes[k] for k in needed)
        if need_bytes > cap:
            raise OutOfMemoryError(
                f"out of memory on GPU {device}: {st.label or f'step {j}'} needs "
                f"{need_bytes:,} bytes for its inputs and outputs, capacity is {cap:,} bytes"
            )
        needed_set = set(needed)
        step_waits: list[int] = []
        for key in needed:
            if key in resident:
                continue
            size = sizes[key]
            last = end_of_life(key)
            fetch = key in in_remote and key in st.reads
            # Make room at step j if even that is too late.
            while int(occ[j]) + size > cap:
                victim = _farthest_victim(resident, needed_set, j, next_use)
                if victim is None:  # cannot happen when need_bytes <= cap
                    raise OutOfMemoryError(f"out of memory on GPU {device} at {st.label}")
                first, vlast = resident.pop(victim)
                occ[j : vlast + 1] -= sizes[victim]
                report.evictions += 1
                if victim in dirty:
                    last_use = max((u for u in uses[victim] if u < j), default=None)
                    after = [steps[last_use].task] if last_use is not None else []
                    wb = graph.add_route_task(
                        platform, "memcpy", gpu, REMOTE, sizes[victim], f"evict {victim} gpu{device}",
                        (device,), after=after, buffer=victim, direction="writeback",
                    )
                    report.written_back_bytes += sizes[victim]
                    writebacks_at.setdefault(j, []).append(wb)
                    writeback_step[wb] = j
                    in_remote[victim] = wb
                    dirty.discard(victim)
                else:
                    in_remote.setdefault(victim, None)
            if not fetch:
                occ[j : last + 1] += size
                resident[key] = (j, last)
                dirty.add(key)
                step_waits.extend(writebacks_at.get(j, ()))
                continue
            # Earliest step boundary from which the buffer fits until it is needed.
            wb_own = in_remote[key]
            lo = 0 if wb_own is None else writeback_step[wb_own]
            window = occ[lo : j + 1] + size > cap
            b = lo if not window.any() else lo + int(np.flatnonzero(window)[-1]) + 1
            after = [steps[b - 1].task] if b > 0 else []
            after.extend(writebacks_at.get(b, ()))
            if wb_own is not None:
                after.append(wb_own)
            ft = graph.add_route_task(
                platform, "memcpy", REMOTE, gpu, size, f"fetch {key} gpu{device}", (device,),
                after=after, buffer=key, direction="fetch",
            )
            report.fetch_tasks.append(ft)
            report.fetched_bytes += size
            occ[b : last + 1] += size
            resident[key] = (b, last)
            step_waits.append(ft)
        for key in st.writes:
            if key in resident:
                dirty.add(key)
        for w in dict.fromkeys(step_waits):
            graph.add_edge(w, st.task)
        # Buffers whose life ends here are freed (occupancy already stops at their last step).
        for key in needed:
            if key in resident and resident[key][1] == j:
                del resident[key]
    report.peak_bytes = int(occ.max())
    report.step_tasks = tuple(st.task for st in steps)
    report.step_bytes = occ
    return report


def _touched(st: Step) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return st.reads, st.writes


def _lifetime_occupancy(last_use: dict[str, int], first_use: dict[str, int], sizes: dict[str, int],
                        external: set[str], persistent: set[str], n: int) -> np.ndarray:
    """Bytes resident at each step when every buffer stays from its first use (step 0 for
    external ones) to its last (the last step for persistent ones): a difference array
    instead of one slice update per buffer."""
    keys = list(last_use)
    size = np.fromiter(map(sizes.get, keys, repeat(0)), dtype=np.int64, count=len(keys))
    first = np.fromiter(map(first_use.__getitem__, keys), dtype=np.int64, count=len(keys))
    first[np.fromiter(map(external.__contains__, keys), dtype=bool, count=len(keys))] = 0
    end = np.fromiter(last_use.values(), dtype=np.int64, count=len(keys)) + 1
    end[np.fromiter(map(persistent.__contains__, keys), dtype=bool, count=len(keys))] = n
    live = size > 0
    return lifetime_occupancy(first[live], end[live], size[live], n)


def lifetime_occupancy(first: np.ndarray, end: np.ndarray, size: np.ndarray, n: int) -> np.ndarray:
    """Bytes resident at each of ``n`` steps when buffer ``i`` of ``size[i]`` bytes is resident
    from step ``first[i]`` up to (not including) step ``end[i]``."""
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, first, size)
    np.subtract.at(delta, end, size)
    return np.cumsum(delta[:n])


def _farthest_victim(resident: dict[str, tuple[int, int]], keep: set[str], j: int, next_use) -> str | None:
    best, best_next = None, -1
    for key, (first, last) in resident.items():
        if key in keep or first > j or last < j:
            continue
        nu = next_use(key, j)
        # Farthest next use first; ties by key for determinism.
        if nu > best_next or (nu == best_next and best is not None and key < best):
            best, best_next = key, nu
    return best


def plan_replicas(
    graph: TaskGraph,
    platform: Platform,
    devices: Sequence[int],
    make_steps: Callable[[int], Sequence[Step]],
    sizes: dict[str, int],
    external: Iterable[str],
    persistent: Iterable[str] = (),
    placement: str = "gpu",
) -> list[MemoryReport]:
    """Plan GPUs that run the same program (data-parallel replicas, tensor-parallel peers).

    The plan depends only on the program and the capacity, so when the first GPU's plan needs
    no memcpy tasks every other GPU's is the same and is copied instead of recomputed — the
    difference between seconds and minutes at 1,024 GPUs. Otherwise each GPU is planned.
    """
    external = list(external)
    persistent = set(persistent)
    reports: list[MemoryReport] = []
    for g in devices:
        if reports and not reports[0].fetch_tasks and reports[0].evictions == 0:
            reports.append(replace(reports[0], device=g, fetch_tasks=[],
                                   step_tasks=tuple(st.task for st in make_steps(g))))
            continue
        reports.append(plan_memory(graph, platform, g, make_steps(g), sizes, external, persistent, placement))
    return reports
