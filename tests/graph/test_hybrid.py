"""Hybrid DP × TP × PP builder: presets equal the case builders, representatives equal the exact
build, rank mapping, ZeRO closed forms, and the DAG invariants (hypothesis, with planted bugs)."""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triosim.graph import build_graph
from triosim.graph.data import gradient_sync
from triosim.graph.data.zero import buffer_roles
from triosim.graph.pipeline import rank_program
from triosim.graph.rank_map import RankMap
from triosim.graph.replica_symmetry import representatives_refused
from triosim.graph.strategy import Strategy
from triosim.graph.tensor import plans as tensor_plans
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.schedule.validate import dag_violations, schedule_violations
from triosim.trace import load_trace
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

REPO = Path(__file__).resolve().parents[2]
GPT = REPO / "sample_trace" / "gpt-cpu-bs8"


def _synthetic(tmp: str | Path, layers: int = 4, seed: int = 1, foreach: bool = False):
    path = write_synthetic_trace(Path(tmp) / f"syn{layers}-{seed}-{foreach}",
                                 SyntheticModel(layers=layers, batch_size=8, seed=seed, foreach_optimizer=foreach))
    return load_trace(path, batch_size=8)


def _run(trace, n, strategy, **platform):
    p = build_platform(num_gpus=n, **platform)
    g = build_graph(trace, p, strategy)
    return g, schedule(g)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a))


# ----------------------------------------------------------------------------- presets


PRESETS = [  # (case, hybrid strategy kwargs, GPUs, micro-batch divisor): case 2 is DDP (buckets overlapped
    # with backward), case 4 the original's pipeline (sends beside compute)
    (2, {"dp": 8, "overlap_grad_reduce": True}, 8, None),
    (4, {"pp": 4, "pipeline_send": "overlapped"}, 4, 4),
    (3, {"tp": 4, "tp_style": "per-op"}, 4, None),
]


def _check_preset(trace, case, kw, n, div):
    mb = None if div is None else trace.batch_size // div
    ga, sa = _run(trace, n, Strategy(case=case, micro_batch_size=mb))
    for exact in (True, False, None):
        gh, sh = _run(trace, n, Strategy(micro_batch_size=mb, exact=exact, **kw))
        assert _close(sa.makespan, sh.makespan), (case, kw, exact, sa.makespan, sh.makespan)
        for dev in gh.meta["devices"]:
            assert ga.meta["memory"][dev]["peak_bytes"] == gh.meta["memory"][dev]["peak_bytes"]
    assert len(ga) == len(_run(trace, n, Strategy(micro_batch_size=mb, exact=True, **kw))[0])


@pytest.mark.parametrize("case, kw, n, div", PRESETS)
def test_presets_equal_case_builders_gpt(case, kw, n, div):
    _check_preset(load_trace(GPT, batch_size=8), case, kw, n, div)


@pytest.mark.parametrize("case, kw, n, div", PRESETS)
def test_presets_equal_case_builders_synthetic(case, kw, n, div, tmp_path):
    _check_preset(_synthetic(tmp_path, layers=5, seed=7), case, kw, n, div)


@pytest.mark.parametrize("case, kw, n, div", PRESETS)
def test_presets_equal_case_builders_vgg13(case, kw, n, div, vgg13_dir):
    _check_preset(load_trace(vgg13_dir, batch_size=128), case, kw, n, div)


@pytest.mark.parametrize("case, kw, n, div", PRESETS)
def test_presets_equal_case_builders_resnet50(case, kw, n, div, resnet50_dir):
    _check_preset(load_trace(resnet50_dir, batch_size=128), case, kw, n, div)


def test_single_gpu_hybrid_is_case_0():
    trace = load_trace(GPT, batch_size=8)
    _, a = _run(trace, 1, Strategy(case=0))
    _, b = _run(trace, 1, Strategy(dp=1))
    assert _close(a.makespan, b.makespan)


# ----------------------------------------------------------------------------- representatives


# A sample of the combinations up to 64 GPUs (all of them would take minutes): every axis alone,
# every pair, all three, and the 64-GPU corner; each with every ZeRO stage that changes the DAG.
COMBOS = [(2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (2, 1, 2), (1, 2, 2), (2, 2, 2), (4, 2, 2), (2, 4, 4),
          (4, 4, 4)]


@pytest.mark.parametrize("dp, tp, pp", COMBOS)
@pytest.mark.parametrize("topology", ["nvlink-cluster", "switch"])
def test_representatives_equal_exact(dp, tp, pp, topology, tmp_path):
    trace = _synthetic(tmp_path, layers=4, seed=3)
    for zero in (0, 1, 3):
        _check_representative(trace, dp, tp, pp, zero, topology)


@pytest.mark.parametrize("dp, tp, pp, zero", [(2, 2, 2, 0), (1, 4, 2, 1), (4, 2, 2, 3), (2, 1, 4, 2)])
def test_representatives_equal_exact_gpt(dp, tp, pp, zero):
    _check_representative(load_trace(GPT, batch_size=8), dp, tp, pp, zero, "nvlink-cluster")


def _check_representative(trace, dp, tp, pp, zero, topology):
    kw = dict(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch_size=2, schedule="1f1b", collective_detail="macro")
    n = dp * tp * pp
    _, exact = _run(trace, n, Strategy(exact=True, **kw), topology=topology, gpus_per_node=4)
    g, rep = _run(trace, n, Strategy(exact=False, **kw), topology=topology, gpus_per_node=4)
    assert _close(exact.makespan, rep.makespan), (kw, exact.makespan, rep.makespan)
    assert len(g.meta["devices"]) == pp


def test_representatives_build_one_pipeline():
    trace = load_trace(GPT, batch_size=8)
    g, _ = _run(trace, 64, Strategy(dp=4, tp=4, pp=4, micro_batch_size=2, exact=False), topology="nvlink-cluster")
    assert g.meta["devices"] == [0, 4, 8, 12]
    assert g.meta["hybrid"]["representatives"] is True
    # By default a mesh this small is built whole.
    g, _ = _run(trace, 64, Strategy(dp=4, tp=4, pp=4, micro_batch_size=2), topology="nvlink-cluster")
    assert len(g.meta["devices"]) == 64 and g.meta["hybrid"]["representatives"] is False


# ----------------------------------------------------------------------------- rank mapping


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.permutations(["tp", "pp", "dp"]))
def test_rank_map_is_a_bijection(dp, tp, pp, order):
    rm = RankMap(dp, tp, pp, tuple(order))
    seen = {rm.rank(d, t, s) for d in range(dp) for t in range(tp) for s in range(pp)}
    assert seen == set(range(dp * tp * pp))
    for g in range(dp * tp * pp):
        assert rm.rank(*rm.coords(g)) == g


def test_rank_map_default_puts_tp_groups_in_a_node():
    rm = RankMap(dp=4, tp=8, pp=2)
    for d in range(4):
        for s in range(2):
            group = rm.tp_group(d, s)
            assert len({g // 8 for g in group}) == 1
    assert rm.dp_group(0, 0) == (0, 16, 32, 48)
    assert RankMap(2, 2, 2, ("dp", "tp", "pp")).tp_group(0, 0) == (0, 2)


def test_collectives_run_on_their_group(tmp_path):
    trace = _synthetic(tmp_path, layers=4, seed=2)
    g, _ = _run(trace, 8, Strategy(dp=2, tp=2, pp=2, exact=True, collective_detail="macro"),
                topology="nvlink-cluster", gpus_per_node=4)
    rm = RankMap(2, 2, 2)
    tp_groups = {frozenset(rm.tp_group(d, s)) for d in range(2) for s in range(2)}
    dp_groups = {frozenset(rm.dp_group(t, s)) for t in range(2) for s in range(2)}
    kinds = Counter()
    for t, kind in enumerate(g.kind):
        a = g.attrs[t] or {}
        if kind == "collective":
            members = frozenset(g.devices[t])
            assert members in (tp_groups if a["group_kind"] == "tp" else dp_groups)
            kinds[a["group_kind"]] += 1
    assert kinds["tp"] > 0 and kinds["dp"] > 0


# ----------------------------------------------------------------------------- ZeRO


def _payload(g, kind: str) -> Counter:
    out: Counter = Counter()
    for t, k in enumerate(g.kind):
        a = g.attrs[t] or {}
        if k == "collective" and a.get("group_kind") == kind:
            out[a["op"]] += g.nbytes[t]
    return out


@pytest.mark.parametrize("zero, expect", [(0, {"all_reduce": 1}), (1, {"reduce_scatter": 1, "all_gather": 1}),
                                          (2, {"reduce_scatter": 1, "all_gather": 1}),
                                          (3, {"reduce_scatter": 1, "all_gather": 2})])
def test_zero_traffic_closed_form(zero, expect, tmp_path):
    """Payload per step in units of Ψ: all-reduce 2Ψ (ZeRO-0); ZeRO-1/2 reduce-scatter Ψ + all-gather Ψ;
    ZeRO-3 gathers the parameters before forward and before backward (2Ψ) and reduce-scatters Ψ."""
    trace = _synthetic(tmp_path, layers=4, seed=5)
    psi = trace.parameter_bytes
    g, _ = _run(trace, 4, Strategy(dp=4, zero=zero, bucket_mb=0.001, exact=False))
    assert dict(_payload(g, "dp")) == {op: k * psi for op, k in expect.items()}
    wire = g.meta["hybrid"]["collectives_dp0_tp0"]["dp"]["wire_bytes_per_gpu"]
    assert wire == pytest.approx((2 if zero < 3 else 3) * psi * 3 / 4, rel=1e-9)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_memory_closed_form(zero, tmp_path):
    trace = _synthetic(tmp_path, layers=4, seed=5)
    roles = buffer_roles(trace)
    w = sum(trace.tensors[k].bytes for k in roles.weights)
    gr = sum(trace.tensors[k].bytes for k in roles.gradients)
    o = sum(trace.tensors[k].bytes for k in roles.optimizer)
    assert w > 0 and gr > 0 and o > 0
    n = 4
    g, _ = _run(trace, n, Strategy(dp=n, zero=zero))
    (m,) = g.meta["hybrid"]["memory"]
    got = m["weights_bytes"] + m["gradients_bytes"] + m["optimizer_bytes"]
    expect = {0: w + gr + o, 1: w + gr + o / n, 2: w + (gr + o) / n, 3: (w + gr + o) / n}[zero]
    # Each buffer is rounded up to whole bytes per rank.
    assert expect <= got <= expect + len(trace.tensors)
    # Per-layer FSDP units: ZeRO-3 holds one or two units' gathered parameters at a time, not the
    # whole model's (one 25 MiB unit would gather it all, and then ZeRO-3 saves nothing over 2).
    peaks = [g.meta["memory"][0]["peak_bytes"] for zero in range(4)
             for g in [_run(trace, n, Strategy(dp=n, zero=zero, bucket_mb=0.001))[0]]]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > peaks[3]


# ----------------------------------------------------------------------------- invariants


@st.composite
def hybrid_configs(draw):
    model = SyntheticModel(layers=draw(st.integers(2, 5)), batch_size=8, width=draw(st.sampled_from([16, 64])),
                           seed=draw(st.integers(0, 500)), tp_fraction=draw(st.sampled_from([0.0, 0.5, 1.0])),
                           foreach_optimizer=draw(st.booleans()))
    dp, tp, pp = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    strategy = Strategy(
        dp=dp, tp=tp, pp=pp, zero=draw(st.integers(0, 3)), exact=draw(st.booleans()),
        micro_batch_size=draw(st.sampled_from([None, 2, 3])), schedule=draw(st.sampled_from(["gpipe", "1f1b"])),
        bucket_mb=draw(st.sampled_from([0.001, 25.0])), tp_style="per-op",
        rank_order=tuple(draw(st.permutations(["tp", "pp", "dp"]))),
        collective_detail=draw(st.sampled_from(["expanded", "macro"])),
        overlap_grad_reduce=draw(st.booleans()), pipeline_send=draw(st.sampled_from(["blocking", "overlapped"])),
    )
    topology = draw(st.sampled_from(["ring", "switch", "nvlink-cluster", "fully-connected"]))
    return model, strategy, topology


def gradient_payloads(g) -> Counter:
    """Payload of every gradient-bucket collective, by label: a macro/representative task's bytes
    (each of a collective's phase tasks carries the payload: counted once), or an expanded ring's
    transfer bytes / (phases × (n − 1))."""
    moved: Counter = Counter()
    senders: dict[str, set] = {}
    phases: dict[str, set] = {}
    counted: set[str] = set()  # collectives whose (first) macro task was counted
    for t, k in enumerate(g.kind):
        a = g.attrs[t] or {}
        if "bucket" not in a or a.get("group_kind") != "dp":
            continue
        label = a["collective"]
        if k == "collective":
            if label not in counted:
                moved[label] += g.nbytes[t]
            counted.add(label)
        elif k == "transfer":
            moved[label] += g.nbytes[t]
            senders.setdefault(label, set()).add(g.devices[t][0])
            phases.setdefault(label, set()).add(a["phase"])
    for label, n in ((lb, len(s)) for lb, s in senders.items()):
        moved[label] //= len(phases[label]) * (n - 1)
    return moved


def hybrid_violations(model, strategy, topology) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        trace = load_trace(write_synthetic_trace(tmp, model), batch_size=model.batch_size)
    dp, tp, pp = strategy.degrees(0)
    platform = build_platform(num_gpus=dp * tp * pp, topology=topology, gpus_per_node=2)
    if strategy.exact is False and representatives_refused(platform, RankMap(dp, tp, pp, tuple(strategy.rank_order))):
        strategy = replace(strategy, exact=None)  # refused there (tests/graph/test_representatives_presets.py)
    g, sched = _run(trace, dp * tp * pp, strategy, topology=topology, gpus_per_node=2)
    out = dag_violations(g) + schedule_violations(g, sched)
    r_count = math.ceil(trace.batch_size / (strategy.micro_batch_size or trace.batch_size))
    # Representatives build every GPU where the replicas are not alike (replica_symmetry).
    whole = not g.meta["hybrid"]["representatives"]
    replicas = dp * tp if whole else 1
    # Each forward/backward op once per micro-batch per built (dp, tp) rank.
    # A fused task (a run of ops with nothing entering or leaving mid-run) counts each of its ops.
    runs = Counter((op, g.attrs[t].get("microbatch")) for t, k in enumerate(g.kind) if k == "compute"
                   for op in g.attrs[t].get("ops", (g.attrs[t]["op"],)))
    for op in trace.ops:
        if op.stage == "optimizer":
            continue
        for r in range(r_count):
            if runs[(op.index, r)] != replicas:
                out.append(f"op {op.index} micro-batch {r} ran {runs[(op.index, r)]} times, not {replicas}")
    # Bytes per group: the gradient collectives of the DP groups carry every parameter's TP shard
    # exactly once (all-reduce at ZeRO-0, reduce-scatter above), per built TP rank.
    if dp > 1:
        plan = tensor_plans.tensor_plan(trace, tp, "per-op")
        shard = sum(-(-trace.tensors[p].bytes // plan.shard_divisor.get(p, 1)) for p in trace.parameters)
        got = sum(gradient_payloads(g).values())
        expect = shard * (tp if whole else 1)
        if got != expect:
            out.append(f"gradient collectives carry {got} bytes, not {expect}")
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hybrid_configs())
def test_hybrid_invariants(config):
    assert hybrid_violations(*config) == []


def test_bytes_invariant_catches_a_planted_bug(monkeypatch):
    """A builder that drops one stage's last gradient bucket must be caught."""
    real = gradient_sync._buckets
    monkeypatch.setattr(gradient_sync, "_buckets", lambda b, params, s: real(b, params, s)[:-1])
    config = (SyntheticModel(layers=3, batch_size=8, seed=1),
              Strategy(dp=2, tp=1, pp=1, bucket_mb=0.001, overlap_grad_reduce=True), "switch")
    assert any("gradient collectives" in v for v in hybrid_violations(*config))


def test_bytes_invariant_catches_a_planted_bug_without_overlap(monkeypatch):
    """Without --overlap-grad-reduce: a builder that drops one stage's bucket must be caught."""
    real = gradient_sync._stage_buckets
    monkeypatch.setattr(gradient_sync, "_stage_buckets", lambda b, params: real(b, params)[:-1])
    config = (SyntheticModel(layers=3, batch_size=8, seed=1), Strategy(dp=2, tp=1, pp=1), "switch")
    assert any("gradient collectives" in v for v in hybrid_violations(*config))


def test_invariants_catch_a_planted_bug(monkeypatch):
    """A builder that forgets the last micro-batch of one stage's ops must be caught."""
    real = rank_program.block_order

    def dropping(schedule, n, r, s):
        order = real(schedule, n, r, s)
        return order[:-1] if s == 0 and len(order) > 1 else order

    monkeypatch.setattr(rank_program, "block_order", dropping)
    config = (SyntheticModel(layers=3, batch_size=8, seed=1), Strategy(dp=2, tp=2, pp=1, micro_batch_size=4,
                                                                      tp_style="per-op"), "switch")
    assert any("ran" in v for v in hybrid_violations(*config))


# ----------------------------------------------------------------------------- Megatron volume


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_megatron_tp_volume_matches_the_closed_form(sequence_parallel):
    """Per layer and iteration, Megatron TP moves 4 all-reduces of the activation b·s·h (2 forward,
    2 backward), i.e. 8·(T−1)/T·b·s·h bytes per GPU; sequence parallelism turns each into a
    reduce-scatter + all-gather of the same total volume. The GPT sample: 4 layers, h = 256,
    s = 128, b = 8, fp32. Sequence parallelism also gathers each block's input again in backward
    (2 per layer). The vocabulary-parallel embedding and head add two b·s·h collectives (three
    with sequence parallelism: the head's input is gathered), and the cross-entropy three
    all-reduces of b·s fp32 values."""
    layers, h, s, b, t = 4, 256, 128, 8, 4
    act = b * s * h * 4
    loss = 3 * b * s * 4
    trace = load_trace(GPT, batch_size=8)
    g, _ = _run(trace, t, Strategy(tp=t, sequence_parallel=sequence_parallel))
    tp = g.meta["hybrid"]["collectives_dp0_tp0"]["tp"]
    assert g.meta["hybrid"]["tp_style"] == "megatron" and g.meta["hybrid"]["tp_blocks"] == 2 * layers
    if sequence_parallel:
        big = 8 * layers + 2 * layers + 3
        assert tp["collectives"] == big + 3
        assert tp["payload_bytes"] == big * act + loss
        assert tp["wire_bytes_per_gpu"] == pytest.approx(big * (t - 1) / t * act + 2 * (t - 1) / t * loss, rel=1e-12)
    else:
        assert tp["collectives"] == 4 * layers + 2 + 3
        assert tp["payload_bytes"] == (4 * layers + 2) * act + loss
        assert tp["wire_bytes_per_gpu"] == pytest.approx(2 * (t - 1) / t * ((4 * layers + 2) * act + loss), rel=1e-12)
