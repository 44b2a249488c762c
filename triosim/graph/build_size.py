"""How large a hybrid build will be, known before it starts, for a note a user reads at once.

A hybrid run builds one representative replica when the replicas meet the topology alike
(:mod:`triosim.graph.replica_symmetry`), else every GPU while that stays below
``UNALIKE_EXACT_TASKS`` compute tasks (:func:`triosim.graph.composition.build`). Such a whole
build of 10^5–10^6 tasks takes minutes, and without a word the run looks hung; this module finds
that case and its task count with the same rules as the build, so the shell can say so first.
"""

from __future__ import annotations

from ..hardware.platform import Platform
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
