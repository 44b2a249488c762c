"""Stage-to-stage sends: one version of a buffer goes from the stage that wrote it to every stage
that reads it, hop by hop through the stages in between (activations forward, gradients back;
a skip connection over k stages costs k hops). Case 4 and the composition send alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ...hardware.platform import Platform
from ...schedule.tasks import TaskGraph


def send_hop_by_hop(graph: TaskGraph, platform: Platform, buffer: str, r: int, nbytes: int, src: int,
                    reader_stages: Iterable[int], first: int, gpu_of: Callable[[int], int]) -> dict[int, int]:
    """Transfers of ``buffer`` (micro-batch ``r``, ``nbytes``) from stage ``src`` after task
    ``first``, towards the farthest reader stage on each side; returns stage -> the transfer
    arriving there (``gpu_of``: the GPU running a stage)."""
    stages = list(reader_stages)
    arrive: dict[int, int] = {}
    for step, direction in ((1, "forward"), (-1, "backward")):
        dests = [st for st in stages if (st - src) * step > 0]
        if not dests:
            continue
        far = max(dests) if step > 0 else min(dests)
        prev = first
        for a in range(src, far, step):
            ga, gb = gpu_of(a), gpu_of(a + step)
            prev = graph.add_transfer(platform, ga, gb, nbytes, f"send {buffer} mb{r} gpu{ga}->gpu{gb}", after=[prev],
                                      microbatch=r, stage_index=a, buffer=buffer, direction=direction,
                                      dst_stage=a + step)
            arrive[a + step] = prev
    return arrive


__all__ = ["send_hop_by_hop"]
