"""``--moe-a2a-overlap`` (Megatron-Core's ``--overlap-moe-expert-parallel-comm``, the combined
1F1B schedule): which blocks run together, and the all-to-alls that then run beside another
micro-batch's compute, as closed forms each catching the planted bug named."""

from __future__ import annotations

import pytest

from triosim.config import configure
from triosim.errors import ConfigError
from triosim.graph.pipeline.schedules import (
    BACKWARD,
    FORWARD,
    combined_pairs,
    interleaved_order,
    interleaved_warmup,
)
from triosim.simulation import simulate

LAYERS, MICRO = 2, 4
CARD = {"model": "qwen3-30b-a3b", "num-layers": LAYERS, "gpu": "h100-sxm", "seq-len": 512, "global-batch": 8 * MICRO,
        "micro-batch-size": 1, "dp": 8, "ep": 8, "representatives": True}


def test_interleaved_pairs_are_the_steady_state() -> None:
    """Interleaved: after the warm-up's forward blocks, each forward with the backward after it
    (``combined_1f1b_schedule_for_interleaved_pipelining``): total − warm-up pairs, none in the
    warm-up or the cool-down."""
    for rank in (0, 1, 3):
        order = interleaved_order(4, 8, rank, 2)
        warm = interleaved_warmup(4, 8, rank, 2)
        pairs = combined_pairs(order, warm)
        firsts = sorted(a for a, role in pairs.items() if role == 0)
        assert len(firsts) == 8 * 2 - warm and firsts[0] == warm
        assert all(order[a][0] == FORWARD and order[a + 1][0] == BACKWARD and pairs[a + 1] == 1 for a in firsts)


def test_one_stage_pairs_each_backward_with_the_next_forward() -> None:
    """No pipeline (F0 B0 F1 B1 …): B_k with F_k+1 (``combined_1f1b_schedule_for_no_pipelining``);
    the first forward and the last backward alone."""
    order = [(ph, r, 0) for r in range(MICRO) for ph in (FORWARD, BACKWARD)]
    assert combined_pairs(order, None) == {1: 0, 2: 1, 3: 0, 4: 1, 5: 0, 6: 1}


def _beside_other_compute(**flags) -> tuple[int, int, float, float]:
    """(all-to-alls on GPU 0, those running while GPU 0 computes another micro-batch's ops,
    exposed EP ms, iteration s)."""
    trace, platform, strategy = configure({**CARD, **flags})
    result = simulate(trace, platform, strategy)
    g, sch = result.graph, result.schedule
    ep = [i for i, k in enumerate(g.kind) if k == "collective" and (g.attrs[i] or {}).get("group_kind") == "ep"
          and 0 in g.devices[i]]
    compute = [i for i, k in enumerate(g.kind) if k == "compute" and 0 in g.devices[i]]
    beside = sum(any(g.attrs[c].get("microbatch") != g.attrs[e]["microbatch"] and sch.start[c] < sch.end[e]
                     and sch.end[c] > sch.start[e] for c in compute) for e in ep)
    return len(ep), beside, result.time_breakdown()["mean"]["exposed_ep_ms"], result.makespan_s


def test_the_all_to_alls_run_beside_the_other_blocks_compute() -> None:
    """4 micro-batches, one stage: 4 all-to-alls per MoE layer and micro-batch (dispatch and
    combine, forward and backward), 2·4·MICRO on a GPU. Without the flag none runs beside another
    micro-batch's compute (one chain: each waits for its own block); with it all but those of
    the first forward and the last backward block (unpaired: 2 × 2 per layer). The planted bug:
    the pair's second block chained after the first (old code) leaves 0 beside."""
    total, beside, exposed, took = _beside_other_compute()
    assert (total, beside) == (4 * LAYERS * MICRO, 0)
    total_o, beside_o, exposed_o, took_o = _beside_other_compute(**{"moe-a2a-overlap": True})
    assert (total_o, beside_o) == (total, total - 2 * 2 * LAYERS)
    assert exposed_o < exposed and took_o < took


@pytest.mark.parametrize("flags, message", [
    ({"ep": 1}, "needs expert parallelism"),
    ({"dp": 4, "ep": 4, "pp": 2, "global-batch": 16}, "needs --schedule interleaved"),
    ({"moe-token-dispatcher": "allgather"}, "alltoall or flex"),
    ({"moe-shared-expert-overlap": True}, "leave out --moe-shared-expert-overlap"),
    ({"dtype": "fp32"}, "needs a 16-bit model"),
    ({"mtp-layers": 2}, "at most one multi-token-prediction layer"),
])
def test_megatrons_conditions(flags, message) -> None:
    with pytest.raises(ConfigError, match=message):
        trace, platform, strategy = configure({**CARD, "moe-a2a-overlap": True, **flags})
        simulate(trace, platform, strategy)


def test_megatrons_flag_translates() -> None:
    from triosim.config.megatron_args import translate_argv

    result = translate_argv(["run", "--megatron-args", "--overlap-moe-expert-parallel-comm"])
    assert "--moe-a2a-overlap" in result.argv and not result.not_modelled


def _expert_backward(flags: dict) -> tuple[dict, float, float]:
    """GPU 0's backward grouped-GEMM tasks by micro-batch (their seconds, in program order), its
    compute seconds in all, and the iteration."""
    trace, platform, strategy = configure({**CARD, "moe-a2a-overlap": True, **flags})
    result = simulate(trace, platform, strategy)
    g = result.graph
    by_mb: dict = {}
    total = 0.0
    for t, kind in enumerate(g.kind):
        if kind != "compute" or 0 not in g.devices[t]:
            continue
        total += g.duration[t]
        if "GroupedMmBackward0" in g.label[t]:
            by_mb.setdefault(g.attrs[t]["microbatch"], []).append(g.duration[t])
    return by_mb, total, result.makespan_s


def test_delayed_weight_gradients_run_beside_the_combine() -> None:
    """--delay-wgrad-compute: per MoE layer and micro-batch, fc2's backward runs its data
    gradient (half its products) in place, fc1's its data gradient, then one task the two weight
    gradients, (fc1 + fc2) / 2, beside the combine's gradient exchange: the GPU's compute seconds
    are unchanged, the iteration shorter. The planted bug: fc2's weight gradient left in place
    (the deferred task fc1 / 2)."""
    plain, total, took = _expert_backward({})
    delayed, total_d, took_d = _expert_backward({"delay-wgrad-compute": True})
    assert total_d == pytest.approx(total, rel=1e-12) and took_d < took
    for r, durs in plain.items():
        want = []
        for fc2, fc1 in zip(durs[::2], durs[1::2]):
            want += [fc2 / 2, fc1 / 2, (fc1 + fc2) / 2]
        assert delayed[r] == pytest.approx(want, rel=1e-12)
    with pytest.raises(ConfigError, match="needs --moe-a2a-overlap"):
        configure({**CARD, "delay-wgrad-compute": True})


def test_the_last_stages_backward_waits_for_its_own_forward() -> None:
    """Interleaved over 2 ranks: the last stage's steady state pairs a micro-batch's forward with
    its own backward (Megatron-Core's combined step there), which needs the forward's loss.
    Every backward op of a micro-batch on the last stage starts after the last forward op of
    that micro-batch there ended. The planted bug (the old code): the backward chain started
    beside the forward, from the pair's start."""
    flags = {**CARD, "num-layers": 4, "dp": 4, "ep": 4, "pp": 2, "schedule": "interleaved", "virtual-stages": 2,
             "global-batch": 4 * MICRO, "moe-a2a-overlap": True}
    trace, platform, strategy = configure(flags)
    result = simulate(trace, platform, strategy)
    g, sch = result.graph, result.schedule
    last = max((g.attrs[i] or {}).get("stage_index", -1) for i in range(len(g)))
    ends: dict[int, float] = {}
    starts: dict[int, float] = {}
    for i, kind in enumerate(g.kind):
        a = g.attrs[i] or {}
        if kind != "compute" or a.get("stage_index") != last or a.get("microbatch") is None:
            continue
        backward = "Backward" in g.label[i] or "grad" in g.label[i]
        mb = a["microbatch"]
        if backward:
            starts[mb] = min(starts.get(mb, float("inf")), sch.start[i])
        else:
            ends[mb] = max(ends.get(mb, 0.0), sch.end[i])
    assert sorted(starts) == list(range(MICRO)) == sorted(ends)
    assert all(starts[mb] >= ends[mb] for mb in range(MICRO)), (starts, ends)
