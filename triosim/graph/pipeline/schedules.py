"""Pipeline schedules: the order in which each GPU of a pipeline runs its forward and backward
blocks.

A *block* is one stage's forward (F) or backward (B) ops for one micro-batch. A GPU's compute is
one in-order stream, so its block order is its whole program (the optimizer comes last).
P is the number of GPUs in the pipeline, R the number of micro-batches.

- ``gpipe``: the forwards of micro-batches 0…R−1, then their backwards 0…R−1.
- ``1f1b`` (PipeDream-flush): GPU p runs min(P−1−p, R) warm-up forwards, then alternates one
  forward and one backward, then drains the remaining backwards.
- ``interleaved`` (Megatron-LM's interleaved 1F1B): the model is cut into P·V stages and GPU p
  runs the V stages p, p+P, p+2P, … (*virtual stages*). Micro-batches go in groups of P: a GPU
  runs the group's forwards on its first virtual stage, then on its second, …; backwards the
  same way from its last virtual stage. GPU p starts with 2·(P−1−p) + (V−1)·P warm-up forwards
  (all of them when R = P), then alternates one forward and one backward, then drains. R must
  be a multiple of P. The bubble shrinks from (P−1)/R to (P−1)/(V·R) of the ideal time, at the
  price of V times as many boundary transfers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError

FORWARD, BACKWARD, OPTIMIZER = "F", "B", "O"
SCHEDULES = ("gpipe", "1f1b", "interleaved")


def block_order(schedule: str, num_stages: int, num_micro: int, stage: int) -> list[tuple[str, int]]:
    """The (phase, micro-batch) blocks stage ``stage`` runs, in order (gpipe and 1f1b; the
    optimizer not included)."""
    fwd = [(FORWARD, r) for r in range(num_micro)]
    bwd = [(BACKWARD, r) for r in range(num_micro)]
    if schedule == "gpipe":
        return fwd + bwd
    if schedule == "interleaved":
        raise ConfigError("--schedule interleaved orders blocks per virtual stage: use interleaved_order")
    if schedule != "1f1b":
        raise ConfigError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    warm = min(num_stages - 1 - stage, num_micro)
    order = fwd[:warm]
    for k in range(num_micro - warm):
        order += [fwd[warm + k], bwd[k]]
    return order + bwd[num_micro - warm :]


def check_interleaved(ranks: int, num_micro: int, virtual: int) -> None:
    """The interleaved schedule's conditions, as one-line errors."""
    if virtual < 2:
        raise ConfigError(f"--schedule interleaved needs --virtual-stages 2 or more, got {virtual}")
    if ranks < 2:
        raise ConfigError("--schedule interleaved needs a pipeline of 2 or more GPUs")
    if num_micro % ranks:
        raise ConfigError(
            f"--schedule interleaved needs the number of micro-batches ({num_micro}) to be a multiple of "
            f"the pipeline's GPUs ({ranks}): choose -micro-batch-size so that it is"
        )


def interleaved_order(ranks: int, num_micro: int, rank: int, virtual: int) -> list[tuple[str, int, int]]:
    """The (phase, micro-batch, virtual stage) blocks GPU ``rank`` runs under the interleaved
    schedule (virtual stage v of GPU p is pipeline stage v·P + p)."""
    check_interleaved(ranks, num_micro, virtual)
    total = num_micro * virtual
    group = ranks * virtual

    def block(k: int, phase: str) -> tuple[str, int, int]:
        in_group = k % group
        chunk = in_group // ranks
        if phase == BACKWARD:
            chunk = virtual - 1 - chunk
        return (phase, (k // group) * ranks + in_group % ranks, chunk)

    warm = interleaved_warmup(ranks, num_micro, rank, virtual)
    order = [block(k, FORWARD) for k in range(warm)]
    for k in range(total - warm):
        order += [block(warm + k, FORWARD), block(k, BACKWARD)]
    return order + [block(k, BACKWARD) for k in range(total - warm, total)]


def interleaved_warmup(ranks: int, num_micro: int, rank: int, virtual: int) -> int:
    """Forward blocks GPU ``rank`` runs before its first backward under the interleaved schedule
    (Megatron-LM's ``num_warmup_microbatches``); the rest pair one forward with one backward."""
    total = num_micro * virtual
    return total if num_micro == ranks else min(total, 2 * (ranks - 1 - rank) + (virtual - 1) * ranks)


def combined_pairs(order: list[tuple[str, int, int]], warm: int | None) -> dict[int, int]:
    """Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``,
    ``megatron/core/pipeline_parallel/combined_1f1b.py``): the positions of ``order`` whose
    forward and backward blocks run together, position -> 0 (the pair's first block) or 1 (its
    second). Interleaved (``warm`` forward blocks first): each steady-state forward with the
    backward after it; one stage (``warm`` None, order F0 B0 F1 B1 …): each backward with the
    next forward, the first forward and the last backward alone."""
    pairs: dict[int, int] = {}
    if warm is None:
        for a in range(1, len(order) - 1, 2):
            pairs[a], pairs[a + 1] = 0, 1
        return pairs
    steady_end = warm + 2 * (len(order) // 2 - warm)
    for a in range(warm, steady_end - 1, 2):
        pairs[a], pairs[a + 1] = 0, 1
    return pairs


def schedule_blocks(schedule: str, ranks: int, num_micro: int, rank: int, virtual: int = 1) -> list[tuple[str, int, int]]:
    """(phase, micro-batch, virtual stage) blocks of GPU ``rank`` for any schedule (the virtual
    stage is 0 for gpipe and 1f1b)."""
    if schedule == "interleaved":
        return interleaved_order(ranks, num_micro, rank, virtual)
    return [(ph, r, 0) for ph, r in block_order(schedule, ranks, num_micro, rank)]


@dataclass(frozen=True)
class Layout:
    """Where stages run: stage c on pipeline rank ``c % ranks``, i.e. GPU ``gpus[c % ranks]``;
    ``virtual`` stages per GPU (1 except for the interleaved schedule)."""

    gpus: tuple[int, ...]
    virtual: int = 1

    @property
    def ranks(self) -> int:
        return len(self.gpus)

    @property
    def num_stages(self) -> int:
        return len(self.gpus) * self.virtual

    def gpu_of(self, stage: int) -> int:
        return self.gpus[stage % len(self.gpus)]
