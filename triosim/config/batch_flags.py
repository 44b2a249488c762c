"""``--global-batch N``: a hybrid run's batch as Megatron-LM gives it, samples per iteration over
all data-parallel replicas.

Megatron's rule: global batch = dp × micro-batch × micro-batches, every replica training the
same number of equal micro-batches. So each replica (one pipeline of tp × pp GPUs) trains
N / dp samples in N / (dp · micro-batch) micro-batches, and the trace is scaled to N / dp
samples, as ``-batch-size-sim`` would scale it. ``-batch-size`` stays the batch the trace was
recorded at (what the scaling starts from), so it never contradicts ``--global-batch``;
``-batch-size-sim`` is the same quantity per replica, so a value other than N / dp does.
"""

from __future__ import annotations

import argparse

from ..errors import ConfigError
from ..limits import MAX_BATCH
from .parallel_flags import degrees_given


def add_global_batch_flag(g: argparse._ArgumentGroup) -> None:
    """Add ``--global-batch`` to the ``strategy`` flag group."""
    g.add_argument("--global-batch", type=int, default=None, metavar="N",
                   help="hybrid runs: samples per iteration over all data-parallel replicas, as Megatron-LM's "
                        "--global-batch-size; each replica trains N/dp samples in N/(dp x micro-batch) "
                        "micro-batches (instead of -batch-size-sim, which is per replica)")


def _multiples_near(n: int, step: int) -> str:
    """The multiples of ``step`` either side of ``n`` (the lower one only when positive)."""
    low, high = (n // step) * step, (n // step + 1) * step
    return f"{low} or {high}" if low > 0 else str(high)


def global_batch_per_replica(args: argparse.Namespace) -> int | None:
    """The per-replica batch ``--global-batch`` asks for (None when it is not given), checked:
    a hybrid run, N a multiple of dp × micro-batch, and not contradicting ``-batch-size-sim``."""
    n = getattr(args, "global_batch", None)
    if n is None:
        return None
    if n < 1:
        raise ConfigError(f"--global-batch must be a positive integer, got {n}")
    if not degrees_given(args):
        raise ConfigError("--global-batch needs the degrees of a hybrid run: give --dp/--tp/--pp "
                          "(-case 2 is --dp N, -case 4 is --pp N; one GPU is --dp 1)")
    dp = getattr(args, "dp", None) or 1
    if dp < 1:
        raise ConfigError(f"--dp must be a positive integer, got {dp}")
    mb = getattr(args, "micro_batch_size", None)
    mb = None if mb in (None, -1) else mb
    if mb is not None and mb < 1:
        raise ConfigError(f"-micro-batch-size must be a positive integer, got {mb}")
    if n // dp > MAX_BATCH:
        shown = f"{n:,}" if n < 10**24 else f"an integer of {len(str(n))} digits"
        raise ConfigError(f"--global-batch {shown} over --dp {dp} is above the limit of {MAX_BATCH:,} samples per replica")
    step = dp * (mb or 1)
    if n % step:
        typed_mb = mb is not None and "-micro-batch-size" not in getattr(args, "applied_defaults", {})
        what = f"--dp {dp} × -micro-batch-size {mb} = {step}" if typed_mb else f"--dp {dp}"
        raise ConfigError(f"--global-batch {n} is not a multiple of {what}: every data-parallel replica trains the "
                          f"same number of equal micro-batches (use --global-batch {_multiples_near(n, step)})")
    per_replica = n // dp
    sim = getattr(args, "batch_size_sim", None)
    if sim not in (None, -1) and sim != per_replica:
        raise ConfigError(f"--global-batch {n} over --dp {dp} is {per_replica} samples per replica, but "
                          f"-batch-size-sim is {sim}: give one of them (-batch-size-sim is one replica's batch)")
    return per_replica


__all__ = ["add_global_batch_flag", "global_batch_per_replica"]
