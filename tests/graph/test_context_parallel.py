"""Context parallelism (graph/context): closed forms, each with the planted bug it catches.

- with causal load balancing every context rank does the same attention work (closed form and
  in the DAG);
- the ring's bytes per layer and direction: forward (cp−1)·(K,V chunk), backward
  (cp−1)·(K,V + dK,dV), from the card's own numbers;
- the gradient reduction runs over dp × cp GPUs (and ZeRO shards over them);
- every activation kept for backward is 1/cp;
- every op outside attention takes 1/cp of its time; the ring's exchanges overlap the partial
  attentions and only what is slower shows.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from triosim.config import configure
from triosim.graph import build_graph
from triosim.graph import composition as composition_module
from triosim.graph.context import plan as plan_module
from triosim.graph.context import ring as ring_module
from triosim.graph.context.plan import (
    BACKWARD,
    FORWARD,
    attention_ops,
    causal_blocks,
    chunks_of,
    rank_work,
    ring_exchange_bytes,
    step_work,
)
from triosim.graph.rank_map import RankMap
from triosim.graph.strategy import Strategy
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.simulation import simulate
from triosim.trace import load_trace
from triosim.trace.synthetic_transformer import SyntheticTransformer, write_synthetic_transformer

# llama3-8b: 8 key/value heads of 128, bf16; a short sequence keeps the card run fast.
SEQ, KV_HEADS, HEAD_DIM, BF16 = 2048, 8, 128, 2
CARD = {"model": "llama3-8b", "num-layers": 2, "gpu": "h100-sxm", "seq-len": SEQ}


def _card_run(**flags):
    trace, platform, strategy = configure({**CARD, **flags})
    return simulate(trace, platform, strategy)


def _attention(trace) -> dict[int, str]:
    """The trace's attention ops -> forward or backward."""
    return {i: a.phase for i, a in attention_ops(trace).items()}


# ----------------------------------------------------------------------------- equal attention work


def check_equal_attention_work(cp: int) -> None:
    """2·cp chunks make (2cp)²/2 causal blocks; each rank does 2·cp of them, 2 in every step."""
    total = causal_blocks(range(2 * cp), range(2 * cp))
    assert total == 2 * cp * cp
    assert [rank_work(r, cp) for r in range(cp)] == [total / cp] * cp
    for phase in (FORWARD, BACKWARD):
        assert {step_work(r, j, cp, phase) for r in range(cp) for j in range(cp)} == {2.0}


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8, 16])
def test_balanced_chunks_give_every_rank_the_same_attention_work(cp: int) -> None:
    check_equal_attention_work(cp)
    assert sorted(c for r in range(cp) for c in chunks_of(r, cp)) == list(range(2 * cp))


def test_equal_work_check_catches_contiguous_chunks(monkeypatch) -> None:
    """Planted bug: rank r holds chunks 2r and 2r+1 (no causal balancing): the last rank's
    queries see 4·cp − 1 blocks of keys, the first rank's 1."""
    monkeypatch.setattr(plan_module, "chunks_of", lambda r, cp: (2 * r, 2 * r + 1))
    with pytest.raises(AssertionError):
        check_equal_attention_work(4)


def check_equal_attention_time_in_the_dag(cp: int = 4) -> None:
    """Every GPU of an exact build spends the same time in its attention's partial steps."""
    result = _card_run(cp=cp, exact=True)
    graph = result.graph
    attention = set(_attention(configure(CARD)[0]))
    spent: dict[int, float] = {}
    for t, kind in enumerate(graph.kind):
        attrs = graph.attrs[t] or {}
        if kind == "compute" and attrs.get("op") in attention:
            spent[graph.devices[t][0]] = spent.get(graph.devices[t][0], 0.0) + graph.duration[t]
    assert len(spent) == cp and max(spent.values()) == pytest.approx(min(spent.values()), rel=1e-12)


def test_every_context_rank_spends_the_same_attention_time() -> None:
    check_equal_attention_time_in_the_dag()


def test_the_dag_check_catches_contiguous_chunks(monkeypatch) -> None:
    monkeypatch.setattr(plan_module, "chunks_of", lambda r, cp: (2 * r, 2 * r + 1))
    with pytest.raises(AssertionError):
        check_equal_attention_time_in_the_dag()


# ----------------------------------------------------------------------------- ring bytes


def test_ring_exchange_bytes_closed_form() -> None:
    assert ring_exchange_bytes(10, 7, 1, FORWARD) == []
    assert ring_exchange_bytes(10, 7, 4, FORWARD) == [10, 10, 10]
    assert ring_exchange_bytes(10, 7, 4, BACKWARD) == [10, 17, 17, 7]
    for cp in (2, 3, 8):
        assert sum(ring_exchange_bytes(10, 7, cp, FORWARD)) == (cp - 1) * 10
        assert sum(ring_exchange_bytes(10, 7, cp, BACKWARD)) == (cp - 1) * (10 + 7)


def check_ring_bytes(cp: int = 4, tp: int = 2) -> None:
    """Into one GPU per attention op of one micro-batch: forward cp−1 transfers of its K,V chunk,
    backward cp transfers carrying (cp−1)·(K,V) + (cp−1)·(dK,dV), each chunk
    (s/cp) · (kv heads/tp) · head size · 2 bytes; the summary says the same."""
    result = _card_run(cp=cp, tp=tp, representatives=True)
    graph = result.graph
    chunk = (SEQ // cp) * (KV_HEADS // tp) * HEAD_DIM * BF16  # K (or V, dK, dV) on one rank
    per_op: dict[int, list[int]] = {}
    for t, kind in enumerate(graph.kind):
        attrs = graph.attrs[t] or {}
        if kind == "transfer" and attrs.get("group_kind") == "cp" and graph.devices[t][1] == 0:
            per_op.setdefault(attrs["op_index"], []).append(graph.nbytes[t])
    phases = _attention(configure(CARD)[0])
    assert sorted(per_op) == sorted(phases) and len(phases) == 4  # 2 layers, both directions
    for i, sent in per_op.items():
        if phases[i] == FORWARD:
            assert len(sent) == cp - 1 and sum(sent) == (cp - 1) * 2 * chunk
        else:
            assert len(sent) == cp and sum(sent) == (cp - 1) * 2 * chunk + (cp - 1) * 2 * chunk
    facts = graph.meta["hybrid"]["context_parallel"]
    assert facts["exchange_bytes_per_layer"] == {"forward": (cp - 1) * 2 * chunk, "backward": (cp - 1) * 4 * chunk}


def test_ring_bytes_per_layer_and_direction() -> None:
    check_ring_bytes()


def test_ring_bytes_check_catches_missing_key_value_gradients(monkeypatch) -> None:
    """Planted bug: the backward ring passes keys and values but not their gradients."""
    real = ring_module.ring_exchange_bytes
    monkeypatch.setattr(ring_module, "ring_exchange_bytes", lambda kv, dkv, cp, phase: real(kv, 0, cp, phase))
    with pytest.raises(AssertionError):
        check_ring_bytes()


# ----------------------------------------------------------------------------- gradient group


def check_gradient_group(dp: int = 2, cp: int = 2) -> None:
    """The gradients are reduced over dp × cp GPUs with the payload of a run without context
    parallelism, and ZeRO-1's optimizer state is 1/(dp·cp) on each GPU."""
    plain = _card_run(dp=dp, zero=1, representatives=True).graph.meta["hybrid"]
    split = _card_run(dp=dp, cp=cp, zero=1, representatives=True)
    graph, hybrid = split.graph, split.graph.meta["hybrid"]
    sizes = {graph.attrs[t].get("group_size") for t, k in enumerate(graph.kind)
             if k == "collective" and (graph.attrs[t] or {}).get("group_kind") == "dp"}
    assert sizes == {dp * cp}
    assert hybrid["collectives_dp0_tp0"]["dp"]["payload_bytes"] == plain["collectives_dp0_tp0"]["dp"]["payload_bytes"]
    whole = _card_run(dp=1, representatives=True).graph.meta["hybrid"]["memory"][0]["optimizer_bytes"]
    assert hybrid["memory"][0]["optimizer_bytes"] == pytest.approx(whole / (dp * cp), rel=1e-6)


def test_gradients_are_reduced_over_dp_times_cp() -> None:
    check_gradient_group()


def test_gradient_group_check_catches_a_dp_only_group(monkeypatch) -> None:
    """Planted bug: the gradient group is the data-parallel replicas only."""
    monkeypatch.setattr(RankMap, "dp_group", lambda self, t, s: tuple(self.rank(d * self.cp, t, s)
                                                                      for d in range(self.dp)))
    with pytest.raises(AssertionError):
        check_gradient_group()


# ----------------------------------------------------------------------------- activation memory


def check_activations_divided(cp: int = 4) -> None:
    """Per layer, the activations one rank keeps for backward are 1/cp of a run without context
    parallelism (every dimension here divides: exactly)."""
    whole = _card_run(dp=1, representatives=True).graph.meta["hybrid"]["recompute"][
        "activations_into_backward_bytes"]
    split = _card_run(cp=cp, representatives=True).graph.meta["hybrid"]["recompute"][
        "activations_into_backward_bytes"]
    assert whole and all(w > 0 for w in whole)
    assert [w // cp for w in whole] == split and all(w % cp == 0 for w in whole)


def test_activation_memory_is_divided_by_cp() -> None:
    check_activations_divided()


def test_activation_check_catches_activations_left_whole(monkeypatch) -> None:
    """Planted bug: context parallelism splits the time but not the activations."""
    real = composition_module.context_split

    def whole_buffers(trace, tpp, cp, comm_type):
        return replace(real(trace, tpp, cp, comm_type), shard_divisor=tpp.shard_divisor)

    monkeypatch.setattr(composition_module, "context_split", whole_buffers)
    with pytest.raises(AssertionError):
        check_activations_divided()


def test_tp_collectives_and_pipeline_sends_carry_one_cp_th() -> None:
    """The activations a tensor-parallel collective or a pipeline send carries are the rank's
    1/cp of the tokens."""
    def moved(**flags) -> tuple[int, int]:
        graph = _card_run(tp=2, pp=2, representatives=True, **flags).graph
        sends = sum(graph.nbytes[t] for t, k in enumerate(graph.kind)
                    if k == "transfer" and "direction" in (graph.attrs[t] or {}))
        return graph.meta["hybrid"]["collectives_dp0_tp0"]["tp"]["payload_bytes"], sends

    (tp1, pp1), (tp2, pp2) = moved(dp=1), moved(cp=2)
    assert tp1 > 0 and pp1 > 0 and (tp2, pp2) == (tp1 // 2, pp1 // 2)


def test_peak_memory_falls_with_cp() -> None:
    """Not exact (the exchange's buffers, the fp32 statistics), but well below: activations
    and temporaries of cp 4 under a third of cp 1's."""
    def rest(**flags) -> int:
        return _card_run(representatives=True, **flags).graph.meta["hybrid"]["memory"][0]["activations_peak_bytes"]

    assert rest(cp=4) < rest(dp=1) / 3


def check_exchange_buffers_in_the_plan(placement: str) -> None:
    """At every attention op the memory plan holds the exchange's buffers on top of the trace's
    buffers: exactly what the summary reports (``exchange_buffers_per_layer``), in the plan of
    buffer lifetimes (everything fits) and in the step-by-step one (``remote`` placement)."""
    import triosim.graph.memory.composition as memory

    def attention_steps(held: bool):
        trace, platform, strategy = configure({**CARD, "cp": 4, "representatives": True,
                                               "initial-placement": placement})
        with pytest.MonkeyPatch.context() as mp:
            if not held:
                mp.setattr(memory, "transient_bytes", lambda *args: 0)
            graph = simulate(trace, platform, strategy).graph
        tasks, occupancy = graph.meta["memory"][0]["occupancy"]
        phases = _attention(trace)
        steps = {graph.attrs[t]["op"]: int(b) for t, b in zip(tasks, occupancy) if (graph.attrs[t] or {}).get("op")
                 in phases}
        return steps, phases, graph.meta["hybrid"]["context_parallel"]["exchange_buffers_per_layer"]

    with_buffers, phases, held = attention_steps(True)
    without, _, _ = attention_steps(False)
    assert len(with_buffers) == 4 and held["forward"] > 0 and held["backward"] > 0
    assert {i: with_buffers[i] - without[i] for i in phases} == {i: held[phases[i]] for i in phases}


@pytest.mark.parametrize("placement", ["gpu", "remote"])
def test_the_exchange_buffers_are_in_the_memory_plan(placement: str) -> None:
    check_exchange_buffers_in_the_plan(placement)


def test_the_buffer_check_catches_a_plan_without_them(monkeypatch) -> None:
    import triosim.graph.memory.composition as memory

    monkeypatch.setattr(memory, "_exchange_bytes", lambda b, i, r: 0)
    with pytest.raises(AssertionError):
        check_exchange_buffers_in_the_plan("remote")


# ----------------------------------------------------------------------------- time and overlap


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A measured (not shape-timed) transformer trace: its times are divided, not re-costed."""
    path = write_synthetic_transformer(tmp_path_factory.mktemp("st") / "t",
                                       SyntheticTransformer(layers=2, batch_size=2, seq_len=16, heads=4))
    return load_trace(path, batch_size=2)


def _durations(graph) -> dict[tuple[int, int], float]:
    """(op, GPU) -> its compute seconds (a ring's partial attentions summed)."""
    out: dict[tuple[int, int], float] = {}
    for t, kind in enumerate(graph.kind):
        attrs = graph.attrs[t] or {}
        if kind == "compute" and isinstance(attrs.get("op"), int):
            key = (attrs["op"], graph.devices[t][0])
            out[key] = out.get(key, 0.0) + graph.duration[t]
    return out


def test_every_op_of_a_rank_takes_one_cp_th_of_its_time(synthetic) -> None:
    one = _durations(build_graph(synthetic, build_platform(num_gpus=1, topology="switch"), Strategy(dp=1)))
    cp = 2
    split = build_graph(synthetic, build_platform(num_gpus=cp, topology="switch"), Strategy(cp=cp, exact=True))
    got = _durations(split)
    for (i, _), seconds in one.items():
        if synthetic.ops[i].stage == "optimizer":
            continue  # the optimizer updates the whole model on every rank
        for gpu in range(cp):
            assert got[(i, gpu)] == pytest.approx(seconds / cp, rel=1e-12)


def _forward_ring_span(synthetic, bandwidth_gbps: float) -> tuple[float, float, float, int]:
    """(span of the first forward attention's partial steps on GPU 0, one transfer, one partial
    attention, cp) on a switch of ``bandwidth_gbps`` links."""
    cp = 4
    platform = build_platform(num_gpus=cp, topology="switch", bandwidth_gbps=bandwidth_gbps,
                              ptp_bandwidth_gbps=bandwidth_gbps, network="flow")
    graph = build_graph(synthetic, platform, Strategy(cp=cp, exact=True, collective_detail="macro"))
    sched = schedule(graph)
    first = min(i for i, a in _attention(synthetic).items() if a == FORWARD)
    steps = [t for t, k in enumerate(graph.kind) if k == "compute" and (graph.attrs[t] or {}).get("op") == first
             and graph.devices[t] == (0,) and (graph.attrs[t] or {}).get("microbatch") == 0]
    moves = [t for t, k in enumerate(graph.kind) if k == "transfer" and (graph.attrs[t] or {}).get("op_index") == first
             and graph.devices[t][1] == 0]
    assert len(steps) == cp and len(moves) == cp - 1
    span = sched.end[steps[-1]] - sched.start[steps[0]]
    return span, graph.duration[moves[0]], graph.duration[steps[0]], cp


@pytest.mark.parametrize("bandwidth_gbps", [1e-3, 1e3])
def test_the_ring_overlaps_each_exchange_with_the_partial_attention_before_it(synthetic, bandwidth_gbps) -> None:
    """Forward ring: partial 0 runs beside the first exchange, partial j waits for the chunk of
    exchange j, so the attention spans (cp−1)·max(T, A) + A: the exchanges show only when a
    transfer T is slower than a partial attention A (both cases here)."""
    span, transfer, step, cp = _forward_ring_span(synthetic, bandwidth_gbps)
    assert (transfer > step) == (bandwidth_gbps < 1)
    assert span == pytest.approx((cp - 1) * max(transfer, step) + step, rel=1e-9)


def test_the_overlap_check_catches_exchanges_serialised_with_attention(synthetic, monkeypatch) -> None:
    """Planted bug: each exchange waits for the partial attention before it (no overlap): the
    span becomes (cp−1)·(T + A) + A."""
    real = ring_module.exchange_waits

    def serialised(phase, j, ready, moved, sender, receiver):
        return [*real(phase, j, ready, moved, sender, receiver), *receiver[j - 1:j]]

    monkeypatch.setattr(ring_module, "exchange_waits", serialised)
    with pytest.raises(AssertionError):
        test_the_ring_overlaps_each_exchange_with_the_partial_attention_before_it(synthetic, 1e3)
