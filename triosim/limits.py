"""Upper bounds on what triosim agrees to build, checked before any memory is spent.

A task graph costs about 0.7-1 kB per task (networkx node, edges, attributes) plus the
scheduler's timelines, so a run asked for a million GPUs used to exhaust memory after minutes.
These checks refuse such runs at once with a one-line estimate and a hint:

* :data:`MAX_GPUS` GPUs per platform (the interconnect graph alone has a node per GPU);
* :data:`MAX_LINKS` links in the interconnect graph (a ``kind: cluster`` topology file, a
  fully connected platform), counted before any is built;
* :data:`MAX_TASKS` tasks per graph, estimated from below before the graph is built: every GPU
  that runs its own copy (or shard) of the trace's operators adds at least one task per
  operator.
"""

from __future__ import annotations

import os

from .errors import ConfigError

# 131,072 GPUs: the GPT sample at 96 layers, dp 1024 × tp 8 × pp 16 on the DGX H100 SuperPOD file
# (one representative pipeline) took 8.6 s and 0.82 GB on 2 cores.
MAX_GPUS = 131_072
MAX_TASKS = 10_000_000  # about 9 GB of graph and schedule (0.9 kB a task), minutes of building
# Directed links of the interconnect graph. A link costs about 2.4 kB once built, routed and
# used by the collectives (measured: a cluster file of 65,536 GPUs, one a node, has 393,216
# links and took 0.95 GB and 78 s on the smallest trace); a run that routes little costs less
# (the SuperPOD file on 131,072 GPUs: 794,624 links, 0.82 GB in all). The limit admits a cluster
# file of nodes of 8 GPUs up to MAX_GPUS and a fully connected platform of up to 894 GPUs.
MAX_LINKS = 800_000
BYTES_PER_LINK = 2_400


# Layers of a repeated trace (``trace repeat --layers``, ``run --num-layers``): the largest
# models have about 10^2 layers; 10^4 layers of a small layer is a trace of 10^6 ops, and a
# million layers took minutes before failing on memory.
MAX_LAYERS = 10_000


def check_layer_count(layers: int, flag: str) -> None:
    """Refuse a repeat to fewer than 1 or more than :data:`MAX_LAYERS` layers."""
    if layers < 1:
        raise ConfigError(f"{flag} must be a positive integer, got {layers}")
    if layers > MAX_LAYERS:
        raise ConfigError(f"{flag} {layers:,} is above the limit of {MAX_LAYERS:,} layers")


def check_link_count(links: int, gpus: int, what: str, limit: int = MAX_LINKS) -> None:
    """Refuse an interconnect graph of more than ``limit`` directed links, with its estimated size."""
    if links > limit:
        raise ConfigError(
            f"{what} on {gpus:,} GPUs would build an interconnect graph of {links:,} links (about "
            f"{links * BYTES_PER_LINK / 1e9:.1f} GB), above the limit of {limit:,} links: use fewer GPUs"
        )


def check_gpu_count(gpus: int, flag: str = "-GPUnumber") -> None:
    """Refuse a platform larger than :data:`MAX_GPUS` (or smaller than one GPU)."""
    if gpus < 1:
        raise ConfigError(f"{flag} must be >= 1, got {gpus}")
    if gpus > MAX_GPUS:
        raise ConfigError(f"{flag} {gpus:,} is above the limit of {MAX_GPUS:,} GPUs that triosim simulates")


def op_copies(strategy: object, num_gpus: int) -> int:
    """How many times the graph holds (a shard of) every trace operator, at least.

    Data and tensor parallelism (cases 1-3) give every GPU a task per operator (a replica or a
    shard); a pipeline (case 4) splits one copy over its stages; a hybrid run builds every
    data- and tensor-parallel rank of each stage with ``exact``, else one representative
    pipeline (its tensor-parallel ranks).
    """
    if getattr(strategy, "hybrid", False):
        dp, tp, _ = strategy.degrees(num_gpus)
        dp *= getattr(strategy, "context_degree", 1)  # every context-parallel rank a replica
        return dp * tp if getattr(strategy, "exact", False) else tp
    return num_gpus if getattr(strategy, "case", 0) in (1, 2, 3) else 1


def check_tasks_built(tasks: int, where: str) -> None:
    """Stop a build whose graph has grown past :data:`MAX_TASKS` (read at call time). The checks
    before building count the trace's operators only; a whole build on a topology of shared links
    adds many collective tasks per operator (a ring of 1,024 GPUs: six times as many), and such a
    build was killed for want of memory after minutes instead of stopping with a line."""
    if tasks > MAX_TASKS:
        raise ConfigError(f"the task graph passed the limit of {MAX_TASKS:,} tasks while building {where}: use fewer "
                          "GPUs, fewer micro-batches or a shorter trace (every GPU is built under --exact and on a "
                          "ring or mesh; otherwise a switch, nvlink-cluster or cluster file lets one pipeline stand "
                          "for the others)")


def check_graph_size(num_ops: int, copies: int, num_gpus: int, what: str, limit: int = MAX_TASKS) -> int:
    """Raise ConfigError when the graph would exceed ``limit`` tasks; return the estimate."""
    tasks = num_ops * copies
    if tasks > limit:
        raise ConfigError(
            f"{what} on {num_gpus:,} GPUs would build a task graph of at least {tasks:,} tasks "
            f"({num_ops:,} trace operators x {copies:,}), above the limit of {limit:,}: use fewer GPUs "
            "or a shorter trace"
        )
    return tasks


# Samples in one batch (``-batch-size``, ``-batch-size-sim``): op times are scaled by the ratio
# of two batches, as floats; 10^9 samples is far beyond any training batch, and a 400-digit
# batch used to end in an OverflowError.
MAX_BATCH = 1_000_000_000


def check_batch_limit(batch: int, flag: str) -> None:
    """Refuse a batch of more than :data:`MAX_BATCH` samples, naming the flag and the limit."""
    if batch > MAX_BATCH:
        shown = f"{batch:,}" if batch < 10**24 else f"an integer of {len(str(batch))} digits"
        raise ConfigError(f"{flag} {shown} is above the limit of {MAX_BATCH:,} samples")


# ----------------------------------------------------------------------------- machine memory


def _meminfo_available() -> int | None:
    """/proc/meminfo's MemAvailable: what the kernel can give without swapping (Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _cgroup_room() -> int | None:
    """What the process's memory cgroup still allows (v2, else v1); None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 2**60:  # v1 writes "no limit" as ~2^63
            return max(0, limit - usage)
    return None


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status (VmSize, VmData) in bytes."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _rlimit_room() -> int | None:
    """What ``ulimit -v`` (RLIMIT_AS) and RLIMIT_DATA still leave this process; None when unlimited."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    rooms = []
    for which, field in ((resource.RLIMIT_AS, "VmSize"), (getattr(resource, "RLIMIT_DATA", None), "VmData")):
        if which is None:
            continue
        soft = resource.getrlimit(which)[0]
        used = _status_bytes(field)
        if soft != resource.RLIM_INFINITY and soft >= 0 and used is not None:
            rooms.append(max(0, soft - used))
    return min(rooms) if rooms else None


def _sysconf_available() -> int | None:
    """Free physical pages × page size: the fallback where /proc/meminfo is missing."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def available_memory_bytes() -> int | None:
    """The memory this process can still use: the least of the machine's available memory
    (MemAvailable, else free pages), its memory cgroup's room and its ``ulimit -v``/data limit
    room; None when none of them can be read."""
    machine = _meminfo_available()
    if machine is None:
        machine = _sysconf_available()
    known = [b for b in (machine, _cgroup_room(), _rlimit_room()) if b is not None]
    return min(known) if known else None
