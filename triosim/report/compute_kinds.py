"""Where each GPU's compute time goes by kind of kernel: GEMMs, FP8 casts, attention, the rest.

Each compute task's scheduled time is split by the shares of its op(s) in
``graph.meta["op_parts"]`` (:func:`triosim.compute.op_parts.op_parts`: per op, its seconds in
GEMMs, FP8 cast kernels, attention and everything else); a task that runs several ops takes their
summed shares. The parts of a GPU sum to its compute time (the time breakdown's forward,
backward, recompute and optimizer parts together).
"""

from __future__ import annotations

import numpy as np

from ..graph.composition import FOLD_RUNS_META, MIRRORS_META

PART_NAMES = ("gemm", "fp8_casts", "attention", "other")
_OTHER = np.array([0.0, 0.0, 0.0, 1.0])


def _shares(parts, attrs) -> np.ndarray:
    """The four shares of one compute task from its op(s)."""
    ops = (attrs.get("ops") or (attrs.get("op"),)) if attrs else ()
    total = np.zeros(4)
    for op in ops:
        if isinstance(op, int) and 0 <= op < len(parts):
            total += parts[op]
    s = total.sum()
    return total / s if s > 0 else _OTHER


def compute_kinds(result) -> dict[str, float]:
    """The mean over built GPUs of each kind's compute milliseconds (``{}`` without op parts)."""
    graph, sched = result.graph, result.schedule
    parts = graph.meta.get("op_parts")
    if not parts:
        return {}
    parts = np.asarray(parts, dtype=np.float64)
    cache: dict[int, np.ndarray] = {}  # a segment's attribute dict is shared by its tasks on every GPU
    rows, took, gpus = [], [], set()
    for i, kind in enumerate(graph.kind):
        if kind != "compute":
            continue
        attrs = graph.attr_rows[i]
        key = id(attrs)
        share = cache.get(key)
        if share is None:
            share = cache[key] = _shares(parts, attrs)
        rows.append(share)
        took.append((sched.end[i] - sched.start[i]) * len(graph.devices[i]))
        gpus.update(graph.devices[i])
    if not rows:
        return {}
    mirrors = graph.meta.get(MIRRORS_META)
    if mirrors:  # a folded build: the rows of the exact build, each span once per GPU in turn
        took_a, rows_a = _unfolded(graph, np.asarray(took), np.vstack(rows), 1 + len(mirrors))
        gpus.update(mirrors)
    else:
        took_a, rows_a = np.asarray(took), np.vstack(rows)
    sums = took_a @ rows_a
    n = max(1, len(gpus))
    return {f"{name}_ms": round(float(v) / n * 1e3, 9) for name, v in zip(PART_NAMES, sums)}


def _unfolded(graph, took: np.ndarray, rows: np.ndarray, copies: int) -> tuple[np.ndarray, np.ndarray]:
    """``took`` and ``rows`` (one per compute task, in task order) as the exact build of a folded
    graph has them: the compute tasks of each span of ``graph.meta["fold_runs"]`` once per GPU,
    task by task or span by span as that build adds them, so the sums add the same numbers in
    the same order."""
    ids = graph.compute_tasks()[0]
    out_took, out_rows = [], []
    k = 0
    for lo, hi, each in graph.meta[FOLD_RUNS_META]:
        j = int(np.searchsorted(ids, hi))
        if j > k and ids[k] < lo:
            raise AssertionError("compute tasks outside the folded spans")
        if each:
            out_took.append(np.repeat(took[k:j], copies))
            out_rows.append(np.repeat(rows[k:j], copies, axis=0))
        else:
            out_took.append(np.tile(took[k:j], copies))
            out_rows.append(np.tile(rows[k:j], (copies, 1)))
        k = j
    if k != len(ids):
        raise AssertionError("compute tasks outside the folded spans")
    return np.concatenate(out_took), np.concatenate(out_rows)


__all__ = ["PART_NAMES", "compute_kinds"]
