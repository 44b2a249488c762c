"""The state the steps of the composition (:mod:`triosim.graph.composition`) share: inputs, mesh,
plans, the graph under construction and the lookups between steps (which task ran an op, which
collective completed a buffer, each GPU's program), plus per-GPU buffer sizes and how a ``-case``
preset names its tasks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..hardware.platform import Platform
from ..schedule.tasks import TaskGraph
from ..trace import Trace
from .collectives.group_comm import wire_bytes_per_gpu
from .data.zero import BufferRoles, zero_divisor
from .pipeline.stages import PipelinePlan
from .rank_map import RankMap
from .step_lists import StepLists
from .strategy import Preset, Strategy
from .task_of import TaskOf
from .tensor.comm_overlap import TpOverlapPlan
from .tp_done import TpDone


@dataclass
class CompositionState:
    """What the composition's steps share while they build one DAG: the inputs, the mesh, the
    plans, the graph and the tasks added so far (for the lookups between steps)."""

    trace: Trace
    platform: Platform
    strategy: Strategy
    ranks: RankMap
    plan: PipelinePlan
    tpp: object
    fractions: list[float]
    replicas: list[tuple[int, int]]
    roles: BufferRoles
    graph: TaskGraph = field(default_factory=TaskGraph)
    task: TaskOf = field(default_factory=TaskOf)  # (d, t, op, mb) -> task
    tp_done: TpDone = field(default_factory=TpDone)  # (op, mb, d) -> {gpu: t}
    seq: StepLists = field(default_factory=StepLists)  # gpu -> [(task, ops, mb)]
    stats: dict[str, dict[str, float]] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    key_flags: dict[int, tuple] = field(default_factory=dict)
    size_cache: dict[tuple[str, float], int] = field(default_factory=dict)
    prefixes: list[str] = field(default_factory=list)  # micro-batch r -> "mb{r}:" (memory keys)
    versions: list = field(default_factory=list)  # buffer_versions of the trace
    crossing_ops: dict[int, tuple[list[int], list[int]]] | None = None  # pipeline.segments.crossing_ops
    fuse: bool = False  # one task per run of ops with nothing entering or leaving mid-run
    buffer_ids: dict[str, int] = field(default_factory=dict)  # trace tensor -> index (memory keys)
    optimizer_stages: dict[int, dict[int, float]] = field(default_factory=dict)  # optimizer op -> rank -> share
    buffer_rank: dict[str, int] = field(default_factory=dict)  # buffer -> pipeline rank of its stage
    # ZeRO-3 gathered copies: (stage, op, mb) -> (keys freed, keys allocated); their bytes; per
    # stage, the gathered bytes alive at each step of its memory program
    gathered: dict[tuple[int, int, int], tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    gathered_sizes: dict[str, int] = field(default_factory=dict)
    gathered_at: dict[int, list[int]] = field(default_factory=dict)
    # Memory planning: each optimizer op's buffers per owning rank; persistent buffers' indices
    optimizer_split: dict[int, dict[int, tuple]] = field(default_factory=dict)
    gradient_copy: dict[int, int] = field(default_factory=dict)  # pipeline rank -> its fp32 gradient copy
    deferred_wgrad: dict[tuple, float] = field(default_factory=dict)  # (replica, mb) -> expert wgrad seconds held back
    persistent_ids: set[int] | None = None
    # A -case run: the preset it builds (None: a run typed as --dp/--tp/--pp). Its tasks and
    # memory steps keep the names its case gave them (timelines, DOT exports, error messages).
    preset: Preset | None = None
    # Blocking pipeline sends: (d, t, stage, phase, micro-batch) -> (first task, last task) of
    # that block on its GPU (None when sends do not block: nothing looks blocks up)
    blocks: dict[tuple[int, int, int, str, int], tuple[int, int]] | None = None
    # A typed pipeline: a rank program's last task -> the tasks after the program that start off
    # it (the gradient reduction's first collectives, the optimizer): they wait for the program's
    # last send (blocking sends: pipeline.blocking.after_send; overlapped: pipeline.crossings)
    after_program: dict[int, list[int]] = field(default_factory=dict)
    # Overlapped sends: (d, t, pipeline rank) -> (first, last task) of that rank's last block
    last_block: dict[tuple[int, int, int], tuple[int, int]] = field(default_factory=dict)
    # Overlapped pipeline sends: (d, t, stage, phase, micro-batch) -> the first task of that block
    # on its GPU, which waits for what the block receives (None with blocking sends, or no pipeline)
    block_first: dict[tuple[int, int, int, str, int], int] | None = None
    # --tp-comm-overlap: which TP collectives run beside which GEMMs (graph.tensor.comm_overlap)
    overlap: TpOverlapPlan | None = None

    @property
    def tagged(self) -> bool:
        """Whether compute tasks carry their micro-batch and stage (``mb0``, ``stage_index``): in a
        typed composition and the pipeline preset, not in the one-micro-batch presets (cases 0–3)."""
        return self.preset is None or self.preset.axis == "pp"

    def step_label(self, s: int) -> str:
        """What a memory step's label says after the op: the stage in a typed composition, the GPU
        in the pipeline preset, nothing in the other presets."""
        if self.preset is None:
            return f" on stage {s}"
        return f" on GPU {self.ranks.rank(0, 0, s)}" if self.preset.axis == "pp" else ""

    def gpus(self, s: int) -> list[int]:
        return [self.ranks.rank(d, t, s) for d, t in self.replicas]

    def count(self, kind: str, op: str, group: Sequence[int], nbytes: int) -> float:
        """Tally a collective of replica (0, 0)'s groups for the summary; returns the wire bytes
        per GPU it added."""
        st = self.stats.setdefault(kind, {"collectives": 0, "payload_bytes": 0, "wire_bytes_per_gpu": 0.0})
        st["collectives"] += 1
        st["payload_bytes"] += int(nbytes)
        wire = wire_bytes_per_gpu(op, len(group), nbytes)
        st["wire_bytes_per_gpu"] += wire
        return wire

    def size(self, buffer: str, fraction: float) -> int:
        """Bytes of ``buffer`` on one GPU for a micro-batch of ``fraction`` of the batch."""
        hit = self.size_cache.get((buffer, fraction))
        if hit is None:
            hit = self.size_cache[(buffer, fraction)] = self._size(buffer, fraction)
        return hit

    def _size(self, buffer: str, fraction: float) -> int:
        t = self.trace.tensors[buffer].bytes
        if buffer not in self.trace.batch_invariant:
            t = int(round(t * fraction))
        div = self.tpp.shard_divisor.get(buffer, 1) * zero_divisor(self.roles, buffer, self.strategy.zero,
                                                                    self.ranks.data)
        return -(-t // div) if div > 1 else t


__all__ = ["CompositionState"]
