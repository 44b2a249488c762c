"""`triosim trace repeat` / `--num-layers`: finding the repeated layer, closed forms of the
repeated trace (op counts, parameter bytes, case 0 time), intact data flow, property tests on
synthetic transformers with planted bugs, and one-line errors."""

from __future__ import annotations

import csv
import json
import tempfile
from dataclasses import fields, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triosim.tracer.validate import check_trace_dir

import triosim.trace.repeat as tr
import triosim.trace.repeat_rows as rows_module
from triosim import build_platform, simulate
from triosim.cli.console import main
from triosim.errors import TraceError
from triosim.graph.strategy import Strategy
from triosim.graph.tensor.megatron import plan_tensor_parallel
from triosim.trace import Trace, load_trace
from triosim.trace.synthetic_transformer import (
    SyntheticTransformer,
    write_synthetic_transformer,
)

GPT = Path(__file__).resolve().parents[1] / "sample_trace" / "gpt-cpu-bs8"
RESNET = Path(__file__).resolve().parents[1] / "sample_trace" / "resnet18-cpu-bs16"
# GPT sample: d_model h = 256, fc width f = 1024, vocab V = 4096, sequence S = 128, fp32.
H, F, V, S = 256, 1024, 4096, 128
LAYER_PARAM_BYTES = 4 * (4 * H * H + 4 * H + 2 * H * F + F + H + 4 * H)  # attention, MLP, 2 LayerNorms
OTHER_PARAM_BYTES = 4 * (V * H + S * H + 2 * H + V * H)  # embeddings, final LayerNorm, LM head


@pytest.fixture(scope="module")
def gpt() -> Trace:
    return load_trace(GPT, batch_size=8)


@pytest.fixture(scope="module")
def gpt96(tmp_path_factory) -> tuple[Path, Trace]:
    out = tmp_path_factory.mktemp("gpt96")
    tr.repeat_trace_dir(GPT, out, 96)
    return out, load_trace(out, batch_size=8)


def flow_signature(trace: Trace) -> list[tuple]:
    """The data flow as op indices and sizes, independent of tensor IDs."""
    return [(op.name, op.stage, tuple(sorted(trace.producer.get(k, -1) for k in trace.reads[i])),
             tuple(trace.tensors[k].bytes for k in trace.reads[i]),
             tuple(trace.tensors[k].bytes for k in trace.writes[i]), trace.forward_partner[i])
            for i, op in enumerate(trace.ops)]


def assert_same_trace(got: Trace, want: Trace) -> None:
    """Equal field by field, and every mapping in the same order (outputs iterate them); the
    facts derived on first use too."""
    for f in fields(Trace):
        if not f.compare:  # caches of facts derived on first use: compared below
            continue
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert a == b, f"in-memory repeat differs from the written trace in {f.name}"
        if isinstance(a, dict):
            assert list(a) == list(b), f"in-memory repeat orders {f.name} differently"
    assert list(got.consumers.items()) == list(want.consumers.items())
    assert got.forward_partner == want.forward_partner
    assert list(got.grad_ready_op.items()) == list(want.grad_ready_op.items())


# ----------------------------------------------------------------------------- the GPT sample


def test_gpt_layers_found(gpt):
    layout = tr.find_layers(gpt)
    assert layout.count == 4
    names = [gpt.ops[i].name.split("::")[-1] for i in layout.forward[0]]
    assert names == ["layer_norm", "linear", "linear", "linear", "scaled_dot_product_attention", "linear", "add",
                     "layer_norm", "linear", "gelu", "linear", "add"]
    assert all(len(b) == 12 for b in layout.backward) and len(layout.foreach) == 8
    assert all(len(s) == 16 for s in layout.slots)  # 16 parameters per layer


def test_gpt_96_layers_closed_forms(gpt, gpt96):
    _, big = gpt96
    layout = tr.find_layers(gpt)
    per_layer = len(layout.ops(0))
    assert per_layer == 24
    assert len(big.ops) == len(gpt.ops) + (96 - 4) * per_layer == 2327
    assert gpt.parameter_bytes == OTHER_PARAM_BYTES + 4 * LAYER_PARAM_BYTES
    assert big.parameter_bytes == OTHER_PARAM_BYTES + 96 * LAYER_PARAM_BYTES
    # The layers' parameters grow 24-fold (96 / 4).
    assert big.parameter_bytes - OTHER_PARAM_BYTES == 24 * (gpt.parameter_bytes - OTHER_PARAM_BYTES)
    assert len(big.parameters) == len(gpt.parameters) + 92 * 16
    # Compute time: the non-layer ops plus 96 times the mean traced layer.
    layer_ops = {i for k in range(4) for i in (*layout.forward[k], *layout.backward[k])}
    other = sum(op.duration_s for op in gpt.ops if op.index not in layer_ops and op.stage != "optimizer")
    mean_layer = sum(gpt.ops[i].duration_s for i in layer_ops) / 4
    big_no_opt = sum(op.duration_s for op in big.ops if op.stage != "optimizer")
    assert big_no_opt == pytest.approx(other + 96 * mean_layer, rel=1e-9)


def test_gpt_case0_time_is_linear_in_layers(gpt, gpt96):
    platform = build_platform(1)
    layout = tr.find_layers(gpt)
    layer_ops = {i for k in range(4) for i in (*layout.forward[k], *layout.backward[k])}
    mean_layer = sum(gpt.ops[i].duration_s for i in layer_ops) / 4
    t4 = simulate(gpt, platform, Strategy(case=0)).makespan_s
    t96 = simulate(gpt96[1], platform, Strategy(case=0)).makespan_s
    opt4 = sum(op.duration_s for op in gpt.ops if op.stage == "optimizer")
    opt96 = sum(op.duration_s for op in gpt96[1].ops if op.stage == "optimizer")
    # case 0 runs the ops back to back: 96 layers = 4 layers + 92 mean layers (+ the bigger optimizer)
    assert t96 - t4 == pytest.approx(92 * mean_layer + (opt96 - opt4), rel=1e-9)
    # the optimizer's _foreach ops grow with the parameter bytes they update
    assert opt96 > opt4


def test_gpt_same_depth_is_the_trace(gpt, tmp_path):
    tr.repeat_trace_dir(GPT, tmp_path, 4)
    again = load_trace(tmp_path, batch_size=8)
    assert flow_signature(again) == flow_signature(gpt)
    assert again.total_time_s == pytest.approx(gpt.total_time_s, rel=1e-12)
    assert [again.grad_ready_op[p] for p in again.parameters] == [gpt.grad_ready_op[p] for p in gpt.parameters]


def test_gpt_96_data_flow(gpt, gpt96):
    path, big = gpt96
    # Everything read comes from an op of the step or from outside it (parameters, optimizer
    # state, the batch): per layer as many outside tensors as a traced layer has.
    layout = tr.find_layers(gpt)
    per_layer_ext = (len(gpt.external) - len(big.external)) / (4 - 96)
    assert per_layer_ext == int(per_layer_ext) and per_layer_ext > 0
    # Each backward op of a copy is paired with the forward op at the same place in that copy.
    big_layout = tr.find_layers(big)
    assert big_layout.count == 96
    for k in (0, 50, 95):
        for off, i in enumerate(big_layout.backward[k]):
            want = gpt.forward_partner[layout.backward[0][off]]
            got = big.forward_partner[i]
            if want is None:
                assert got is None
            else:
                assert got == big_layout.forward[k][layout.forward[0].index(want)]
    # The fwd_op column points to the copy's own forward op.
    rows = tr.read_raw(path)
    ids = {r[0]: r[1] for r in rows.op_rows}
    col = rows.op_header.index("fwd_op")
    for r in rows.op_rows:
        if r[col] not in ("-1", ""):
            assert r[col] in ids
    # The tracer's own consistency checks (IDs defined, sizes agree, inputs produced earlier).
    assert check_trace_dir(path).problems == []
    meta = json.loads((path / "meta.json").read_text())
    assert meta["repeat"] == {"traced_layers": 4, "layers": 96, "ops_per_layer": 24}
    assert "96 layers" in meta["model_description"] and meta["ops"] == 2327


def test_gpt_96_megatron_closed_form(gpt96):
    plan = plan_tensor_parallel(gpt96[1], 4)
    assert len(plan.blocks) == 192
    blocks = [c for c in plan.collectives if plan.vocab is None or c.op not in (plan.vocab.embedding, plan.vocab.head,
                                                                                  *plan.vocab.loss, *plan.vocab.backward)]
    assert len(blocks) == 4 * 96 and {c.nbytes for c in blocks} == {8 * 128 * 256 * 4}
    assert len(plan.collectives) - len(blocks) == 4  # the embedding, the head and the cross-entropy, as unrepeated


def test_num_layers_flag(capsys):
    assert main(["run", "--trace-dir", str(GPT), "--num-layers", "4", "-q"]) == 0
    four = float(capsys.readouterr().out)
    assert main(["run", "--trace-dir", str(GPT), "-q"]) == 0
    assert float(capsys.readouterr().out) == four
    assert main(["run", "--trace-dir", str(GPT), "--num-layers", "8", "-q"]) == 0
    assert float(capsys.readouterr().out) > four


def test_num_layers_sweep_axis(tmp_path, capsys):
    out = tmp_path / "sweep.csv"
    assert main(["sweep", "--trace-dir", str(GPT), "--num-layers", "0,2,4", "--case", "0", "--out", str(out),
                 "--quiet"]) == 0
    capsys.readouterr()
    rows = {r["num-layers"]: r for r in csv.DictReader(out.read_text().splitlines())}
    assert rows["0"]["status"] == "invalid" and "--num-layers" in rows["0"]["reason"]
    two, four = float(rows["2"]["makespan_ms"]), float(rows["4"]["makespan_ms"])
    assert main(["run", "--trace-dir", str(GPT), "-q"]) == 0
    assert four == pytest.approx(float(capsys.readouterr().out), abs=1e-4) and two < four


def test_errors_are_one_line(tmp_path, capsys):
    assert main(["run", "--trace-dir", str(GPT), "--num-layers", "0", "-q"]) == 2
    assert "--num-layers" in capsys.readouterr().err
    assert main(["run", "--trace-dir", str(RESNET), "--num-layers", "8", "-q"]) == 2
    err = capsys.readouterr().err
    assert "no repeated transformer layer" in err and len(err.strip().splitlines()) == 1
    assert main(["trace", "repeat", "--layers", "8", "--in", str(GPT), "--out", str(GPT)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert main(["trace", "repeat", "--layers", "8", "--in", str(GPT), "--out", str(tmp_path / "g8")]) == 0
    assert "4 traced layers -> 8" in capsys.readouterr().out
    with pytest.raises(TraceError, match="no repeated transformer layer"):
        tr.find_layers(load_trace(RESNET, batch_size=16))


# ----------------------------------------------------------------------------- properties


@st.composite
def repeat_cases(draw):
    model = SyntheticTransformer(
        layers=draw(st.integers(2, 3)), hidden=8, heads=2, seq_len=4, batch_size=draw(st.sampled_from([1, 2])),
        fused_qkv=draw(st.booleans()), foreach_optimizer=draw(st.booleans()), seed=draw(st.integers(0, 1000)))
    return model, draw(st.integers(1, 6))


def check_repeat(model: SyntheticTransformer, layers: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = write_synthetic_transformer(Path(tmp) / "src", model)
        trace = load_trace(src, batch_size=model.batch_size)
        tr.repeat_trace_dir(src, Path(tmp) / "out", layers)
        big = load_trace(Path(tmp) / "out", batch_size=model.batch_size)
        problems = check_trace_dir(Path(tmp) / "out").problems
        assert_same_trace(tr.load_repeated(src, layers, batch_size=model.batch_size), replace(big, path=str(src)))
    assert problems == [], "data flow broken: " + problems[0] if problems else ""
    layout = tr.find_layers(trace)
    assert layout.count == model.layers
    n = model.layers
    per_layer = len(layout.ops(0))
    assert len(big.ops) == len(trace.ops) + (layers - n) * per_layer
    h, f = model.hidden, model.hidden * model.ffn_mult
    layer_params = 4 * (4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h)
    assert big.parameter_bytes - trace.parameter_bytes == (layers - n) * layer_params
    # Data flow: each copy brings as many outside tensors (parameters, optimizer state) as a
    # traced layer, and nothing else; every other read comes from an op.
    ext_per_layer = (len(trace.external) - len(
        [t for t in trace.external if not any(t in ids for ids in _layer_ids(trace, layout))])) / n
    assert len(big.external) == len(trace.external) + (layers - n) * ext_per_layer, "data flow broken"
    # Compute: the non-layer ops plus L mean layers.
    layer_ops = {i for k in range(n) for i in (*layout.forward[k], *layout.backward[k])}
    other = sum(op.duration_s for op in trace.ops if op.index not in layer_ops and op.stage != "optimizer")
    mean = sum(trace.ops[i].duration_s for i in layer_ops) / n
    got = sum(op.duration_s for op in big.ops if op.stage != "optimizer")
    assert got == pytest.approx(other + layers * mean, rel=1e-6, abs=1e-9), "layer time off the closed form"
    plan = plan_tensor_parallel(big, 2)
    assert [b.kind for b in plan.blocks] == ["attention", "mlp"] * layers


def _layer_ids(trace: Trace, layout: tr.LayerLayout) -> list[set[str]]:
    out = []
    for k in range(layout.count):
        ids = {t for i in layout.ops(k) for t in (*trace.ops[i].inputs, *trace.ops[i].outputs)}
        ids |= {layout.order[r] for r in layout.slots[k]}
        for f in layout.foreach:
            items = trace.ops[f].inputs
            m = len(layout.order)
            ids |= {items[c * m + r] for c in range(len(items) // m) for r in layout.slots[k]}
        out.append(ids)
    return out


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(repeat_cases())
def test_repeat_properties(case):
    check_repeat(*case)


PLANTED = (SyntheticTransformer(layers=2, hidden=8, heads=2, seq_len=4), 4)


def test_planted_repeat_passes():
    check_repeat(*PLANTED)


def test_catches_unlinked_copies(monkeypatch):
    """Bug: copies are not linked to each other (each reads a residual stream nobody writes)."""
    real = rows_module._Union.union

    def buggy(self, a, b):
        if a[0] != b[0]:
            return  # drops the links between consecutive copies
        real(self, a, b)

    monkeypatch.setattr(rows_module._Union, "union", buggy)
    with pytest.raises(AssertionError, match="data flow broken"):
        check_repeat(*PLANTED)


def test_catches_first_layer_times(monkeypatch):
    """Bug: copies take the first traced layer's times instead of the mean."""
    real = rows_module._mean_times
    monkeypatch.setattr(rows_module, "_mean_times", lambda raw, unit: real(raw, unit[:1]))
    with pytest.raises(AssertionError, match="closed form"):
        check_repeat(*PLANTED)


# ----------------------------------------------------------------------------- in memory


@pytest.mark.parametrize("layers,time_column", [(1, "nooverlap"), (7, "span"), (96, "nooverlap")])
@pytest.mark.parametrize("sample", [GPT, GPT.parent / "gpt-h16-cpu-bs8"])
def test_in_memory_repeat_equals_the_written_trace(sample, layers, time_column, tmp_path):
    """`--num-layers` builds the repeated trace in memory: it must be what `trace repeat` writes, read back."""
    tr.repeat_trace_dir(sample, tmp_path, layers, batch_size=8)
    want = load_trace(tmp_path, batch_size=8, time_column=time_column)
    got = tr.load_repeated(sample, layers, batch_size=8, time_column=time_column)
    assert_same_trace(got, replace(want, path=str(sample)))
    assert_same_trace(tr.load_repeated(sample, layers, batch_size=8, time_column=time_column, in_memory=False), got)


def test_in_memory_repeat_falls_back_on_quoted_cells(tmp_path):
    """A cell with a quote: only the CSV reader is sure to read it back, so the trace is written and read."""
    src = write_synthetic_transformer(tmp_path / "src", SyntheticTransformer(layers=2, hidden=8, heads=2, seq_len=4))
    rows = list(csv.reader((src / "trace.csv").read_text().splitlines()))
    name = rows[0].index("OperatorName")
    rows[-1][name] = 'aten::"quoted", op'
    with open(src / "trace.csv", "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    raw, trace = tr.read_raw(src), load_trace(src, batch_size=1)
    assert tr._repeated_trace(rows_module.copy_layers(raw, trace, 3), raw, trace, 1, "nooverlap") is None
    tr.repeat_trace_dir(src, tmp_path / "out", 3)
    got = tr.load_repeated(src, 3, batch_size=1)
    assert got.ops[-1].name == 'aten::"quoted", op'
    assert_same_trace(got, replace(load_trace(tmp_path / "out", batch_size=1), path=str(src)))


def test_in_memory_repeat_catches_a_planted_bug(tmp_path, monkeypatch):
    """Planted bug: the copies of a tensor lose its category (a weight's copies stop being parameters)."""
    monkeypatch.setattr(tr, "normalize_category", lambda text: "")
    with pytest.raises(AssertionError, match="in-memory repeat differs"):
        test_in_memory_repeat_equals_the_written_trace(GPT, 7, "span", tmp_path)


def test_in_memory_repeat_with_named_tensor_ids(tmp_path):
    """Tensor IDs that are not numbers: copies are named `<ID>.L<copy>`, in memory as on disk."""
    named = tmp_path / "named"
    named.mkdir()
    (named / "meta.json").write_text((GPT / "meta.json").read_text())
    for name, cols in (("trace.csv", ("Operator_input", "Operator_output")), ("tensor.csv", ("TensorID",))):
        rows = list(csv.reader((GPT / name).read_text().splitlines()))
        at = [rows[0].index(c) for c in cols]
        for row in rows[1:]:
            for c in at:
                cell = row[c].strip()
                ids = [x.strip() for x in cell.strip("[]").split(";") if x.strip()]
                row[c] = "[" + "; ".join(f"t{x}" for x in ids) + "]" if cell.startswith("[") else f"t{cell}"
        with open(named / name, "w", newline="") as fh:
            csv.writer(fh, lineterminator="\n").writerows(rows)
    tr.repeat_trace_dir(named, tmp_path / "out", 6)
    got = tr.load_repeated(named, 6, batch_size=8)
    assert any(t.endswith(".L6") for t in got.tensors)
    assert_same_trace(got, replace(load_trace(tmp_path / "out", batch_size=8), path=str(named)))


def test_in_memory_repeat_is_not_bound_by_the_reader_field_limit(tmp_path):
    """A deep repeat's `_foreach` optimizer rows list every layer's tensors: past the CSV reader's
    field limit reading the written trace back fails, building it in memory does not (here the
    limit is lowered so that 8 layers cross it; the real one, 128 KiB, is crossed near 400 layers
    of the 16-head sample)."""
    old = csv.field_size_limit(2000)  # the traced rows fit (1,245 characters), 8 layers' do not
    try:
        with pytest.raises(TraceError, match="field limit"):
            tr.load_repeated(GPT, 8, batch_size=8, in_memory=False)
        got = tr.load_repeated(GPT, 8, batch_size=8)
    finally:
        csv.field_size_limit(old)
    tr.repeat_trace_dir(GPT, tmp_path, 8, batch_size=8)
    assert_same_trace(got, replace(load_trace(tmp_path, batch_size=8), path=str(GPT)))
