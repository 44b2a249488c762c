"""Megatron blocks back to back (the MLP reads the attention's output projection, no residual add
or LayerNorm between them) under sequence parallelism: one op then ends the first block and feeds
the second, so it carries two collectives, a reduce-scatter of the first block's result and the
all-gather of it for the second. Closed forms: the order of the two on that op, and every
collective of the plan built once per micro-batch (none dropped for sharing an op)."""

from __future__ import annotations

import tempfile
from collections import Counter

import networkx as nx
import pytest

import triosim.graph.tensor.megatron as mg
from triosim.graph import build_graph
from triosim.graph.strategy import Strategy
from triosim.graph.tensor import per_op
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.schedule.validate import schedule_violations
from triosim.trace import Trace, load_trace
from triosim.trace.synthetic_transformer import SyntheticTransformer, write_synthetic_transformer

LAYERS = 2
MODEL = SyntheticTransformer(layers=LAYERS, batch_size=4, seq_len=8, hidden=16, heads=4, chained_blocks=True)


@pytest.fixture(scope="module")
def chained() -> Trace:
    with tempfile.TemporaryDirectory() as tmp:
        return load_trace(write_synthetic_transformer(tmp, MODEL), batch_size=MODEL.batch_size)


def shared_ops(plan) -> dict[int, list[str]]:
    """Op -> the kinds of its collectives, in plan order, for ops with more than one."""
    at: dict[int, list[str]] = {}
    for c in plan.collectives:
        at.setdefault(c.op, []).append(c.kind)
    return {op: kinds for op, kinds in at.items() if len(kinds) > 1}


def test_chained_blocks_are_found(chained):
    plan = mg.plan_tensor_parallel(chained, 2, sequence_parallel=True)
    assert [b.kind for b in plan.blocks] == ["attention", "mlp"] * LAYERS
    for att, mlp in zip(plan.blocks[::2], plan.blocks[1::2]):
        assert mlp.input in att.output, "the MLP must read the attention's output directly"


def test_reduce_scatter_before_the_all_gather_of_its_result(chained):
    """Per layer one forward op (the output projection) and one backward op (fc1's input
    gradient) carry two collectives: the first block's reduce-scatter, then the next block's
    all-gather of the same buffer. Gathering first would gather a result not yet reduced."""
    plan = mg.plan_tensor_parallel(chained, 2, sequence_parallel=True)
    shared = shared_ops(plan)
    assert len(shared) == 2 * LAYERS
    assert all(kinds == ["reduce_scatter", "all_gather"] for kinds in shared.values()), shared
    for op in shared:
        rs, ag = [c for c in plan.collectives if c.op == op]
        assert rs.buffers == ag.buffers and rs.nbytes == ag.nbytes
    assert [c.op for c in plan.collectives] == sorted(c.op for c in plan.collectives)


def test_chained_plan_closed_form(chained):
    """4 collectives per block of b·s·h·4 bytes, half reduce-scatters, half all-gathers."""
    from triosim.graph.tensor.vocab import vocab_collectives

    plan = mg.plan_tensor_parallel(chained, 2, sequence_parallel=True)
    act = MODEL.batch_size * MODEL.seq_len * MODEL.hidden * 4
    vocab = {(c.op, c.kind) for _, _, c in vocab_collectives(chained, plan.vocab, True)} if plan.vocab else set()
    blocks = [c for c in plan.collectives if not c.redo and (c.op, c.kind) not in vocab]
    assert Counter(c.kind for c in blocks) == {"all_gather": 4 * LAYERS, "reduce_scatter": 4 * LAYERS}
    assert {c.nbytes for c in blocks} == {act}
    # sequence parallelism's backward re-gather: one per block's input (two blocks a layer)
    assert [c.kind for c in plan.collectives if c.redo] == ["all_gather"] * (2 * LAYERS)


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("dp, tp, pp, mb", [(1, 2, 1, 4), (1, 2, 2, 2), (2, 2, 1, 2)])
def test_every_collective_of_the_plan_is_built(chained, dp, tp, pp, mb, exact):
    """The composition issues each TP collective of the plan once per micro-batch on each TP
    group: tp 2 with sequence parallelism on 2 chained layers is 16 per micro-batch, not the 12
    left when an op keeps one collective. Its bytes are the plan's."""
    plan = mg.plan_tensor_parallel(chained, tp, sequence_parallel=True)
    micro = MODEL.batch_size // mb
    strategy = Strategy(dp=dp, tp=tp, pp=pp, micro_batch_size=mb, sequence_parallel=True, exact=exact,
                        schedule="1f1b")
    g = build_graph(chained, build_platform(num_gpus=dp * tp * pp, topology="switch"), strategy)
    assert schedule_violations(g, schedule(g)) == []
    stats = g.meta["hybrid"]["collectives_dp0_tp0"]["tp"]
    assert stats["collectives"] == sum(c.calls for c in plan.collectives) * micro
    frac_bytes = sum(c.calls * (int(round(c.nbytes / micro)) if micro > 1 else c.nbytes) for c in plan.collectives)
    assert stats["payload_bytes"] == frac_bytes * micro
    # Each collective task is charged as its own kind (a charge found once per op and size
    # would hand the all-gather the reduce-scatter's charge).
    named = {"allgather": "all_gather", "reducescatter": "reduce_scatter", "allreduce": "all_reduce"}
    for t, label in enumerate(g.label):
        a = g.attrs[t] or {}
        if a.get("group_kind") == "tp" and a.get("representative"):
            assert a["op"] == named[label.split()[1]], f"{label} charged as {a['op']}"
    # On an op with two collectives the all-gather depends on the reduce-scatter (the ring's
    # links would serialize them anyway; the edge says the gather needs the reduced data).
    assert_gather_after_scatter(g, plan, "op_index")


def assert_gather_after_scatter(g, plan, key: str) -> None:
    """Every all-gather task on an op shared with a reduce-scatter has a reduce-scatter task of
    that op (and micro-batch) among its ancestors in the DAG: on each GPU the gather's first step
    waits for the scatter's end there (without the edge both only follow the op's compute)."""
    dag = g.to_networkx()
    shared = shared_ops(plan)
    tasks: dict[tuple[int, int, str], list[int]] = {}
    for t, label in enumerate(g.label):
        a = g.attrs[t] or {}
        if a.get(key) in shared and ("reducescatter" in label or "allgather" in label):
            kind = "rs" if "reducescatter" in label else "ag"
            tasks.setdefault((a[key], a.get("microbatch", 0), kind), []).append(t)
    pairs = 0
    for (op, r, kind), ags in tasks.items():
        if kind != "ag":
            continue
        rss = tasks[(op, r, "rs")]
        for t in ags:
            before = nx.ancestors(dag, t)
            assert any(x in before for x in rss), "an all-gather does not wait for the reduce-scatter"
            pairs += 1
    assert pairs >= len(shared)


@pytest.mark.parametrize("detail", ["macro", "expanded"])
def test_one_group_build_runs_them_in_order(chained, detail):
    """The DAG of one TP group from the plan (the per-op builder): on a shared op the all-gather
    waits for the reduce-scatter on every GPU."""

    plan = mg.plan_tensor_parallel(chained, 2, sequence_parallel=True)
    g = per_op.build_from_plan(chained, build_platform(2), Strategy(case=3, collective_detail=detail), plan)
    assert schedule_violations(g, schedule(g)) == []
    assert_gather_after_scatter(g, plan, "op")
