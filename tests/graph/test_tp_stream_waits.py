"""Megatron's forward tensor-parallel collectives are synchronous: ``torch.distributed``'s
blocking all-reduce, all-gather and reduce-scatter make the compute stream wait for NCCL's, so
the op after one in program order starts when it ends, even an op that does not read its result
(GPT's position embedding after the word embedding's all-reduce). While a forward TP collective
runs its GPU computes nothing. Backward ones are issued asynchronously beside the weight
gradient's GEMM, and the original's per-op tensor parallelism (case 3, ``--tp-style per-op``)
lets an op wait only for what it reads: neither changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from triosim.config import configure
from triosim.graph import build_graph
from triosim.graph.pipeline import rank_program
from triosim.schedule.list_scheduler import schedule

GPT = Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-cpu-bs8"
MESHES = [dict(tp=4), dict(tp=2, pp=2, schedule="1f1b", global_batch=8, micro_batch_size=2),
          dict(tp=4, sequence_parallel=True, exact=True)]


def _beside(flags: dict, phase: str) -> int:
    """How many (TP collective of ``phase``, compute task on one of its GPUs) pairs overlap."""
    trace, platform, strategy = configure(trace_dir=str(GPT), **flags)
    g = build_graph(trace, platform, strategy)
    s = schedule(g)
    compute: dict[int, list[tuple[float, float]]] = {}
    for i, kind in enumerate(g.kind):
        if kind == "compute":
            compute.setdefault(g.devices[i][0], []).append((s.start[i], s.end[i]))
    spans: dict[str, list] = {}  # a collective (its steps, when expanded) -> [start, end, GPUs]
    for i, kind in enumerate(g.kind):
        attrs = g.attrs[i] or {}
        if kind not in ("collective", "transfer") or attrs.get("group_kind") != "tp" \
                or trace.ops[attrs["op_index"]].stage != phase:
            continue
        span = spans.setdefault(attrs.get("collective", g.label[i]), [s.start[i], s.end[i], set()])
        span[0], span[1] = min(span[0], s.start[i]), max(span[1], s.end[i])
        span[2].update(g.devices[i])
    pairs = 0
    for a, b, gpus in spans.values():
        for gpu in gpus:
            pairs += sum(x < b and a < y for x, y in compute.get(gpu, ()))
    return pairs


@pytest.mark.parametrize("flags", MESHES)
def test_a_gpu_computes_nothing_while_a_forward_tp_collective_runs(flags):
    assert _beside(flags, "forward") == 0


@pytest.mark.parametrize("flags", MESHES[:2])
def test_without_the_wait_the_position_embedding_runs_beside_the_all_reduce(flags, monkeypatch):
    """Planted bug: forward collectives that hold nothing back."""
    monkeypatch.setattr(rank_program, "FORWARD_TP_HOLDS_STREAM", False)
    assert _beside(flags, "forward") > 0


def test_the_per_op_style_keeps_the_originals_waits(monkeypatch):
    flags = dict(tp=4, tp_style="per-op")
    held = _beside(flags, "forward")
    monkeypatch.setattr(rank_program, "FORWARD_TP_HOLDS_STREAM", False)
    assert _beside(flags, "forward") == held
