"""Stage-to-stage sends: one version of a buffer goes from the stage that wrote it to every stage
that reads it, hop by hop through the stages in between (activations forward, gradients back;
a skip connection over k stages costs k hops). Case 4 and the composition send alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ...hardware.platform import Platform, gpu_node
from ...schedule.tasks import TaskGraph


def send_hop_by_hop(graph: TaskGraph, platform: Platform, buffer: str, r: int, nbytes: int, src: int,
                    reader_stages: Iterable[int], first: int, gpu_of: Callable[[int], int],
                    rows: dict | None = None) -> dict[int, int]:
    """Transfers of ``buffer`` (micro-batch ``r``, ``nbytes``) from stage ``src`` after task
    ``first``, towards the farthest reader stage on each side; returns stage -> the transfer
    arriving there (``gpu_of``: the GPU running a stage). ``rows``: a dict kept across calls,
    where each hop's route and times are resolved once per (GPUs, bytes) (the 1T run sends
    64,512 buffer versions over 126 hops), the tasks the same as ``add_transfer``'s."""
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
            label = f"send {buffer} mb{r} gpu{ga}->gpu{gb}"
            if rows is None:
                prev = graph.add_transfer(platform, ga, gb, nbytes, label, after=[prev], microbatch=r, stage_index=a,
                                          buffer=buffer, direction=direction, dst_stage=a + step)
            else:
                hit = rows.get((ga, gb, nbytes))
                if hit is None:  # what add_transfer resolves (TaskGraph.add_route_task)
                    s_node, d_node = gpu_node(ga), gpu_node(gb)
                    route = tuple(platform.route(s_node, d_node))
                    hit = rows[(ga, gb, nbytes)] = (
                        graph.resolved_row("transfer", label, platform.route_time(route, nbytes), route, (ga, gb)),
                        float(platform.route_time(route, 0.0)), s_node, d_node, int(nbytes))
                row, latency, s_node, d_node, size = hit
                prev = graph.add_row(row, label, size, latency,
                                     {"src": s_node, "dst": d_node, "microbatch": r, "stage_index": a, "buffer": buffer,
                                      "direction": direction, "dst_stage": a + step}, [prev])
            arrive[a + step] = prev
    return arrive


__all__ = ["send_hop_by_hop"]
