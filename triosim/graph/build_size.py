"""How large a build will be, known before it starts: a note a user reads at once, and the
memory it needs against the memory the machine has.

A hybrid run builds one representative replica when the replicas meet the topology alike
(:mod:`triosim.graph.replica_symmetry`), else every GPU while that stays below
``UNALIKE_EXACT_TASKS`` compute tasks (:func:`triosim.graph.composition.build`). Such a whole
build of 10^5–10^6 tasks takes minutes, and without a word the run looks hung; this module finds
that case and its task count with the same rules as the build, so the shell can say so first.

**Memory.** A graph under the task limit (:data:`triosim.limits.MAX_TASKS`) can still need more
memory than the machine has, and used to end in a ``MemoryError`` traceback after minutes.
:func:`check_build_memory` estimates it from below before building: the tasks every GPU built
must hold (trace ops × built copies × micro-batches) at :data:`BYTES_PER_TASK` (measured
0.67–0.83 kB a task, graph, schedule and report together), the interconnect's links at
:data:`~triosim.limits.BYTES_PER_LINK`, and on the built-in ``switch`` the trees the ``tree``
all-reduce keeps per group (one per channel, a channel per GPU of the switch: 2·n² entries,
measured 225 B per n²; a 4,096-GPU ``-case 2`` peaked at 4.3 GB); and refuses when that is more
than :func:`triosim.limits.available_memory_bytes`, with what would shrink it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..hardware.platform import Platform
from ..limits import BYTES_PER_LINK, available_memory_bytes, op_copies
from ..trace import Trace
from .composition import AUTO_EXACT_TASKS, UNALIKE_EXACT_TASKS
from .pipeline.builder import micro_batch_sizes
from .rank_map import rank_map
from .replica_symmetry import replicas_alike
from .strategy import Strategy

# A whole build above this many compute tasks gets the note (about 10 s and up on 2 cores).
NOTE_TASKS = 200_000


def unalike_build_note(trace: Trace, platform: Platform, strategy: Strategy) -> str | None:
    """One line when a hybrid run will build every GPU because its replicas meet the nodes
    differently and that build is large; None otherwise (``--exact`` asked for it)."""
    if not strategy.hybrid or strategy.exact:
        return None
    dp, tp, pp = strategy.degrees(platform.num_gpus)
    dp *= strategy.context_degree  # data ranks: each context-parallel rank is a replica built alike
    if dp * tp < 2:
        return None
    micro = len(micro_batch_sizes(trace.batch_size, strategy.micro_batch_size))
    tasks = dp * tp * len(trace.ops) * micro
    if tasks <= max(NOTE_TASKS, AUTO_EXACT_TASKS) or tasks > UNALIKE_EXACT_TASKS:
        return None  # small, or one representative with its warning in the summary
    ranks = rank_map(strategy, platform.num_gpus)
    if ranks.size != platform.num_gpus or replicas_alike(platform, ranks):
        return None
    per_node = platform.node_of.count(0) if platform.node_of else 1
    return (f"the replicas meet the nodes differently (tp {tp} × pp {pp} = {tp * pp} GPUs a replica, {per_node} a "
            f"node), so every one of the {dp * tp:,} replicas is built: about {tasks:,} tasks, which takes "
            f"minutes; with --gpus-per-node dividing tp × pp (or a multiple of it) one replica stands for all")


BYTES_PER_TASK = 800  # measured 670-830 B a task (ring, nvlink-cluster, hybrid and -case runs)
BYTES_PER_TREE_PAIR = 225  # per n² of a group's all-reduce trees on the built-in switch


@dataclass(frozen=True)
class BuildMemory:
    """A build's memory, estimated from below (bytes)."""

    tasks: int
    task_bytes: int
    link_bytes: int
    tree_bytes: int

    @property
    def total(self) -> int:
        return self.task_bytes + self.link_bytes + self.tree_bytes


def _groups(strategy: Strategy, num_gpus: int) -> list[tuple[int, int]]:
    """(group size, groups costed) of the collectives' groups: every group of an exact build,
    one per kind for representatives (the canonical group)."""
    dp, tp, pp = strategy.degrees(num_gpus)
    every = not strategy.hybrid or bool(strategy.exact)
    return [(size, (num_gpus // size if every else 1)) for size in (dp, tp) if size > 1]


def build_memory(trace: Trace, platform: Platform, strategy: Strategy) -> BuildMemory:
    """The memory the graph of ``strategy`` on ``platform`` needs at least (module docstring)."""
    n = platform.num_gpus
    micro = len(micro_batch_sizes(trace.batch_size, strategy.micro_batch_size)) if strategy.hybrid else 1
    tasks = len(trace.ops) * op_copies(strategy, n) * micro
    links = platform.graph.number_of_edges()
    trees = 0
    if platform.topology == "switch" and platform.router is None and platform.collective_algo in ("auto", "tree"):
        trees = sum(count * size * size for size, count in _groups(strategy, n)) * BYTES_PER_TREE_PAIR
    return BuildMemory(tasks, tasks * BYTES_PER_TASK, links * BYTES_PER_LINK, trees)


def _shrink_hint(strategy: Strategy, num_gpus: int, need: BuildMemory, representatives: bool) -> str:
    if need.tree_bytes > need.task_bytes:
        return "--collective-algo ring keeps no tree per GPU of the switch, or use fewer GPUs"
    if not representatives:
        return "use fewer GPUs, fewer micro-batches or a shorter trace"
    if not strategy.hybrid:
        axis = strategy.preset.axis
        if axis in ("dp", "tp"):
            return f"--{axis} {num_gpus:,} builds one representative GPU instead of all, or use fewer GPUs"
        return "use fewer GPUs or a shorter trace"
    if strategy.exact:
        return "--representatives builds one pipeline for all replicas, or use fewer GPUs"
    return "use fewer GPUs, fewer micro-batches or a shorter trace"


def check_build_memory(trace: Trace, platform: Platform, strategy: Strategy, available: int | None = None,
                       representatives: bool = True) -> None:
    """Refuse a build whose estimate (:func:`build_memory`) exceeds the memory available
    (``available``, default :func:`~triosim.limits.available_memory_bytes`; unknown: no check);
    ``representatives``: whether the hint may offer them."""
    available = available_memory_bytes() if available is None else available
    if available is None:
        return
    need = build_memory(trace, platform, strategy)
    if need.total <= available:
        return
    what = strategy.name if strategy.hybrid else f"-case {strategy.case}"
    parts = f"{need.tasks:,} tasks × {BYTES_PER_TASK} B" + (
        f", {need.tree_bytes / 1e9:.1f} GB of all-reduce trees" if need.tree_bytes else "")
    raise ConfigError(
        f"{what} on {platform.num_gpus:,} GPUs would need at least {need.total / 1e9:.1f} GB to build ({parts}), "
        f"and {available / 1e9:.1f} GB of memory is available: {_shrink_hint(strategy, platform.num_gpus, need, representatives)}"
    )
