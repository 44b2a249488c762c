"""``--reference-compat`` case 4: a replay of the original TrioSim's pipeline player, recorded as
a task graph.

The original's pipeline parallelism is an event-driven player whose timing comes from how its
events interleave, not from a clean dependency structure, so this module replays those rules
event by event and records every layer execution and every message as a task; the recorded
tasks, each depending on the task whose completion triggered it, scheduled by the list
scheduler, give back the replay's times. The rules (all of them the original's, quirks
included):

- **Split.** Forward-labelled ops by count over GPU 0…N−1, the rest (backward and optimizer ops,
  trace order) by count over GPU N−1…0 (``pipeline_stages.compat_chunks``).
- **Rounds.** R = ⌊batch / micro-batch⌋ rounds. The first round to reach a layer divides that
  layer's time and every tensor size by R, and renames its tensors ``<id>Round<r>``, once for
  all rounds (the layer objects are shared). So later rounds reuse round 0's forward tensors,
  and the backward layers — first reached by round R−1 — do not recognise the forward
  activations and fetch them from remote memory again.
- **Memory and fetches.** A GPU's memory starts empty; a layer's missing inputs (all but
  gradient-category tensors) come from remote memory in one message per layer, one message in
  flight per GPU and round; its inputs and outputs count as present as soon as the fetch is
  *issued*, so compute waits only for the previous fetch to arrive.
- **Compute.** A GPU runs one layer at a time *per round*: rounds are not exclusive on a GPU. A
  round may run one layer while the previous round is still in this GPU's forward chunk (in the
  backward: the next round), then waits for it.
- **Pipeline.** After a GPU's last layer of a chunk, that layer's outputs go to the next chunk's
  GPU (plain ptp bandwidth); the next GPU starts the round when they arrive. GPU 0 starts the
  next round when round r's boundary message arrives at GPU 1. On the last GPU, rounds wait after
  their forward pass until round R−1 has finished its first backward chunk; then all start their
  backward at once (R−1, R−2, … in that order of priority).
- **Network.** Every message is a flow; flows sharing a link split its bandwidth equally, the
  rate being the minimum over the flow's links; no latency.

Under these rules the replay reproduces the original's vgg13 iteration times for one and for
several micro-batches (docs/reference-compat.md). Because rounds and flows overlap on one GPU or
link, such tasks are recorded on extra lanes: ``gpu1.compute~2`` is GPU 1's third concurrent
round, ``gpu0->gpu1~1`` a second flow sharing that link.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import ConfigError
from ...hardware.platform import REMOTE, Platform, gpu_node
from ...schedule.tasks import TaskGraph, compute_resource
from ...trace import Trace
from ..single import op_label
from ..strategy import Strategy
from .stages import candidate_plans, compat_chunks
from .summary import summary

FORWARD, OTHER = "forward", "other"
GRADIENT_CATEGORIES = ("grad_output", "grad")


@dataclass
class _Tensor:
    id: str
    size: int
    gradient: bool


@dataclass
class _Layer:
    index: int  # trace position
    op_id: int
    forward: bool
    seconds: float
    inputs: list[_Tensor]
    outputs: list[_Tensor]
    divided: bool = False


@dataclass
class Recorded:
    """One task of the replay: what ran, when, and the task whose completion started it."""

    kind: str  # compute or transfer or memcpy
    label: str
    start: float
    end: float
    link: str | None  # transfers: the directed link; compute: None
    devices: tuple[int, ...]
    nbytes: int
    cause: int | None
    attrs: dict = field(default_factory=dict)


@dataclass
class _Flow:
    remaining: float
    link: str
    src: str
    dst: str
    tensors: list[_Tensor]
    gpu: int
    purpose: str
    round: int
    task: int


@dataclass
class ReplayResult:
    tasks: list[Recorded]
    peak_bytes: dict[int, int]
    fetched_bytes: dict[int, int]
    rounds: int


class _Player:
    """The original's pipeline player (module docstring), one event at a time."""

    def __init__(self, trace: Trace, n: int, rounds: int, ptp: float, remote_bw: float) -> None:
        self.n, self.rounds = n, rounds
        self.layers = [
            _Layer(op.index, op.op_id, op.stage == FORWARD, op.duration_s,
                   [self._tensor(trace, t) for t in op.inputs], [self._tensor(trace, t) for t in op.outputs])
            for op in trace.ops
        ]
        self.owned: dict[int, set[int]] = {g: set() for g in range(n)}
        self.last_layer: dict[int, int] = {}  # GPU -> op ID of its last layer (backward chunk)
        self.final_forward: dict[int, int] = {}
        self.final_backward: dict[int, int] = {}
        for g, ops in compat_chunks(trace, n):
            ids = [trace.ops[i].op_id for i in ops]
            self.owned[g].update(ids)
            if trace.ops[ops[0]].stage == FORWARD:
                self.final_forward[g] = ids[-1]
            else:
                self.final_backward[g] = ids[-1]
            self.last_layer[g] = ids[-1]
        self.max_forward = max((op.op_id for op in trace.ops if op.stage == FORWARD), default=-1)
        self.bandwidth: dict[str, float] = {}
        for g in range(n):
            self.bandwidth[f"{REMOTE}->{gpu_node(g)}"] = remote_bw
            for h in ((g + 1) % n, (g - 1) % n):
                if h != g:
                    self.bandwidth[f"{gpu_node(g)}->{gpu_node(h)}"] = ptp
        self.memory: dict[int, dict[str, int]] = {g: {} for g in range(n)}
        self.peak = dict.fromkeys(range(n), 0)
        self.fetched = dict.fromkeys(range(n), 0)
        keys = [(g, r) for g in range(n) for r in range(rounds)]
        self.inflight: dict[tuple[int, int], int] = dict.fromkeys(keys, 0)
        self.fetch_at = dict.fromkeys(keys, 0)
        self.compute_at = dict.fromkeys(keys, 0)
        self.busy = dict.fromkeys(keys, False)
        self.backward = [False] * rounds
        self.started_rounds = 0
        self.stalled = False
        self.stalled_rounds: list[tuple[int, int]] = []  # (GPU, round) waiting after the forward
        self.waiting: list[tuple[int, int]] = []  # (GPU, round) waiting for the previous round
        self.events: list[tuple[float, int, str, tuple]] = []
        self.seq = 0
        self.now = 0.0
        self.cause: int | None = None
        self.flows: dict[int, _Flow] = {}
        self.tasks: list[Recorded] = []

    @staticmethod
    def _tensor(trace: Trace, tid: str) -> _Tensor:
        t = trace.tensors[tid]
        return _Tensor(tid, t.bytes, t.category in GRADIENT_CATEGORIES)

    # -- events --------------------------------------------------------------------------------

    def _push(self, when: float, kind: str, payload: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, payload))

    def _play_later(self, g: int, r: int) -> None:
        self._push(self.now, "play", (g, r, self.cause))

    def run(self) -> None:
        self.backward[0] = False
        self._play_later(0, 0)
        while self.events or self.flows:
            rates = self._rates()
            flow_t, flow_id = None, None
            for fid, f in self.flows.items():
                t = self.now + f.remaining / rates[fid]
                if flow_t is None or t < flow_t:
                    flow_t, flow_id = t, fid
            event_t = self.events[0][0] if self.events else None
            take_event = event_t is not None and (flow_t is None or event_t <= flow_t)
            t_next = event_t if take_event else flow_t
            assert t_next is not None
            for fid, f in self.flows.items():
                f.remaining -= rates[fid] * (t_next - self.now)
            self.now = t_next
            if take_event:
                _, _, kind, payload = heapq.heappop(self.events)
                if kind == "play":
                    g, r, self.cause = payload
                    self._fetch(g, r)
                    self._compute(g, r)
                else:
                    g, r, idx, task = payload
                    self.cause = task
                    self._complete(g, r, idx)
            else:
                assert flow_id is not None
                flow = self.flows.pop(flow_id)
                self.tasks[flow.task].end = self.now
                self.cause = flow.task
                self._receive(flow)

    def _rates(self) -> dict[int, float]:
        count: dict[str, int] = {}
        for f in self.flows.values():
            count[f.link] = count.get(f.link, 0) + 1
        return {fid: self.bandwidth[f.link] / count[f.link] for fid, f in self.flows.items()}

    # -- the player's rules --------------------------------------------------------------------

    def _stops_here(self, g: int, idx: int, r: int) -> bool:
        """The layer is not this GPU's, or it starts the GPU's next chunk."""
        layer = self.layers[idx]
        if layer.op_id not in self.owned[g]:
            return True
        prev = self.layers[idx - 1].op_id if idx else 0
        final = self.last_layer[g] if self.backward[r] else self.final_forward.get(g, -1)
        return prev == final and layer.op_id != final

    def _divide(self, idx: int, r: int) -> None:
        layer = self.layers[idx]
        if layer.divided:
            return
        for t in (*layer.inputs, *layer.outputs):
            t.size //= self.rounds
            t.id = f"{t.id}Round{r}"
        layer.seconds /= self.rounds
        layer.divided = True

    def _missing(self, idx: int, g: int) -> list[_Tensor]:
        mem = self.memory[g]
        return [t for t in self.layers[idx].inputs if not t.gradient and t.id not in mem]

    def _hold(self, g: int, tensors: Sequence[_Tensor]) -> None:
        mem = self.memory[g]
        for t in tensors:
            mem[t.id] = t.size
        self.peak[g] = max(self.peak[g], sum(mem.values()))

    def _send(self, src: str, dst: str, tensors: list[_Tensor], g: int, purpose: str, r: int, label: str,
              **attrs) -> None:
        nbytes = sum(t.size for t in tensors)
        link = f"{src}->{dst}"
        kind = "memcpy" if src == REMOTE else "transfer"
        devices = (g,) if src == REMOTE else (int(src[3:]), g)
        self.tasks.append(Recorded(kind, label, self.now, self.now, link, devices, nbytes, self.cause,
                                   {"microbatch": r, **attrs}))
        self.inflight[(g, r)] += 1
        self.flows[len(self.tasks) - 1] = _Flow(float(nbytes), link, src, dst, tensors, g, purpose, r,
                                                len(self.tasks) - 1)
        if nbytes == 0:  # nothing to move: it arrives at once
            self.flows[len(self.tasks) - 1].remaining = 0.0

    def _fetch(self, g: int, r: int) -> None:
        while True:
            key = (g, r)
            if self.inflight[key]:
                return
            idx = self.fetch_at[key]
            if idx >= len(self.layers) or self._stops_here(g, idx, r):
                return
            if idx < self.compute_at[key]:
                self.fetch_at[key] += 1
                self._play_later(g, r)
                return
            if all(t.id in self.memory[g] for t in self.layers[idx].inputs):
                self.fetch_at[key] += 1
                continue
            self._divide(idx, r)
            missing = self._missing(idx, g)
            self._hold(g, missing)
            self._hold(g, self.layers[idx].outputs)
            if not missing:
                self.fetch_at[key] += 1
                self._play_later(g, r)
                return
            self.fetched[g] += sum(t.size for t in missing)
            op = self.layers[idx]
            self._send(REMOTE, gpu_node(g), missing, g, "fetch", r, f"fetch for op {op.op_id} mb{r} gpu{g}",
                       op=op.index)
            return

    def _compute(self, g: int, r: int) -> None:
        key = (g, r)
        if self.busy[key]:
            return
        idx = self.compute_at[key]
        if idx >= len(self.layers) or self._stops_here(g, idx, r):
            return
        self._divide(idx, r)
        if self._missing(idx, g):
            return
        layer = self.layers[idx]
        self.tasks.append(Recorded("compute", "", self.now, self.now + layer.seconds, None, (g,), 0, self.cause,
                                   {"op": layer.index, "microbatch": r, "stage_index": g}))
        self._push(self.now + layer.seconds, "done", (g, r, idx, len(self.tasks) - 1))
        self.busy[key] = True
        self.compute_at[key] += 1

    def _last_done(self, g: int, r: int) -> int:
        return self.layers[self.compute_at[(g, r)] - 1].op_id

    def _complete(self, g: int, r: int, idx: int) -> None:
        layer = self.layers[idx]
        self._hold(g, [*layer.outputs, *layer.inputs])  # gradient inputs included, as the original
        self.busy[(g, r)] = False
        at = self.compute_at[(g, r)]
        next_id = self.layers[at].op_id if at < len(self.layers) else layer.op_id + 1
        final = self.final_backward.get(g, -1) if self.backward[r] else self.final_forward.get(g, -1)
        nxt = g
        if layer.op_id == final and next_id != final:
            if not self.backward[r]:
                if layer.op_id == self.max_forward:
                    self.backward[r] = True
                    if r != self.rounds - 1:
                        # Wait on the last GPU until the last round has done its first backward chunk.
                        self.stalled = True
                        self.stalled_rounds.append((g, r))
                        if self.waiting and r + 1 < self.rounds and self._last_done(g, r) == self.final_forward[g]:
                            self._release(g, r + 1)
                        return
                else:
                    nxt = (g + 1) % self.n
            else:
                nxt = g - 1
                if nxt == -1:
                    self._next_step(g, nxt, r, idx)
                    return
                if r == self.rounds - 1:
                    self.stalled = False
            top = max(self.fetch_at[(g, r)], self.compute_at[(g, r)])
            self.fetch_at[(nxt, r)] = top
            self.compute_at[(nxt, r)] = top
        self._next_step(g, nxt, r, idx)

    def _next_step(self, g: int, nxt: int, r: int, idx: int) -> None:
        # A round may run one layer ahead of the previous one (next one, in the backward) on
        # this GPU; then it waits until that round has left the GPU's chunk.
        other = r + 1 if self.backward[r] else r - 1
        if 0 <= other < self.rounds:
            final = self.final_backward.get(g, -1) if self.backward[r] else self.final_forward.get(g, -1)
            if self._last_done(g, other) < final:
                self.waiting.append((g, r))
                return
        self._pass_on(g, nxt, r, idx)

    def _release(self, g: int, r: int) -> None:
        keep = []
        for w in self.waiting:
            if w == (g, r):
                self._play_later(g, r)
            else:
                keep.append(w)
        self.waiting = keep

    def _pass_on(self, g: int, nxt: int, r: int, idx: int) -> None:
        if nxt == g:
            self._play_later(g, r)
            return
        if self.waiting:
            done = self._last_done(g, r)
            if self.backward[r]:
                if r - 1 >= 0 and done == self.final_backward.get(g, -1):
                    self._release(g, r - 1)
            elif r + 1 < self.rounds and done == self.final_forward.get(g, -1):
                self._release(g, r + 1)
        if nxt == -1:
            return
        if self.stalled_rounds and not self.stalled:
            for sg, sr in self.stalled_rounds:
                self._play_later(sg, sr)
            self.stalled_rounds = []
        purpose = "next-round" if g == 0 and not self.backward[r] and self.started_rounds < self.rounds - 1 else "next"
        layer = self.layers[idx]
        self._send(gpu_node(g), gpu_node(nxt), list(layer.outputs), nxt, purpose, r,
                   f"boundary op {layer.op_id} mb{r} gpu{g}->gpu{nxt}", op=layer.index, stage_index=g, dst_stage=nxt,
                   direction="backward" if self.backward[r] else "forward")

    def _receive(self, flow: _Flow) -> None:
        self.inflight[(flow.gpu, flow.round)] -= 1
        self._hold(flow.gpu, flow.tensors)
        if flow.purpose == "next-round":
            self.started_rounds += 1
            k = self.started_rounds
            self.fetch_at[(0, k)] = 0
            self.compute_at[(0, k)] = 0
            self.backward[k] = False
            self._play_later(0, k)
        self._play_later(flow.gpu, flow.round)


def replay(trace: Trace, num_gpus: int, rounds: int, ptp_bandwidth: float, remote_bandwidth: float) -> ReplayResult:
    """Run the original's pipeline player (module docstring) and return what it did."""
    player = _Player(trace, num_gpus, rounds, ptp_bandwidth, remote_bandwidth)
    player.run()
    return ReplayResult(player.tasks, player.peak, player.fetched, rounds)


def _lanes(tasks: list[Recorded]) -> list[str]:
    """A resource per task such that tasks on one resource never overlap: the GPU's compute
    stream or the link, plus ``~k`` lanes for what the original ran concurrently."""
    lanes: dict[str, list[float]] = {}  # base resource -> end time of each lane
    out = [""] * len(tasks)
    for t in sorted(range(len(tasks)), key=lambda k: (tasks[k].start, k)):
        rec = tasks[t]
        base = rec.link if rec.link is not None else compute_resource(rec.devices[0])
        ends = lanes.setdefault(base, [])
        for k, end in enumerate(ends):
            if end <= rec.start:
                ends[k] = rec.end
                break
        else:
            k = len(ends)
            ends.append(rec.end)
        out[t] = base if k == 0 else f"{base}~{k}"
    return out


def build(trace: Trace, platform: Platform, strategy: Strategy) -> TaskGraph:
    """Case 4 under ``reference_compat``: the replay as a task graph."""
    if strategy.schedule != "gpipe":
        raise ConfigError(
            f"--reference-compat case 4 replays the original's pipeline, which runs GPipe only: drop --schedule "
            f"{strategy.schedule} (or --reference-compat)"
        )
    n = platform.num_gpus
    micro = strategy.micro_batch_size or trace.batch_size
    rounds = max(1, trace.batch_size // micro)
    # The pipeline platform's ring links carry the plain -ptp-bandwidth (not pre-multiplied).
    ptp = platform.ptp_bandwidth_nominal or platform.ptp_bandwidth
    (plan,) = candidate_plans(trace, platform, strategy, [1.0 / rounds] * rounds)
    result = replay(trace, n, rounds, ptp, platform.remote_bandwidth)
    graph = TaskGraph()
    # What the player starts at time 0 hangs off one start task (task k of the replay is k + 1).
    start = graph.add_sync("start of the iteration", devices=range(n))
    resources = _lanes(result.tasks)
    for rec, resource in zip(result.tasks, resources):
        label = rec.label or f"{op_label(trace, rec.attrs['op'])} mb{rec.attrs['microbatch']} gpu{rec.devices[0]}"
        extra = {"src": rec.link.split("->")[0], "dst": rec.link.split("->")[1]} if rec.link else {}
        graph.add_task(rec.kind, label, rec.end - rec.start, (resource,), rec.devices, rec.nbytes,
                       after=(start if rec.cause is None else rec.cause + 1,), **rec.attrs, **extra)
    graph.meta["devices"] = list(range(n))
    graph.meta["cluster_names"] = {g: f"stage {g} (GPU {g})" for g in range(n)}
    graph.meta["memory"] = {g: {"peak_bytes": result.peak_bytes[g], "fetched_bytes": result.fetched_bytes[g],
                                "written_back_bytes": 0, "evictions": 0} for g in range(n)}

    sizes = [trace.batch_size // rounds] * rounds
    graph.meta["pipeline"] = summary(trace, graph, plan, strategy, sizes)
    graph.meta["pipeline"]["model"] = "replay of the original's pipeline player"
    return graph
