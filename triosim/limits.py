"""Upper bounds on what triosim agrees to build, checked before any memory is spent.

A task graph costs about 0.7-1 kB per task (networkx node, edges, attributes) plus the
scheduler's timelines, so a run asked for a million GPUs used to exhaust memory after minutes.
These checks refuse such runs at once with a one-line estimate and a hint:

* :data:`MAX_GPUS` GPUs per platform (the interconnect graph alone has a node per GPU);
* :data:`MAX_TASKS` tasks per graph, estimated from below before the graph is built: every GPU
  that runs its own copy (or shard) of the trace's operators adds at least one task per
  operator.
"""

from __future__ import annotations

from .errors import ConfigError

MAX_GPUS = 65_536
MAX_TASKS = 5_000_000  # about 5-10 GB of graph and schedule, minutes of building


def check_gpu_count(gpus: int, flag: str = "-GPUnumber") -> None:
    """Refuse a platform larger than :data:`MAX_GPUS` (or smaller than one GPU)."""
    if gpus < 1:
        raise ConfigError(f"{flag} must be >= 1, got {gpus}")
    if gpus > MAX_GPUS:
        raise ConfigError(f"{flag} {gpus:,} is above the limit of {MAX_GPUS:,} GPUs that triosim simulates")


def min_tasks(num_ops: int, case: int, num_gpus: int) -> int:
    """A lower bound on the tasks of the graph ``case`` builds on ``num_gpus`` GPUs.

    Data and tensor parallelism (cases 1-3) give every GPU a task per operator (a replica or a
    shard); a pipeline (case 4) splits the operators over the stages; one GPU runs each once.
    """
    if case in (1, 2, 3):
        return num_ops * num_gpus
    return num_ops + (num_gpus if case == 4 else 0)


def check_graph_size(num_ops: int, case: int, num_gpus: int, limit: int = MAX_TASKS) -> int:
    """Raise ConfigError when the graph would exceed ``limit`` tasks; return the estimate."""
    tasks = min_tasks(num_ops, case, num_gpus)
    if tasks > limit:
        raise ConfigError(
            f"-case {case} on {num_gpus:,} GPUs would build a task graph of at least {tasks:,} tasks "
            f"({num_ops:,} trace operators), above the limit of {limit:,}: use fewer GPUs or a shorter trace"
        )
    return tasks
