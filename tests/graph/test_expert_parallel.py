"""Expert parallelism (graph/expert): closed forms, each with the planted bug it catches.

- the all-to-all bytes per MoE layer and direction: T·k·h·2 bytes of permuted tokens a rank,
  (N−1)/N of them sent; the busiest link of the uniform all-to-all carries that, and the DAG's
  exact all-to-all takes the closed form's time;
- expert-parameter memory per GPU: the expert weights (and their optimizer state) ÷ ep;
- the expert-data-parallel gradient volume: expert gradients ÷ ep reduced over tp·dp/ep GPUs,
  the dense ones over dp as before;
- at --moe-imbalance 1 every expert rank does the grouped-GEMM work of one GPU holding every
  expert (T·k rows), and the busiest rank's load follows its closed form.
"""

from __future__ import annotations

import pytest

from triosim.config import configure
from triosim.graph.collectives.cost import collective_cost
from triosim.graph.collectives.group_comm import closed_form_seconds
from triosim.graph.expert import dispatch as dispatch_module
from triosim.graph.expert import plan as plan_module
from triosim.graph.expert.plan import alltoall_wire_bytes, busiest_rank_factor, flex_node_fraction
from triosim.simulation import simulate

# qwen3-30b-a3b: hidden 2048, 128 experts of 768, top 8; two layers at a short sequence.
SEQ, H, E, K, F, LAYERS, BF16 = 512, 2048, 128, 8, 768, 2, 2
ROUTED = SEQ * K * H * BF16  # permuted tokens of one sample on one rank, one MoE layer
EXPERT_PARAMS = LAYERS * E * 3 * H * F
CARD = {"model": "qwen3-30b-a3b", "num-layers": LAYERS, "gpu": "h100-sxm", "seq-len": SEQ, "global-batch": 8,
        "micro-batch-size": 1}


def _run(**flags):
    trace, platform, strategy = configure({**CARD, **flags})
    return simulate(trace, platform, strategy)


def _hybrid(**flags) -> dict:
    return _run(representatives=True, **flags).graph.meta["hybrid"]


# ----------------------------------------------------------------------------- all-to-all bytes


def test_closed_forms() -> None:
    assert alltoall_wire_bytes(800, 8) == 700 and alltoall_wire_bytes(800, 1) == 0
    assert busiest_rank_factor(128, 8, 1.0) == 1.0
    assert busiest_rank_factor(8, 8, 3.0) == 3.0  # one expert a rank: the busiest expert's load
    assert busiest_rank_factor(8, 1, 3.0) == pytest.approx(1.0)  # one rank holds them all: tokens conserved
    assert busiest_rank_factor(128, 8, 2.0) == pytest.approx((2 + 15 * 126 / 127) / 16)
    assert flex_node_fraction(8, 1) == 0.0
    assert flex_node_fraction(1, 4) == pytest.approx(0.75)  # one expert: 3/4 of tokens leave the node
    assert flex_node_fraction(8, 2) == pytest.approx((1 - 0.5 ** 8) / 8)  # once per node, not per expert


def check_alltoall_bytes(ep: int = 8) -> None:
    """Per MoE layer and direction, 2 exchanges (dispatch, combine) of T·k·h·2 bytes on a rank:
    2 layers × 4 all-to-alls, each sending (ep−1)/ep of its payload."""
    stats = _hybrid(dp=8, ep=ep)["collectives_dp0_tp0"]["ep"]
    assert stats["collectives"] == LAYERS * 4
    assert stats["payload_bytes"] == LAYERS * 4 * ROUTED
    assert stats["wire_bytes_per_gpu"] == pytest.approx(LAYERS * 4 * ROUTED * (ep - 1) / ep)


def test_all_to_all_bytes_per_moe_layer_and_direction() -> None:
    check_alltoall_bytes()


def test_alltoall_check_catches_tokens_sent_once_not_k_times(monkeypatch) -> None:
    """Planted bug: the un-permuted tokens exchanged (each token once, not once per expert)."""
    real = dispatch_module.exchanges
    monkeypatch.setattr(dispatch_module, "exchanges", lambda b, plan, e, frac, gpu: [
        (kind, group, b.size(e.tokens, frac)) for kind, group, _ in real(b, plan, e, frac, gpu)])
    with pytest.raises(AssertionError):
        check_alltoall_bytes()


def check_fp8_alltoall_bytes() -> None:
    """FP8 training: the dispatched rows are saved as fc1's FP8 copy, but they travel in bf16 and
    are quantized after the exchange (Megatron-Core's dispatchers send bf16), so every exchange
    still moves T·k·h·2 bytes; the allgather dispatcher's tokens too. On Hopper (current scaling)
    and on Blackwell (MXFP8, whose copies carry a scale byte per 32 elements)."""
    for gpu, recipe in (("h100-sxm", "current"), ("b200", "mxfp8")):
        fp8 = {"gpu": gpu, "dtype": "fp8", "fp8_recipe": recipe}
        stats = _hybrid(dp=8, ep=8, **fp8)["collectives_dp0_tp0"]["ep"]
        assert stats["payload_bytes"] == LAYERS * 4 * ROUTED
        stats = _hybrid(dp=8, ep=8, moe_token_dispatcher="allgather", **fp8)["collectives_dp0_tp0"]["ep"]
        assert stats["payload_bytes"] == LAYERS * 4 * 8 * SEQ * H * BF16


def test_fp8_tokens_travel_in_bf16() -> None:
    check_fp8_alltoall_bytes()


def test_fp8_check_catches_the_fp8_copy_sent(monkeypatch) -> None:
    """Planted bug: the dispatch sends the stored FP8 copy's bytes (half the bf16 rows)."""
    monkeypatch.setattr(plan_module.ExpertPlan, "wire_bytes", lambda self, e, stored, tokens=False: stored)
    with pytest.raises(AssertionError):
        check_fp8_alltoall_bytes()


def test_the_dag_reproduces_the_uniform_all_to_all_closed_form() -> None:
    """Exact build, 8 GPUs of one NVSwitch node: the first dispatch (nothing else on the links)
    spans the closed form's time, and its busiest link carries ROUTED·(N−1)/N."""
    result = _run(dp=8, ep=8, exact=True)
    graph, sched = result.graph, result.schedule
    ep_tasks = [t for t, kind in enumerate(graph.kind) if kind != "compute" and
                (graph.attrs[t] or {}).get("group_kind") == "ep"]
    first_op = min(graph.attrs[t]["op_index"] for t in ep_tasks)
    first = [t for t in ep_tasks if graph.attrs[t]["op_index"] == first_op and graph.attrs[t]["microbatch"] == 0]
    span = max(sched.end[t] for t in first) - min(sched.start[t] for t in first)
    group = tuple(range(8))
    assert span == pytest.approx(closed_form_seconds(result.platform, group, "all_to_all", ROUTED), rel=1e-9)
    cost = collective_cost(result.platform, group, "all_to_all", ROUTED)
    assert max(cost.link_bytes.values()) == pytest.approx(ROUTED * 7 / 8, rel=0.01)  # protocol overhead aside


# ----------------------------------------------------------------------------- memory


def check_expert_memory(ep: int = 8) -> None:
    """Weights: every expert parameter ÷ ep (bf16); optimizer state: its expert part ÷ ep."""
    whole = _hybrid(dp=8)["memory"][0]
    split = _hybrid(dp=8, ep=ep)["memory"][0]
    assert whole["weights_bytes"] - split["weights_bytes"] == pytest.approx(EXPERT_PARAMS * BF16 * (1 - 1 / ep),
                                                                            abs=64)
    per_param = whole["optimizer_bytes"] / (whole["weights_bytes"] / BF16)
    assert whole["optimizer_bytes"] - split["optimizer_bytes"] == pytest.approx(
        EXPERT_PARAMS * per_param * (1 - 1 / ep), rel=1e-6)


def test_expert_parameter_memory_per_gpu() -> None:
    check_expert_memory()


def test_memory_check_catches_expert_state_left_whole(monkeypatch) -> None:
    """Planted bug: only the expert weights are split, not their gradients and optimizer state."""
    monkeypatch.setattr(plan_module, "expert_buffers", lambda trace, params: set(params))
    with pytest.raises(AssertionError):
        check_expert_memory()


# ----------------------------------------------------------------------------- EDP gradients


def check_edp_gradients(dp: int = 8, ep: int = 4) -> None:
    """Expert gradients (fp32 as reduced) ÷ ep, all-reduced over dp/ep GPUs; dense gradients over dp."""
    result = _run(dp=dp, ep=ep, representatives=True)
    graph, hybrid = result.graph, result.graph.meta["hybrid"]
    edp = hybrid["collectives_dp0_tp0"]["edp"]
    assert edp["payload_bytes"] == EXPERT_PARAMS * 4 // ep
    assert edp["wire_bytes_per_gpu"] == pytest.approx(2 * (dp // ep - 1) / (dp // ep) * EXPERT_PARAMS * 4 / ep)
    sizes = {graph.attrs[t].get("group_size") for t, k in enumerate(graph.kind)
             if k == "collective" and "edp" in str(graph.attrs[t].get("collective", ""))}
    assert sizes == {dp // ep}
    plain = _hybrid(dp=dp)["collectives_dp0_tp0"]["dp"]["payload_bytes"]
    assert hybrid["collectives_dp0_tp0"]["dp"]["payload_bytes"] == plain - EXPERT_PARAMS * 4


def test_expert_gradients_are_reduced_over_the_expert_data_parallel_group() -> None:
    check_edp_gradients()


def test_edp_check_catches_the_data_parallel_group(monkeypatch) -> None:
    """Planted bug: the expert gradients reduced over the whole data-parallel group."""
    monkeypatch.setattr(dispatch_module, "edp_group", lambda ranks, ep, d, t, s, etp=1: ranks.dp_group(t, s))
    from triosim.graph.data import gradient_sync
    monkeypatch.setattr(gradient_sync, "edp_group", lambda ranks, ep, d, t, s, etp=1: ranks.dp_group(t, s))
    with pytest.raises(AssertionError):
        check_edp_gradients()


# ----------------------------------------------------------------------------- expert GEMMs


def _grouped_seconds(**flags) -> dict[int, float]:
    """Seconds of grouped-GEMM compute on each built GPU."""
    trace, platform, strategy = configure({**CARD, **flags})
    graph = simulate(trace, platform, strategy).graph
    names = [op.name for op in trace.ops]
    out: dict[int, float] = {}
    for t, kind in enumerate(graph.kind):
        op = (graph.attrs[t] or {}).get("op")
        if kind == "compute" and isinstance(op, int) and "rouped" in names[op]:
            out[graph.devices[t][0]] = out.get(graph.devices[t][0], 0.0) + graph.duration[t]
    return out


def check_equal_expert_work(ep: int = 8) -> None:
    """At --moe-imbalance 1 every expert rank's grouped GEMMs take the time of one GPU holding
    every expert (T·k rows either way); at 2 the busiest rank's factor times that."""
    whole = _grouped_seconds(dp=8, exact=True)
    split = _grouped_seconds(dp=8, ep=ep, exact=True)
    assert len(split) == 8 and max(split.values()) == pytest.approx(min(split.values()), rel=1e-12)
    assert split[0] == pytest.approx(whole[0], rel=1e-12)
    skew = _grouped_seconds(dp=8, ep=ep, moe_imbalance=2.0, representatives=True)
    assert skew[0] == pytest.approx(whole[0] * busiest_rank_factor(E, ep, 2.0), rel=1e-12)


def test_every_expert_rank_does_the_same_grouped_gemm_work() -> None:
    check_equal_expert_work()


def test_expert_work_check_catches_rows_divided_by_ep(monkeypatch) -> None:
    """Planted bug: each expert rank does 1/ep of the rows (tokens not multiplied by k/E·local)."""
    monkeypatch.setattr(plan_module, "busiest_rank_factor", lambda experts, ep, f: 1.0 / ep)
    with pytest.raises(AssertionError):
        check_equal_expert_work()


def test_under_tensor_parallelism_whole_experts_meet_over_tp_times_dp() -> None:
    """--tp 2 without --ep: every GPU holds every expert and routes its own tokens (sequence
    parallel), so the expert gradients are reduced over tp × dp = 8 GPUs, with no exchange.
    Planted bug caught by the group size: the TP ranks' expert gradients never summed (dp only)."""
    result = _run(dp=4, tp=2, sequence_parallel=True, representatives=True)
    graph, hybrid = result.graph, result.graph.meta["hybrid"]
    assert "ep" not in hybrid["collectives_dp0_tp0"]
    assert hybrid["collectives_dp0_tp0"]["edp"]["payload_bytes"] == EXPERT_PARAMS * 4
    sizes = {graph.attrs[t].get("group_size") for t, k in enumerate(graph.kind)
             if k == "collective" and "edp" in str(graph.attrs[t].get("collective", ""))}
    assert sizes == {8}


def _exchange_steps(held: bool) -> dict[int, int]:
    """Occupancy at each grouped-GEMM task with an exchange (GPU 0, representative build)."""
    from triosim.graph.expert.plan import expert_ops
    from triosim.graph.memory import composition as memory_module
    trace, platform, strategy = configure({**CARD, "dp": 8, "ep": 8, "representatives": True})
    with pytest.MonkeyPatch.context() as mp:
        if not held:
            mp.setattr(memory_module, "exchange_buffer_bytes", lambda b, plan, e, frac: 0)
        graph = simulate(trace, platform, strategy).graph
    tasks, occupancy = graph.meta["memory"][0]["occupancy"]
    ops = expert_ops(trace)[0]
    return {graph.attrs[t]["op"]: int(n) for t, n in zip(tasks, occupancy) if (graph.attrs[t] or {}).get("op") in ops}


def check_dispatch_buffers() -> None:
    """While an exchange runs its receive buffer (the rank's T·k·h·2 bytes) is held beyond the
    trace's buffers, at every grouped GEMM with an exchange (2 layers × 4)."""
    with_buffers, without = _exchange_steps(True), _exchange_steps(False)
    assert len(with_buffers) == LAYERS * 4
    assert {i: with_buffers[i] - without[i] for i in with_buffers} == dict.fromkeys(with_buffers, ROUTED)


def test_the_dispatch_buffers_are_in_the_memory_plan() -> None:
    check_dispatch_buffers()


def test_the_buffer_check_catches_a_plan_without_them(monkeypatch) -> None:
    from triosim.graph.memory import composition as memory_module
    monkeypatch.setattr(memory_module, "_exchange_bytes", lambda b, i, r: 0)
    with pytest.raises(AssertionError):
        check_dispatch_buffers()


def test_allgather_dispatcher_bytes() -> None:
    """allgather: the un-permuted tokens (T·h·2 bytes a rank) gathered from the ep ranks before
    fc1 and the outputs reduce-scattered after fc2: payload ep·T·h·2 per exchange."""
    ep = 8
    stats = _hybrid(dp=8, ep=ep, moe_token_dispatcher="allgather")["collectives_dp0_tp0"]["ep"]
    tokens = SEQ * H * BF16
    assert stats["collectives"] == LAYERS * 4 and stats["payload_bytes"] == LAYERS * 4 * ep * tokens
    assert stats["wire_bytes_per_gpu"] == pytest.approx(LAYERS * 4 * (ep - 1) * tokens)


def test_flex_dispatcher_sends_each_token_once_per_node() -> None:
    """flex over two nodes of 8 (ep 16): per exchange an all-to-all inside the node (R) and one
    between the nodes of R·(1 − 2^−k)/k (each token once to the other node, not once per expert
    there); the plain all-to-all sends R·15/16, most of it between the nodes."""
    ep = 16
    flex = _hybrid(dp=16, ep=ep, moe_token_dispatcher="flex", global_batch=16)["collectives_dp0_tp0"]["ep"]
    frac = flex_node_fraction(K, 2)
    assert frac == pytest.approx((1 - 0.5 ** K) / K)
    assert flex["collectives"] == LAYERS * 4 * 2
    assert flex["wire_bytes_per_gpu"] == pytest.approx(LAYERS * 4 * ROUTED * (7 / 8 + frac), rel=1e-6)
    plain = _hybrid(dp=16, ep=ep, global_batch=16)["collectives_dp0_tp0"]["ep"]
    assert plain["wire_bytes_per_gpu"] == pytest.approx(LAYERS * 4 * ROUTED * 15 / 16)


# ----------------------------------------------------------------------------- expert tensor parallelism


def test_expert_groups_with_expert_tensor_parallelism() -> None:
    """etp innermost over the flattened ranks x = t + tp·d, then ep, then edp."""
    from triosim.graph.expert.dispatch import edp_group, ep_group, etp_group
    from triosim.graph.rank_map import RankMap
    ranks = RankMap(dp=4, tp=2, pp=1, order=("tp", "dp", "pp"))
    assert etp_group(ranks, 2, 1, 1, 0) == (2, 3)
    assert ep_group(ranks, 2, 0, 0, 0, etp=2) == (0, 2) and ep_group(ranks, 2, 0, 1, 0, etp=2) == (1, 3)
    assert edp_group(ranks, 2, 0, 0, 0, etp=2) == (0, 4) and edp_group(ranks, 2, 3, 1, 0, etp=2) == (3, 7)


def test_expert_tensor_parallelism_bytes_and_memory() -> None:
    """--ep 4 --etp 2 on 8 GPUs: each exchange is an all-to-all of R over 4 GPUs and an
    all-gather (before the GEMM) or reduce-scatter (after it) of 2·R over 2; the experts are
    ÷ 8 on a GPU, as with --ep 8; no expert-gradient reduction (edp 1)."""
    ep, etp = 4, 2
    hybrid = _hybrid(dp=8, ep=ep, etp=etp)
    stats = hybrid["collectives_dp0_tp0"]["ep"]
    assert stats["collectives"] == LAYERS * 4 * 2
    assert stats["payload_bytes"] == LAYERS * 4 * (ROUTED + etp * ROUTED)
    assert stats["wire_bytes_per_gpu"] == pytest.approx(LAYERS * 4 * (ROUTED * (ep - 1) / ep + ROUTED * (etp - 1)))
    assert "edp" not in hybrid["collectives_dp0_tp0"]
    assert hybrid["memory"][0]["weights_bytes"] == _hybrid(dp=8, ep=8)["memory"][0]["weights_bytes"]
    assert hybrid["expert_parallel"]["etp"] == etp


# ----------------------------------------------------------------------------- shared expert overlap


def _dispatch_and_shared(overlap: bool):
    """(start of the first forward dispatch, end of the shared expert's compute before it,
    iteration) for DeepSeek-V3's first MoE layer (layer 4) on 8 GPUs, --ep 8."""
    from triosim.compute.op_kinds import base_name
    flags = {"model": "deepseek-v3", "num-layers": 4, "mtp-layers": 0, "gpu": "h100-sxm", "seq-len": SEQ,
             "global-batch": 8, "micro-batch-size": 1, "dp": 8, "ep": 8, "representatives": True,
             "moe-shared-expert-overlap": overlap}
    trace, platform, strategy = configure(flags)
    result = simulate(trace, platform, strategy)
    graph, sched = result.graph, result.schedule
    names = [base_name(op.name) for op in trace.ops]
    permute = names.index("moe::permute")
    fc1 = names.index("_grouped_mm")
    shared = set(range(permute + 1, fc1))  # the shared expert, written between them
    assert {names[i] for i in shared} == {"linear", "SwiGLUFunction"}
    dispatch = min(sched.start[t] for t, k in enumerate(graph.kind) if k == "collective"
                   and (graph.attrs[t] or {}).get("op_index") == fc1 and graph.attrs[t].get("microbatch") == 0)
    ends = [sched.end[t] for t, k in enumerate(graph.kind) if k == "compute" and graph.attrs[t].get("microbatch") == 0
            and shared & set(graph.attrs[t].get("ops") or (graph.attrs[t].get("op"),))]
    return dispatch, max(ends), result.makespan_s


def test_the_shared_expert_runs_while_the_tokens_are_dispatched() -> None:
    """--moe-shared-expert-overlap: the dispatch starts before the shared expert's compute ends
    and the iteration is shorter; without it the dispatch waits for the shared expert."""
    start, shared_end, overlapped = _dispatch_and_shared(True)
    assert start < shared_end
    start, shared_end, serial = _dispatch_and_shared(False)
    assert start >= shared_end
    assert overlapped < serial


def test_exchange_bytes_with_several_micro_batches() -> None:
    """4 micro-batches of one sample per replica: every exchange still carries one sample's
    T·k·h·2 bytes. Planted bug caught: the permuted tokens written [T·k, h] without the batch as
    their leading dimension, which batch scaling then leaves at the traced batch (each exchange
    and each permuted buffer 4× too small)."""
    stats = _hybrid(dp=8, ep=8, global_batch=32)["collectives_dp0_tp0"]["ep"]
    assert stats["collectives"] == LAYERS * 4 * 4
    assert stats["payload_bytes"] == LAYERS * 4 * 4 * ROUTED
