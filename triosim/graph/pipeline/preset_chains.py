"""A ``-case`` preset's pipeline rank as whole chains: when nothing outside a GPU enters its blocks
(no tensor-parallel collectives), each block is one chain of tasks added in one call, GPU after
GPU, with the task names and attributes the case gave them (:mod:`triosim.graph.pipeline.rank_program`
builds everything else op by op or segment by segment)."""

from __future__ import annotations

from ..composition_state import CompositionState


def add_preset_chains(b: CompositionState, p: int, order, ops: dict[tuple[int, str], list[int]], seconds,
                last: dict[tuple[int, int], list[int]], looked_up: set[int]) -> None:
    """A preset's program on pipeline rank ``p`` when nothing outside a GPU enters its blocks (no
    tensor-parallel collectives): each block one chain of tasks, GPU after GPU, as its case added
    them (the tasks and edges of the op-by-op loop, in one call per block). Only the tasks of the
    ``looked_up`` ops are kept in ``b.task`` (a bucket's last gradient, a crossing buffer's writer
    or reader): 1,024 replicas of a large trace would otherwise hold a key per task."""
    labels, graph, task_of = b.labels, b.graph, b.task
    stage_of = [op.stage for op in b.trace.ops]
    singles = {key: [(i,) for i in block] for key, block in ops.items()}  # b.seq's op tuples, shared
    kept = {key: [(k, i) for k, i in enumerate(block) if i in looked_up] for key, block in ops.items()}
    for (d, t), gpu in zip(b.replicas, b.gpus(p)):
        rep = (d, t)
        for ph, r, v in order:
            s = v * b.ranks.pp + p
            block = ops[(s, ph)]
            if not block:
                continue
            if b.tagged:
                tail = f" mb{r} gpu{gpu}"
                attrs = [{"op": i, "stage": stage_of[i], "microbatch": r, "stage_index": s} for i in block]
            else:
                tail = f" gpu{gpu}"
                attrs = [{"op": i, "stage": stage_of[i]} for i in block]
            tasks = graph.add_compute_chain(gpu, seconds(s, ph, b.fractions[r]), [labels[i] + tail for i in block],
                                            attrs, after=last[rep])
            task_of.update(((d, t, i, r), tasks[k]) for k, i in kept[(s, ph)])
            b.seq[gpu].extend(zip(tasks, singles[(s, ph)], [r] * len(tasks)))
            last[rep] = [tasks[-1]]


__all__ = ["add_preset_chains"]
