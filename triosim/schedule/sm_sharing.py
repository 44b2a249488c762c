"""Streaming multiprocessors shared between a GPU's compute and its communication kernels.

A communication kernel runs on SMs of its own: NCCL launches one CUDA block per channel, and a
block does not share its SM with compute kernels (NCCL's maintainers, NVIDIA/nccl#689); Transformer
Engine's userbuffers kernels take a set number of SMs. While such kernels run on a GPU, a compute
task there progresses at ``1 − S/N`` of its speed, with N the GPU's SMs and S the SMs its active
communication kernels hold (capped at N − 1). A task's ``duration_s`` is its time with every SM.
A collective task holds its SMs on every GPU it names; a transfer on its source GPU (where the
sending kernel runs: each GPU of a ring sends one transfer per step, so every member holds the
SMs once, as the one task of a representative collective does). The sends a GPU posts together
in one round of a direct collective (an all-to-all: one to every peer) are one kernel on the
collective's channels, so together they hold the SMs once, each its integer share; so do a
ring's channels' sends of one step.

The scheduler knows no parallelism: it reads ``graph.meta["sm_count"]`` (the device's SMs; no
sharing without it), ``graph.meta["comm_sms"]`` (the SMs one collective or transfer takes when the
task does not say) and a task's ``sms`` attribute (Transformer Engine's kernels). Memory copies
(the copy engines) take none.
"""

from __future__ import annotations

import heapq

from .tasks import TaskGraph

SM_COUNT_META = "sm_count"
COMM_SMS_META = "comm_sms"
_COMM = frozenset({"transfer", "collective"})


def task_sms(graph: TaskGraph) -> list[int] | None:
    """The SMs each task holds while it runs, or None when nothing shares SMs (no SM count, or
    no task holding any)."""
    sm_count = graph.meta.get(SM_COUNT_META)
    if not sm_count:
        return None
    default = int(graph.meta.get(COMM_SMS_META) or 0)
    out = [0] * len(graph)
    attrs = graph.attr_rows
    for i in graph.tasks_of_kind(*sorted(_COMM)).tolist():
        out[i] = _held(attrs[i], default)
    return out if any(out) else None


def _held(attrs: dict | None, default: int) -> int:
    """The SMs one communication task holds: its own ``sms``, else the collective's
    ``default``; a send that is the k-th of m a GPU posts together (``sm_part`` (k, m): a direct
    collective's round, or the channel k of a ring's m: one kernel on the collective's channels)
    holds its integer share of them, the first ``default mod m`` sends one more, so that the m
    together hold ``default``."""
    if not attrs:
        return default
    if "sms" in attrs:
        return int(attrs["sms"])
    part = attrs.get("sm_part")
    if part is None:
        return default
    k, m = part
    return default // m + (1 if k < default % m else 0)


class SharedStreams:
    """Each GPU's compute stream when SMs are shared: one compute task at a time in the order the
    list scheduler would place them (earliest ready first, then task id), its end moved whenever
    the SMs taken by communication on that GPU change. End events go on the caller's heap as
    ``(time, -1, task)``; an event whose time is no longer the task's end is stale.

    The scheduler's loop runs :meth:`offer` and :meth:`finished` inline on these dicts (a 1T run
    places 10^6 compute tasks): they are the reference of what it does."""

    def __init__(self, graph: TaskGraph, sms: list[int], events: list, start: list[float]) -> None:
        self.sm_count = float(graph.meta[SM_COUNT_META])
        self.sms = sms
        self.events = events
        self.start = start
        self.dur = graph.duration
        self.devices = graph.devices
        self.kind = graph.kind
        self.running: dict[int, int] = {}  # GPU -> task
        self.left: dict[int, float] = {}  # GPU -> the running task's work left (seconds at full speed)
        self.since: dict[int, float] = {}
        self.rate: dict[int, float] = {}
        self.taken: dict[int, int] = {}  # GPU -> SMs held by communication
        self.speed: dict[int, float] = {}  # GPU -> its compute speed now (absent: full speed, 1.0)
        self.queue: dict[int, list[tuple[float, int]]] = {}
        self.due: dict[int, float] = {}  # task -> its current end

    def _speed(self, gpu: int) -> float:
        taken = min(self.taken.get(gpu, 0), self.sm_count - 1)
        return 1.0 - taken / self.sm_count

    def offer(self, task: int, ready: float) -> None:
        """Compute ``task`` is ready at ``ready`` (the current event time)."""
        gpu = self.devices[task][0]
        if gpu in self.running:
            heapq.heappush(self.queue.setdefault(gpu, []), (ready, task))
        else:
            self.begin(task, gpu, ready)

    def begin(self, task: int, gpu: int, t: float) -> None:
        """``task`` starts on ``gpu``'s stream at ``t``."""
        self.start[task] = t
        self.running[gpu] = task
        rate = self.rate[gpu] = self.speed.get(gpu, 1.0)
        self.left[gpu] = self.dur[task]
        self.since[gpu] = t
        end = self.due[task] = t + self.dur[task] / rate
        heapq.heappush(self.events, (end, -1, task))

    def finished(self, task: int, t: float) -> bool:
        """Whether an end event of ``task`` at ``t`` is its end (else stale); if so the GPU
        starts its next queued task."""
        if self.due.get(task) != t:
            return False
        del self.due[task]
        gpu = self.devices[task][0]
        del self.running[gpu]
        queue = self.queue.get(gpu)
        if queue:
            self.begin(heapq.heappop(queue)[1], gpu, t)
        return True

    def change(self, task: int, t: float, sign: int) -> None:
        """Communication ``task`` starts (``sign`` 1) or ends (−1) at ``t``: the GPUs it runs on
        lose or regain its SMs, and their running compute tasks' ends move."""
        sms = self.sms[task]
        if not sms:
            return
        devices = self.devices[task]
        if self.kind[task] == "transfer":
            devices = devices[:1]
        taken, running, speed, n = self.taken, self.running, self.speed, self.sm_count
        for gpu in devices:
            held = taken[gpu] = taken.get(gpu, 0) + sign * sms
            rate = speed[gpu] = 1.0 - (n - 1 if n - 1 < held else held) / n  # _speed(gpu): min(held, n − 1)
            run = running.get(gpu)
            if run is None:
                continue
            left = self.left[gpu] = self.left[gpu] - (t - self.since[gpu]) * self.rate[gpu]
            self.since[gpu] = t
            self.rate[gpu] = rate
            end = self.due[run] = t + max(0.0, left) / rate
            heapq.heappush(self.events, (end, -1, run))


__all__ = ["COMM_SMS_META", "SM_COUNT_META", "SharedStreams", "task_sms"]
