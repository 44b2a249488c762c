"""How much work a plan's search is, known from its candidates before anything is profiled.

The estimator times each candidate's pipeline as a block recurrence (:mod:`triosim.plan.pipeline_time`):
m micro-batches on pp · V stages are m · pp · V blocks, and the block programs are kept per
(schedule, pp, V, m). A candidate at micro-batch 1 has as many micro-batches as its replica has
samples, so the work grows with the per-replica batch: on the GPT sample on 8 GPUs (2 cores, one
process) a global batch of 16,384 is 5.7 million blocks (11 s, 0.33 GB), 131,072 is 46 million
(85 s, 2.2 GB), and 10^8 grew past 22 GB before the workers died. :data:`MAX_PLAN_BLOCKS`
refuses such a search at once, naming ``--global-batch``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigError
from .candidates import Candidate, SearchSpace, mesh_shapes

# About two minutes and 3 GB of estimates in one process (46 million blocks took 85 s and 2.2 GB).
MAX_PLAN_BLOCKS = 64_000_000


def pipeline_blocks(candidates: Iterable[Candidate], global_batch: int) -> int:
    """The blocks the estimator's pipeline recurrences evaluate over ``candidates`` (a
    candidate without a pipeline counts one)."""
    total = 0
    for c in candidates:
        stages = c.pp * c.virtual
        total += (global_batch // c.dp // c.micro_batch) * stages if stages > 1 else 1
    return total


def check_search_size(space: SearchSpace, candidates: Iterable[Candidate], limit: int = MAX_PLAN_BLOCKS) -> int:
    """Raise ConfigError when the search would time more than ``limit`` pipeline blocks; return
    the count."""
    candidates = list(candidates)
    blocks = pipeline_blocks(candidates, space.global_batch)
    if blocks > limit:
        recipe = " or the FP8 recipe (--fp8-recipe)" if any(c.fp8_recipe for c in candidates) else ""
        replica = max(space.global_batch // dp for _, _, dp, _ in mesh_shapes(space))
        raise ConfigError(
            f"--global-batch {space.global_batch:,} on {space.gpus:,} GPUs: the search would time "
            f"{blocks:,} pipeline blocks (a replica trains up to {replica:,} samples, as many micro-batches "
            f"at micro-batch 1), above plan's limit of {limit:,} (about 2 minutes and 3 GB): "
            f"give a smaller --global-batch, or pin a degree (--tp, --pp, --ep){recipe}"
        )
    return blocks


__all__ = ["MAX_PLAN_BLOCKS", "check_search_size", "pipeline_blocks"]
