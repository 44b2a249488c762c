"""Conversion of hand-made execution-trace + profiler JSON (no torch, no reference data needed)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from tracer_fixtures import GB, LS, TW, Y, build_step, write_pair
from triosim.tracer.cli import main
from triosim.tracer.convert import ConvertOptions, convert_trace
from triosim.tracer.csvout import TENSOR_HEADER, TRACE_HEADER, format_list, format_time
from triosim.tracer.etrace import parse_execution_trace
from triosim.tracer.kineto import parse_profiler_trace
from triosim.tracer.opschema import parse_schema
from triosim.tracer.validate import check_trace_dir, parse_list

EV = "autograd::engine::evaluate_function: "
KEPT_CUDA = [
    (1, "aten::conv2d", "forward"), (2, "aten::relu_", "forward"),
    (4, "aten::linear", "forward"), (5, "aten::cross_entropy_loss", "forward"),
    (6, "aten::ones_like", "forward"), (7, EV + "NllLossBackward0", "backward"),
    (8, EV + "LogSoftmaxBackward0", "backward"), (9, EV + "AddmmBackward0", "backward"),
    (14, EV + "ReluBackward0", "backward"), (15, EV + "ConvolutionBackward0", "backward"),
    (19, "aten::_foreach_lerp_", "optimizer"), (20, "aten::_foreach_addcdiv_", "optimizer"),
]


def convert(**flavour):
    built = build_step(**flavour)
    et = parse_execution_trace(built.graph, "graph.json")
    prof = parse_profiler_trace(built.profiler, "profiler.json")
    return convert_trace(et, prof), built


def by_name(tables, name):
    return next(o for o in tables.ops if o.name == name)


@pytest.mark.parametrize("layout", ["1.0.1", "1.1.1"])
@pytest.mark.parametrize("rf_ids", [False, True])
def test_ops_names_stages_and_ids(layout, rf_ids):
    tables, _ = convert(layout=layout, record_function_ids=rf_ids)
    assert [(o.op_id, o.name, o.stage) for o in tables.ops] == KEPT_CUDA
    assert tables.stats.pairing == ("record-function-id" if rf_ids else "aligned")
    assert tables.stats.unpaired_ops == 0
    # Ops without kernels are left out: the view, AccumulateGrad, TBackward0, ViewBackward0,
    # and the step-count increment on CPU tensors.
    assert tables.stats.dropped == {
        EV + "TBackward0": 1, EV + "ViewBackward0": 1,
        EV + "torch::autograd::AccumulateGrad": 4, "aten::_foreach_add_": 1,
        "aten::flatten": 1}


def test_pairing_is_by_identity_not_list_position():
    plain, _ = convert(layout="1.1.1", record_function_ids=True)
    shuffled, _ = convert(layout="1.1.1", record_function_ids=True, shuffle_events=True)
    assert plain.ops == shuffled.ops
    assert plain.tensors == shuffled.tensors
    # PyTorch 2.1 files (no record-function ids) with events in random file order.
    old, _ = convert(layout="1.0.1", record_function_ids=False, shuffle_events=True)
    assert [(o.name, o.cudatime_nooverlap) for o in old.ops] == \
        [(o.name, o.cudatime_nooverlap) for o in plain.ops]


def test_aligned_pairing_survives_calls_one_side_lacks():
    built = build_step(layout="1.0.1")
    # Drop the profiler event of the relu_ call and add one the ET never saw.
    events = built.profiler["traceEvents"]
    relu = next(e for e in events if e.get("name") == "aten::relu_")
    events.remove(relu)
    extra = dict(next(e for e in events if e.get("name") == "aten::linear"))
    extra.update({"name": "aten::unrelated", "ts": extra["ts"] - 0.5, "dur": 0.1,
                  "args": {"External id": 3}})
    events.append(extra)
    tables = convert_trace(parse_execution_trace(built.graph),
                           parse_profiler_trace(built.profiler))
    names = [o.name for o in tables.ops]
    assert "aten::relu_" not in names  # unpaired: no time, no kernels
    assert names.count("aten::linear") == 1
    assert by_name(tables, "aten::linear").cudatime_nooverlap == 40


def test_kernel_times_sum_and_span():
    tables, built = convert()
    conv = by_name(tables, "aten::conv2d")
    assert conv.cudatime_nooverlap == 120  # two kernels of 100 and 20 µs
    assert conv.cudatime == 121  # first start to last end, with the 1 µs gap between them
    for op in tables.ops:
        assert op.cudatime_nooverlap == built.kernels_by_top[op.name]
        assert op.cudatime >= op.cudatime_nooverlap


def test_cpu_profile_uses_op_durations_and_drops_no_work_ops():
    tables, _ = convert(layout="1.1.1", record_function_ids=True, cuda=False,
                        autograd_thread=False)
    assert tables.stats.time_source == "cpu"
    names = [o.name for o in tables.ops]
    # On the CPU the step-count increment is real work; views and AccumulateGrad are not.
    assert "aten::_foreach_add_" in names
    assert "aten::flatten" not in names
    assert not any("AccumulateGrad" in n or "TBackward0" in n or "ViewBackward0" in n
                   for n in names)
    for op in tables.ops:
        assert op.cudatime == op.cudatime_nooverlap > 0


def test_views_resolve_to_their_producer():
    tables, _ = convert()
    linear = by_name(tables, "aten::linear")
    assert linear.inputs == (Y.id, 22, 24)  # the flatten view 20 reads as the conv output 14
    relu_b = by_name(tables, EV + "ReluBackward0")
    addmm_b = by_name(tables, EV + "AddmmBackward0")
    # ViewBackward0 (dropped) reshaped the addmm gradient: its consumer reads the producer's id.
    assert relu_b.inputs[0] == addmm_b.outputs[0]


def _cudnn_batch_norm_step(monkeypatch):
    """The fixture step with a batch norm after relu_ as PyTorch records it on CUDA:
    cudnn_batch_norm views the weight, the view dies, and the next allocation (a 0-element
    tensor) gets the view's tensor id; a later op reads the weight."""
    import tracer_fixtures as tf

    bw, bb, rm, rv = (tf.T(300, 301, (4,)), tf.T(302, 303, (4,)), tf.T(304, 305, (4,)),
                      tf.T(306, 307, (4,)))
    out, mean, invstd = tf.T(308, 309, Y.shape), tf.T(310, 311, (4,)), tf.T(312, 313, (4,))
    weight_view = tf.T(314, 301, (4,))
    recycled = tf.T(314, 315, (0,), itemsize=1)  # the view's id, on other storage
    reserve = tf.T(316, 315, (0,), itemsize=1)
    empty = ("aten::empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? "
             "layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? "
             "memory_format=None) -> Tensor")
    bn = tf.Op(
        "aten::batch_norm", "aten::batch_norm(Tensor input, Tensor? weight, Tensor? bias, "
        "Tensor? running_mean, Tensor? running_var, bool training, float momentum, float eps, "
        "bool cudnn_enabled) -> Tensor", ins=[Y, bw, bb, rm, rv, True, 0.1, 1e-5, True],
        outs=[out], seq=20, children=[tf.Op(
            "aten::cudnn_batch_norm", "aten::cudnn_batch_norm(Tensor input, Tensor weight, "
            "Tensor? bias, Tensor? running_mean, Tensor? running_var, bool training, float "
            "exponential_average_factor, float epsilon) -> (Tensor, Tensor, Tensor, Tensor)",
            ins=[Y, bw, bb, rm, rv, True, 0.1, 1e-5], outs=[out, mean, invstd, reserve],
            seq=20, kernels=[8], children=[
                tf.Op("aten::empty", empty, ins=[list(Y.shape), None, None, None, None, None],
                      outs=[out]),
                tf.Op("aten::view", tf.S_VIEW, ins=[bw, [4]], outs=[weight_view]),
                tf.Op("aten::empty", empty, ins=[[0], None, None, None, None, None],
                      outs=[recycled]),
                tf.Op("aten::empty", empty, ins=[[0], None, None, None, None, None],
                      outs=[reserve])])])
    reader = tf.Op("aten::mul", "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor",
                   ins=[bw, bw], outs=[tf.T(318, 319, (4,))], seq=21, kernels=[2])
    base = tf.forward_ops

    def forward_ops():
        ops = base()
        return ops[:2] + [bn, reader] + ops[2:]

    monkeypatch.setattr(tf, "forward_ops", forward_ops)
    return tf.build_step(layout="1.1.1", record_function_ids=True), bw, recycled, reserve


def test_an_id_recycled_inside_an_op_is_a_new_tensor(monkeypatch, tmp_path):
    built, bw, recycled, reserve = _cudnn_batch_norm_step(monkeypatch)
    tables = convert_trace(parse_execution_trace(built.graph),
                           parse_profiler_trace(built.profiler))
    bn = by_name(tables, "aten::batch_norm")
    assert bn.inputs[:2] == (Y.id, bw.id)
    # The batch norm does not write its weight (it did when the recycled id was taken for the
    # weight's view written again); the later reader reads the weight from outside the step.
    assert bw.id not in bn.outputs
    assert bw.id not in {g for o in tables.ops for g in o.outputs}
    assert by_name(tables, "aten::mul").inputs == (bw.id, bw.id)
    graph, prof = write_pair(tmp_path, built)
    assert main(["convert", "--graph", str(graph), "--profiler", str(prof), "--out",
                 str(tmp_path / "out"), "-q"]) == 0
    report = check_trace_dir(tmp_path / "out")
    assert report.ok, report.problems
    assert bw.id in report.external


def test_tracker_new_object_under_a_recycled_id_inside_one_op():
    from triosim.tracer.etrace import TensorRef
    from triosim.tracer.tensors import OpTensors, TensorTracker

    def ref(tid, storage, numel):
        return TensorRef(id=tid, storage=storage, offset=0, numel=numel, itemsize=4,
                         device="cuda:0", shape=(numel,))

    tracker, op = TensorTracker(next_id=1000), OpTensors()
    weight = tracker.read(ref(21, 22, 64), op)
    assert tracker.alias(ref(42, 22, 64), weight, op) == weight  # a full view of the weight
    fresh = tracker.produce(ref(42, 44, 0), op, authoritative=False)  # recycled id, new storage
    assert fresh != weight and fresh >= 1000 and tracker.info[fresh].numel == 0
    assert weight not in op.produced
    # In place on the weight (same storage) is still the weight.
    assert tracker.produce(ref(21, 22, 64), op, authoritative=False) == weight
    # A tensor the op made, written again on other storage (a resize): the same tensor.
    made = tracker.produce(ref(50, 51, 0), op, authoritative=False)
    assert tracker.produce(ref(50, 52, 8), op, authoritative=False) == made


def test_forward_op_outputs_include_tensors_saved_for_backward():
    tables, _ = convert()
    loss = by_name(tables, "aten::cross_entropy_loss")
    assert loss.outputs == (40, LS.id)
    nll_b = by_name(tables, EV + "NllLossBackward0")
    # The undefined weight is left out, and so is the 0-dim total_weight that only nested calls
    # read (0-dim reads of nested calls are taken for wrapped Python numbers).
    assert nll_b.inputs == (42, LS.id, 32)
    assert TW.id not in {r.tensor_id for r in tables.tensors}
    # The saved log-softmax output comes back under a new id over the same storage.
    assert by_name(tables, EV + "LogSoftmaxBackward0").inputs == (46, LS.id)


def test_backward_op_tensors_come_from_the_whole_autograd_node():
    tables, _ = convert()
    addmm_b = by_name(tables, EV + "AddmmBackward0")
    # grad, weight (through two transposes) and the activation, not only the first sub-call.
    assert addmm_b.inputs == (50, 22, Y.id)
    assert addmm_b.outputs == (54, 58, 62)  # grad_input, weight grad, bias grad
    conv_b = by_name(tables, EV + "ConvolutionBackward0")
    assert conv_b.inputs == (74, 4, 6)
    assert conv_b.outputs[0] == 76
    # Tensor id 30 (Z, dead by then) is recycled for the bias gradient: a new identity.
    assert GB.id not in conv_b.outputs
    assert conv_b.outputs[1] > 200


def test_tpflag_targets_and_their_backward_ops():
    tables, _ = convert()
    flagged = {o.name for o in tables.ops if o.tpflag}
    assert flagged == {"aten::conv2d", "aten::linear", EV + "AddmmBackward0",
                       EV + "ConvolutionBackward0"}
    fwd = {o.name: o.fwd_op for o in tables.ops}
    assert fwd[EV + "AddmmBackward0"] == 4 and fwd[EV + "ConvolutionBackward0"] == 1
    assert fwd[EV + "ReluBackward0"] == 2 and fwd["aten::conv2d"] == -1
    only_conv = convert_trace(parse_execution_trace(build_step().graph),
                              parse_profiler_trace(build_step().profiler),
                              ConvertOptions(targets=("conv2d",)))
    assert {o.name for o in only_conv.ops if o.tpflag} == {"aten::conv2d",
                                                         EV + "ConvolutionBackward0"}


def test_parameters_and_gradients_are_recognisable():
    tables, _ = convert()
    cats: dict[int, set[str]] = {}
    for r in tables.tensors:
        cats.setdefault(r.tensor_id, set()).add(r.category)
    addcdiv = by_name(tables, "aten::_foreach_addcdiv_")
    lerp = by_name(tables, "aten::_foreach_lerp_")
    params = addcdiv.inputs[:4]
    assert params == (6, 8, 22, 24)
    for p in params:
        assert cats[p] & {"weight", "bias"}
    grads = lerp.inputs[4:]
    conv_b = by_name(tables, EV + "ConvolutionBackward0")
    addmm_b = by_name(tables, EV + "AddmmBackward0")
    assert grads == (conv_b.outputs[0], conv_b.outputs[1], addmm_b.outputs[1],
                     addmm_b.outputs[2])
    size = {r.tensor_id: r.numel for r in tables.tensors}
    assert [size[g] for g in grads] == [size[p] for p in params]
    rows = [r for r in tables.tensors if r.tensor_id in grads and r.category == "grad"]
    assert rows


def test_written_files_are_valid_and_deterministic(tmp_path, step_pair):
    graph, prof = step_pair
    assert main(["convert", "--graph", str(graph), "--profiler", str(prof), "--out",
                 str(tmp_path / "a"), "-q"]) == 0
    assert main(["convert", "--graph", str(graph), "--profiler", str(prof), "--out",
                 str(tmp_path / "b"), "-q"]) == 0
    for name in ("trace.csv", "tensor.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    with open(tmp_path / "a" / "trace.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == TRACE_HEADER
    assert rows[0][:11] == ["OperatorID", "OperatorName", "Operator_input", "Operator_output",
                            "Operator_cudatime", "Operator_cudatimenooverlap", "InputSize",
                            "OutputSize", "gpuid", "stage", "tpflag"]
    assert rows[1][:4] == ["1", "aten::conv2d", "[4; 6; 8]", "[14]"]
    with open(tmp_path / "a" / "tensor.csv", newline="") as f:
        trows = list(csv.reader(f))
    assert trows[0] == TENSOR_HEADER
    assert trows[1] == ["0", "4", "[2, 3, 8, 8]", "384", "4", "input", "4", "0"]
    assert "bias" in {r[5] for r in trows} and not any("=" in r[5] for r in trows)
    report = check_trace_dir(tmp_path / "a")
    assert report.ok, report.problems
    assert report.parameters == {6, 8, 22, 24}
    assert not list((tmp_path / "a").glob(".*tmp"))


def test_list_and_time_formatting():
    assert format_list([4, 6, 8]) == "[4; 6; 8]"
    assert format_list([]) == "[]"
    assert parse_list("[4; 6; 8]") == [4, 6, 8] and parse_list("[]") == []
    assert format_time(2671) == "2671"
    assert format_time(450.502) == "450.502"
    assert format_time(1.23456) == "1.235"
    assert format_time(3.0) == "3"


def test_schema_parsing():
    s = parse_schema("aten::conv2d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] "
                     "stride=[1, 1], SymInt groups=1) -> Tensor")
    assert [a.name for a in s.args] == ["input", "weight", "bias", "stride", "groups"]
    assert not s.returns_view()
    v = parse_schema("aten::flatten.using_ints(Tensor(a) self, int start_dim=0, int end_dim=-1)"
                     " -> Tensor(a)")
    assert v.args[0].name == "input" and v.returns_view()
    inplace = parse_schema("aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1)"
                           " -> Tensor(a!)")
    assert inplace.args[0].mutable and not inplace.returns_view()
    split = parse_schema("aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0)"
                         " -> Tensor(a)[]")
    assert split.args[0].alias == "a" and split.returns_view()
    named = parse_schema("aten::native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, "
                         "Tensor? running_mean, Tensor? running_var, bool training, float "
                         "momentum, float eps) -> (Tensor, Tensor, Tensor)")
    assert [a.name for a in named.args][3:5] == ["running_mean", "running_var"]
    assert len(named.returns) == 3
    assert parse_schema("") is None


def test_cli_convert_errors_are_one_line_exit_2(tmp_path, capsys, step_pair):
    graph, prof = step_pair
    out = str(tmp_path / "out")
    cases = {
        "missing": (str(tmp_path / "nope.json"), str(prof), "nope.json: execution-trace file "
                                                            "not found"),
        "swapped": (str(prof), str(graph), "missing field 'nodes'"),
    }
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": [')
    cases["malformed"] = (str(bad), str(prof), "bad.json: not valid JSON")
    nofield = tmp_path / "nofield.json"
    nofield.write_text(json.dumps({"nodes": [{"id": 1}]}))
    cases["field"] = (str(nofield), str(prof), "nodes[0]: missing field 'parent'")
    for g, p, expect in cases.values():
        rc = main(["convert", "--graph", g, "--profiler", p, "--out", out])
        err = capsys.readouterr().err
        assert rc == 2
        assert expect in err
        assert err.count("\n") == 1 and "Traceback" not in err


def test_convert_never_overwrites_its_inputs(tmp_path, capsys):
    built = build_step()
    d = tmp_path / "d"
    d.mkdir()
    (d / "trace.csv").write_text(json.dumps(built.graph))
    prof = d / "profiler.json"
    prof.write_text(json.dumps(built.profiler))
    before = (d / "trace.csv").read_bytes()
    rc = main(["convert", "--graph", str(d / "trace.csv"), "--profiler", str(prof), "--out",
               str(d)])
    assert rc == 2 and "refusing to overwrite an input file" in capsys.readouterr().err
    assert (d / "trace.csv").read_bytes() == before


def test_dataprocess_script_converts_data_dirs(tmp_path):
    import subprocess
    import sys

    built = build_step()
    (tmp_path / "data" / "graph").mkdir(parents=True)
    (tmp_path / "data" / "profiler").mkdir()
    write_pair(tmp_path / "data" / "graph", built, "tiny-iter2")
    (tmp_path / "data" / "graph" / "profiler_tiny-iter2.json").rename(
        tmp_path / "data" / "profiler" / "profiler_tiny-iter2.json")
    script = Path(__file__).resolve().parents[2] / "tracer" / "dataprocess.py"
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "data" / "middledata" / "trace" / "tiny"
    assert check_trace_dir(out).ok
    proc = subprocess.run([sys.executable, str(script), "--data-dir", "missing"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "missing/graph: directory not found" in proc.stderr


def test_convert_works_without_torch(tmp_path, step_pair):
    """`trace convert` and the CLI import no torch; `collect` without torch exits 2."""
    import subprocess
    import sys

    graph, prof = step_pair
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch.") or name.startswith("torchvision"):
            raise ImportError("no torch here")
sys.meta_path.insert(0, Block())
from triosim.tracer.cli import main
assert main(["convert", "--graph", {str(graph)!r}, "--profiler", {str(prof)!r},
             "--out", {str(tmp_path / "o")!r}, "-q"]) == 0
rc = main(["collect", "--model", "resnet18", "--batch-size", "2", "--out",
           {str(tmp_path / "c")!r}])
assert "torch" not in sys.modules
sys.exit(rc)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'triosim[tracer]'" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert (tmp_path / "o" / "trace.csv").is_file()


def test_register_adds_trace_commands_to_a_parent_cli(tmp_path, step_pair):
    import argparse

    from triosim.tracer.cli import register

    parser = argparse.ArgumentParser(prog="triosim")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    graph, prof = step_pair
    args = parser.parse_args(["trace", "convert", "--graph", str(graph), "--profiler",
                              str(prof), "--out", str(tmp_path / "o"), "--targets",
                              "conv2d,linear", "-q"])
    assert args.func(args) == 0
    assert check_trace_dir(tmp_path / "o").ok
    args = parser.parse_args(["trace", "collect", "--model", "resnet18", "--batch-size", "4",
                              "--out", str(tmp_path / "c")])
    assert callable(args.func)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["trace"])
    assert exc.value.code == 2


def test_convert_writes_meta_json_that_run_reads(tmp_path, step_pair):
    from triosim.trace import load_trace

    graph, prof = step_pair
    out = tmp_path / "with-batch"
    assert main(["convert", "--graph", str(graph), "--profiler", str(prof), "--out", str(out),
                 "--batch-size", "6", "-q"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["batch_size"] == 6 and meta["time_source"] == "kernels"
    trace = load_trace(out)
    assert trace.batch_size == 6 and trace.batch_source == "meta.json"
    # Without --batch-size the meta.json says nothing about the batch, and loading says so.
    bare = tmp_path / "no-batch"
    assert main(["convert", "--graph", str(graph), "--profiler", str(prof), "--out", str(bare), "-q"]) == 0
    assert json.loads((bare / "meta.json").read_text())["batch_size"] is None
    with pytest.warns(UserWarning, match="assuming 128"):
        assert load_trace(bare).batch_source == "assumed"


@pytest.mark.parametrize("layout", ["1.0.1", "1.1.1"])
@pytest.mark.parametrize(("flags", "mask"), [((True, True), "causal"), ((False,), "full"),
                                             ((True, False), "mixed"), ((), None)])
def test_the_attention_mask_comes_from_is_causal_by_name(layout, flags, mask):
    # is_causal is the 6th argument of scaled_dot_product_attention and the 5th of the flash
    # kernel call inside it: found by its schema name, not by position
    tables, _ = convert(layout=layout, attention=flags)
    assert [o.name for o in tables.ops].count("aten::scaled_dot_product_attention") == len(flags)
    assert tables.stats.attention_ops == len(flags)
    assert tables.stats.causal_attention_ops == sum(flags)
    assert tables.stats.attention_mask == mask


def test_meta_json_says_mixed_and_triosim_costs_it_as_full(tmp_path, capsys):
    from dataclasses import replace

    from triosim.compute.op_cost import trace_op_costs
    from triosim.trace import load_trace

    costs = {}
    for flags in ((True, False), (True, True)):
        graph, prof = write_pair(tmp_path, build_step(attention=flags), stem=str(len(set(flags))))
        out = tmp_path / f"out-{len(set(flags))}"
        assert main(["convert", "--graph", str(graph), "--profiler", str(prof), "--out", str(out),
                     "--batch-size", "2"]) == 0
        again = tmp_path / f"again-{len(set(flags))}"
        assert main(["convert", "--graph", str(graph), "--profiler", str(prof), "--out", str(again),
                     "--batch-size", "2", "-q"]) == 0
        assert (again / "meta.json").read_bytes() == (out / "meta.json").read_bytes()
        meta = json.loads((out / "meta.json").read_text())
        trace = load_trace(out)
        unmasked = replace(trace, info={k: v for k, v in trace.info.items() if k != "attention_mask"})
        costs[meta["attention_mask"]] = [
            (a.flops, b.flops) for a, b in zip(trace_op_costs(trace), trace_op_costs(unmasked))
            if a.kind == "attention"]
    assert "note: 1 of 2 fused attention ops are causal: meta.json says attention_mask mixed" in \
        capsys.readouterr().out
    assert len(costs["mixed"]) == 2 and all(f == full > 0 for f, full in costs["mixed"])
    assert all(f == full / 2 > 0 for f, full in costs["causal"])
