"""Activation recomputation: closed forms (full adds exactly one forward per layer, selective one
attention core per layer), the re-run forward's TP collectives, the activations kept into
backward (Korthikanti et al. 2022's terms), re-runs on their own pipeline stage, bad input."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from triosim.errors import ConfigError
from triosim.graph import build_graph
from triosim.graph.recompute import activations_into_backward_bytes, recompute
from triosim.graph.strategy import Strategy
from triosim.graph.tensor.megatron import find_blocks
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.trace import load_trace
from triosim.trace.layers import find_layers
from triosim.trace.synthetic_transformer import SyntheticTransformer, write_synthetic_transformer

REPO = Path(__file__).resolve().parents[2]
GPT = REPO / "sample_trace" / "gpt-cpu-bs8"
RESNET = REPO / "sample_trace" / "resnet18-cpu-bs16"
MiB = 1 << 20


@pytest.fixture(scope="module")
def gpt():
    return load_trace(GPT, batch_size=8)


def _run(trace, n, strategy):
    g = build_graph(trace, build_platform(num_gpus=n), strategy)
    return g, schedule(g)


def check_one_forward_per_layer(trace) -> None:
    """On one GPU the iteration is a chain of ops: full recomputation adds exactly the layers'
    forward time, selective exactly the attention cores' time."""
    layout = find_layers(trace)
    blocks = [b for b in find_blocks(trace) if b.kind == "attention"]
    forward = sum(trace.ops[i].duration_s for f in layout.forward for i in f)
    cores = sum(trace.ops[j].duration_s for b in blocks for j in b.middle)
    base = _run(trace, 1, Strategy(pp=1))[1].makespan
    full = _run(trace, 1, Strategy(pp=1, recompute="full"))[1].makespan
    sel = _run(trace, 1, Strategy(pp=1, recompute="selective"))[1].makespan
    assert full - base == pytest.approx(forward, rel=1e-9, abs=1e-12), "full recompute is not one forward per layer"
    assert sel - base == pytest.approx(cores, rel=1e-9, abs=1e-12), "selective recompute is not one core per layer"


def test_one_forward_per_layer_gpt(gpt):
    check_one_forward_per_layer(gpt)
    rec = recompute(gpt, "full")
    assert len(rec.rerun_ops) == sum(len(f) for f in find_layers(gpt).forward) == 48
    assert {rec.trace.ops[i].name.split("::", 1)[0] for i in rec.rerun_ops} == {"rc0", "rc1", "rc2", "rc3"}


@pytest.mark.parametrize("fused", [False, True])
def test_one_forward_per_layer_synthetic(fused):
    with tempfile.TemporaryDirectory() as tmp:
        model = SyntheticTransformer(layers=3, hidden=16, heads=4, seq_len=8, fused_qkv=fused)
        trace = load_trace(write_synthetic_transformer(tmp, model), batch_size=model.batch_size)
    check_one_forward_per_layer(trace)


def test_catches_rerun_missing_an_op(monkeypatch, gpt):
    """Bug: each layer's re-run leaves out its last forward op."""
    import triosim.graph.recompute as rc

    real = rc.find_units
    monkeypatch.setattr(rc, "find_units", lambda trace, spec, cuts: [(f[:-1], at, st) for f, at, st in
                                                                     real(trace, spec, cuts)])
    with pytest.raises(AssertionError, match="not one forward per layer"):
        check_one_forward_per_layer(gpt)


def test_rerun_forward_collectives(gpt):
    """The re-run forward communicates as the first: 2 all-reduces per layer (4 with sequence
    parallelism: an all-gather and a reduce-scatter per block); selective re-runs the attention
    core, which has none."""
    def tp_calls(**kw):
        g, _ = _run(gpt, 4, Strategy(tp=4, **kw))
        return g.meta["hybrid"]["collectives_dp0_tp0"]["tp"]["collectives"]

    for sp, per_layer in ((False, 2), (True, 4)):
        none = tp_calls(sequence_parallel=sp)
        assert tp_calls(sequence_parallel=sp, recompute="full") == none + 4 * per_layer
        assert tp_calls(sequence_parallel=sp, recompute="selective") == none


def test_activations_kept_into_backward(gpt):
    """Korthikanti et al.'s per-layer terms: 34·sbh bytes in fp16 = 16 sbh values (2 bytes each)
    + two sbh dropout masks (1 byte) + the attention scores (5as/h). The sample (fp32, 4 bytes a
    value) has no dropout, and its fused attention keeps no scores but a second sbh output, so
    it keeps 17 sbh values, + LayerNorm means and deviations (4 × b·s) and the attention's
    log-sum-exp (b·a·s). Selective recomputation with sequence parallelism: Korthikanti's
    34·sbh/t, here (16 sbh + 4 b·s)/t (the re-run attention makes its second output and the
    log-sum-exp again); full: the layer input only, sbh (sbh/t with sequence parallelism)."""
    s, b, h, a, t = 128, 8, 256, 4, 4
    sbh = s * b * h * 4  # bytes of one fp32 [s, b, h] activation

    def kept(mode, tp=1, sp=False):
        g, _ = _run(gpt, tp, Strategy(tp=tp, sequence_parallel=sp, recompute=mode))
        return g.meta["hybrid"]["recompute"]["activations_into_backward_bytes"]

    assert kept("none") == [17 * sbh + 4 * b * s * 4 + b * a * s * 4] * 4
    assert kept("selective", tp=4, sp=True) == [(16 * sbh + 4 * b * s * 4) // t] * 4
    assert kept("full") == [sbh] * 4
    assert kept("full", tp=4, sp=True) == [sbh // t] * 4


def test_activations_helper_counts_backward_readers_only(gpt):
    layout = find_layers(gpt)
    per = activations_into_backward_bytes(gpt, layout.forward)
    assert len(per) == 4 and len(set(per)) == 1 and per[0] > 0


def test_reruns_stay_on_their_stage(gpt):
    """With a pipeline the re-runs of a layer that a stage cut splits are re-run stage by stage:
    each re-run on the stage of the op it repeats, and no re-made buffer crosses stages."""
    for mode in ("full", "selective"):
        g, _ = _run(gpt, 2, Strategy(pp=2, recompute=mode))
        assert g.meta["hybrid"]["pipeline_warnings"] == []
        names = [a.get("buffer") for a in g.attrs if a and "buffer" in a] if g.attrs else []
        assert names and not any(str(n).startswith("rc") for n in names), "a re-made buffer was sent between stages"
    from triosim.graph.composition import stage_plan
    from triosim.graph.recompute import fit_to_stages, straddling

    def plan_for(trace):
        return (stage_plan(trace, build_platform(2), Strategy(pp=2), [1.0], [0, 1]),)

    rec = recompute(gpt, "full")
    assert straddling(rec, plan_for(rec.trace)[0].stage)  # this sample's best cut falls inside a layer
    rec, (plan,) = fit_to_stages(gpt, rec, plan_for)
    assert not plan.warnings and len(rec.layers) > 4  # a layer re-run in two parts
    assert sorted(j for part in rec.layers for j in part) == sorted(j for f in find_layers(gpt).forward for j in f)
    for n in rec.rerun_ops:
        assert plan.stage[n] == plan.stage[rec.new_index[rec.origin[n]]], "a re-run left its stage"


def test_bad_input():
    with pytest.raises(ConfigError, match="--recompute must be"):
        Strategy(pp=1, recompute="some").validate(1)
    with pytest.raises(ConfigError, match="hybrid"):
        Strategy(case=0, recompute="full").validate(1)
    resnet = load_trace(RESNET, batch_size=16)
    with pytest.raises(ConfigError, match="--recompute full needs a transformer trace"):
        recompute(resnet, "full")


def test_cli_refuses_recompute_without_degrees(capsys):
    from triosim.cli.console import main

    assert main(["run", "--trace-dir", str(GPT), "--recompute", "full", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--recompute" in err[0] and "--dp/--tp/--pp" in err[0]
    assert main(["run", "--trace-dir", str(RESNET), "--dp", "2", "--recompute", "full", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a transformer trace" in err[0] and "resnet18-cpu-bs16" in err[0]


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_representatives_equal_exact(mode, capsys):
    """Re-runs and their collectives on one representative replica time as on every GPU (the
    original network model, where the two agree exactly)."""
    from triosim.cli.console import main

    base = ["run", "--trace-dir", str(GPT), "--dp", "2", "--tp", "2", "--pp", "2", "-micro-batch-size", "2",
            "--schedule", "1f1b", "--recompute", mode, "--sequence-parallel", "--topology", "nvlink-cluster",
            "--gpus-per-node", "4", "--collective-detail", "macro", "--network", "exclusive", "--collective-algo",
            "one-way-ring", "--collective-latency-us", "0", "-q"]
    times = []
    for flag in ("--exact", "--representatives"):
        assert main([*base, flag]) == 0
        times.append(float(capsys.readouterr().out))
    assert times[0] == times[1]


@pytest.mark.parametrize("build", ["--exact", "--representatives"])
def test_breakdown_counts_reruns_as_recompute(build, capsys):
    """The time breakdown's recompute part is the re-runs' time: on one GPU the layers' forward
    ops; on a mesh the same with every GPU built or one representative (re-runs are never fused
    with the backward ops after them)."""
    import json

    from triosim.cli.console import main

    gpt = load_trace(GPT, batch_size=8)
    forward_ms = sum(gpt.ops[i].duration_s for f in find_layers(gpt).forward for i in f) * 1e3
    assert main(["run", "--trace-dir", str(GPT), "--pp", "1", "--recompute", "full", "--json", "-"]) == 0
    mean = json.loads(capsys.readouterr().out)["breakdown"]["mean"]
    assert mean["recompute_ms"] == pytest.approx(forward_ms, abs=1e-6)
    assert main(["run", "--trace-dir", str(GPT), "--dp", "2", "--tp", "2", "--pp", "2", "-micro-batch-size", "2",
                 "--schedule", "1f1b", "--recompute", "full", "--topology", "switch", build, "--json", "-"]) == 0
    mean = json.loads(capsys.readouterr().out)["breakdown"]["mean"]
    # tp 2: each re-run at half its time (every layer op is in a block or, whole, in between)
    assert 0 < mean["recompute_ms"] < forward_ms
    assert mean["recompute_ms"] == pytest.approx(11.8190, abs=1e-3), "re-runs fused with other ops"
