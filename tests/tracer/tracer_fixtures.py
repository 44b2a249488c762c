"""Hand-made execution-trace + profiler JSON of one tiny training step, for the tracer tests.

The step is a conv -> relu_ -> flatten -> linear -> cross-entropy network trained with a foreach
Adam, written the way PyTorch records it: nested calls with record-function ids and sequence
numbers, views over shared storage, a saved tensor that comes back under a new id, a recycled
tensor id, an undefined gradient, AccumulateGrad/TBackward0/ViewBackward0 nodes without device
work, and (for the CUDA flavour) kernel launches with correlation ids.  ``build_step`` writes it in
either execution-trace layout (schema 1.0.1 of PyTorch 2.1, or 1.1.1 of PyTorch >= 2.3) and with
or without ``Record function id`` in the profiler events.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / ".." / "shared" / "reference"


@dataclass
class T:
    """A tensor argument: ids, shape, element size."""

    id: int
    storage: int
    shape: tuple[int, ...]
    itemsize: int = 4
    device: str = "cuda:0"

    def value(self) -> list:
        numel = 1
        for d in self.shape:
            numel *= d
        return [self.id, self.storage, 0, numel, self.itemsize, self.device]


UNDEF = "undefined"


@dataclass
class Op:
    """One recorded call: name, schema, arguments, children, kernels it launches itself."""

    name: str
    schema: str = ""
    ins: list[Any] = field(default_factory=list)
    outs: list[Any] = field(default_factory=list)
    seq: int = -1
    fw_tid: int = 0
    kernels: list[int] = field(default_factory=list)
    children: list[Op] = field(default_factory=list)


def _encode(args: list[Any]) -> tuple[list, list, list]:
    values, shapes, types = [], [], []
    for a in args:
        if isinstance(a, T):
            values.append(a.value())
            shapes.append(list(a.shape))
            types.append("Tensor(float)" if a.itemsize == 4 else "Tensor(long int)")
        elif a == UNDEF:
            values.append([99, 0, 0, 0, 0, ""])
            shapes.append([])
            types.append("Tensor(nullptr (uninitialized))")
        elif isinstance(a, list) and a and isinstance(a[0], T):
            values.append([t.value() for t in a])
            shapes.append([list(t.shape) for t in a])
            types.append("GenericList[" + ",".join("Tensor(float)" for _ in a) + "]")
        elif a is None:
            values.append("<None>")
            shapes.append([])
            types.append("None")
        elif isinstance(a, bool):
            values.append(a)
            shapes.append([])
            types.append("Bool")
        elif isinstance(a, int):
            values.append(a)
            shapes.append([])
            types.append("Int")
        elif isinstance(a, float):
            values.append(a)
            shapes.append([])
            types.append("Double")
        else:
            values.append(a)
            shapes.append([[] for _ in a])
            types.append("GenericList[" + ",".join("Int" for _ in a) + "]")
    return values, shapes, types


# --- the step ------------------------------------------------------------------------------------
X = T(4, 5, (2, 3, 8, 8))
W = T(6, 7, (4, 3, 3, 3))
B = T(8, 9, (4,))
Y = T(14, 15, (2, 4, 6, 6))
YV = T(20, 15, (2, 144))  # flatten view of Y
W2 = T(22, 23, (10, 144))
B2 = T(24, 25, (10,))
W2T = T(26, 23, (144, 10))
Z = T(30, 31, (2, 10))
TGT = T(32, 33, (2,), itemsize=8)
LS = T(36, 37, (2, 10))
LOSS = T(40, 41, ())
TW = T(44, 45, ())
G0 = T(42, 43, ())
GL = T(46, 47, (2, 10))
LS_SAVED = T(48, 37, (2, 10))  # the saved log-softmax output, unpacked under a new id
GZ = T(50, 51, (2, 10))
W2TT = T(52, 23, (10, 144))
GYV = T(54, 55, (2, 144))
GZT = T(56, 51, (10, 2))
M = T(58, 59, (10, 144))
GMAT2 = T(61, 59, (144, 10))
GB2_ = T(62, 63, (1, 10))
GB2 = T(64, 63, (10,))
DB2 = T(66, 63, (10,))
GW2 = T(68, 59, (10, 144))
DW2 = T(70, 59, (10, 144))
GY = T(72, 55, (2, 4, 6, 6))
GY2 = T(74, 75, (2, 4, 6, 6))
GW = T(76, 77, (4, 3, 3, 3))
GB = T(30, 79, (4,))  # tensor id 30 (Z's) recycled for a new tensor
DW = T(80, 77, (4, 3, 3, 3))
DB = T(82, 79, (4,))
STEPS = [T(90 + i, 190 + i, (), device="cpu") for i in range(4)]
EA = [T(100 + 2 * i, 200 + 2 * i, s.shape) for i, s in enumerate([W, B, W2, B2])]
EAS = [T(120 + 2 * i, 220 + 2 * i, s.shape) for i, s in enumerate([W, B, W2, B2])]

S_CONV = ("aten::conv2d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=[1, 1], "
          "SymInt[2] padding=[0, 0], SymInt[2] dilation=[1, 1], SymInt groups=1) -> Tensor")
S_CONVOLUTION = ("aten::convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, "
                 "SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, "
                 "SymInt groups) -> Tensor")
S_T = "aten::t(Tensor(a) self) -> Tensor(a)"
S_VIEW = "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)"
S_DETACH = "aten::detach(Tensor(a) self) -> Tensor(a)"
S_MM = "aten::mm(Tensor self, Tensor mat2) -> Tensor"


def _accumulate(grad: T, detached: T) -> Op:
    return Op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", children=[
        Op("torch::autograd::AccumulateGrad", ins=[grad], fw_tid=1, children=[
            Op("aten::detach", S_DETACH, ins=[grad], outs=[detached],
               children=[Op("detach", ins=[grad])])])])


def forward_ops() -> list[Op]:
    return [
        Op("aten::conv2d", S_CONV, ins=[X, W, B, [1, 1], [0, 0], [1, 1], 1], outs=[Y], seq=10,
           children=[Op("aten::convolution", S_CONVOLUTION,
                        ins=[X, W, B, [1, 1], [0, 0], [1, 1], False, [0, 0], 1], outs=[Y], seq=10,
                        kernels=[100, 20])]),
        Op("aten::relu_", "aten::relu_(Tensor(a!) self) -> Tensor(a!)", ins=[Y], outs=[Y], seq=11,
           kernels=[30]),
        Op("aten::flatten",
           "aten::flatten.using_ints(Tensor(a) self, int start_dim=0, int end_dim=-1) -> Tensor(a)",
           ins=[Y, 1, -1], outs=[YV], seq=12,
           children=[Op("aten::view", S_VIEW, ins=[Y, [2, 144]], outs=[YV], seq=12)]),
        Op("aten::linear", "aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor",
           ins=[YV, W2, B2], outs=[Z], seq=13, children=[
               Op("aten::t", S_T, ins=[W2], outs=[W2T], seq=13),
               Op("aten::addmm", "aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar "
                  "beta=1, Scalar alpha=1) -> Tensor", ins=[B2, YV, W2T, 1, 1], outs=[Z], seq=14,
                  kernels=[40])]),
        Op("aten::cross_entropy_loss",
           "aten::cross_entropy_loss(Tensor self, Tensor target, Tensor? weight=None, int "
           "reduction=1, SymInt ignore_index=-100, float label_smoothing=0.) -> Tensor",
           ins=[Z, TGT, None, 1, -100, 0.0], outs=[LOSS], seq=15, children=[
               Op("aten::log_softmax", "aten::log_softmax.int(Tensor self, int dim, ScalarType? "
                  "dtype=None) -> Tensor", ins=[Z, 1, None], outs=[LS], seq=15, kernels=[5]),
               Op("aten::nll_loss_nd", "aten::nll_loss_nd(Tensor self, Tensor target, Tensor? "
                  "weight=None, int reduction=1, SymInt ignore_index=-100) -> Tensor",
                  ins=[LS, TGT, None, 1, -100], outs=[LOSS], seq=16, children=[
                      Op("aten::nll_loss_forward", "aten::nll_loss_forward(Tensor self, Tensor "
                         "target, Tensor? weight, int reduction, SymInt ignore_index) -> (Tensor "
                         "output, Tensor total_weight)", ins=[LS, TGT, None, 1, -100],
                         outs=[LOSS, TW], kernels=[3])])]),
        Op("aten::ones_like", "aten::ones_like(Tensor self, *, ScalarType? dtype=None, Layout? "
           "layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? "
           "memory_format=None) -> Tensor", ins=[LOSS, None, None, None, None, None], outs=[G0],
           kernels=[1]),
    ]


S_SDPA = ("aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? "
          "attn_mask=None, float dropout_p=0., bool is_causal=False, *, float? scale=None, bool "
          "enable_gqa=False) -> Tensor")
S_FLASH = ("aten::_scaled_dot_product_flash_attention(Tensor query, Tensor key, Tensor value, float "
           "dropout_p=0., bool is_causal=False, bool return_debug_mask=False, *, float? scale=None) -> "
           "(Tensor output, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt "
           "max_k, Tensor rng_state, Tensor unused, Tensor debug_attn_mask)")


def attention_ops(causal: tuple[bool, ...]) -> list[Op]:
    """One fused attention call per flag, each on its own q, k, v (b 2, 2 heads, 4 tokens, d 8):
    ``scaled_dot_product_attention`` with ``is_causal`` 6th, and inside it the flash kernel call
    with ``is_causal`` 5th, as PyTorch records them."""
    ops = []
    for i, flag in enumerate(causal):
        q, k, v, o, lse = (T(300 + 10 * i + 2 * j, 301 + 10 * i + 2 * j, (2, 2, 4, 8) if j < 4 else (2, 2, 4))
                           for j in range(5))
        ops.append(Op("aten::scaled_dot_product_attention", S_SDPA, ins=[q, k, v, None, 0.0, flag, None, False],
                      outs=[o], seq=20 + i, children=[
                          Op("aten::_scaled_dot_product_flash_attention", S_FLASH,
                             ins=[q, k, v, 0.0, flag, False, None], outs=[o, lse], seq=20 + i,
                             kernels=[8])]))
    return ops


def backward_ops() -> list[Op]:
    ev = "autograd::engine::evaluate_function: "
    return [
        Op(ev + "NllLossBackward0", children=[Op("NllLossBackward0", ins=[G0], seq=16, fw_tid=1,
           children=[Op("aten::nll_loss_backward",
                        "aten::nll_loss_backward(Tensor grad_output, Tensor self, Tensor target, "
                        "Tensor? weight, int reduction, SymInt ignore_index, Tensor total_weight)"
                        " -> Tensor", ins=[G0, LS, TGT, UNDEF, 1, -100, TW], outs=[GL],
                        kernels=[4])])]),
        Op(ev + "LogSoftmaxBackward0", children=[Op("LogSoftmaxBackward0", ins=[GL], seq=15,
           fw_tid=1, children=[Op("aten::_log_softmax_backward_data",
                                  "aten::_log_softmax_backward_data(Tensor grad_output, Tensor "
                                  "output, int dim, ScalarType input_dtype) -> Tensor",
                                  ins=[GL, LS_SAVED, 1, 6], outs=[GZ], kernels=[4])])]),
        Op(ev + "AddmmBackward0", children=[
            Op("AddmmBackward0", ins=[GZ], seq=14, fw_tid=1, children=[
                Op("aten::t", S_T, ins=[W2T], outs=[W2TT]),
                Op("aten::mm", S_MM, ins=[GZ, W2TT], outs=[GYV], kernels=[10]),
                Op("aten::t", S_T, ins=[GZ], outs=[GZT]),
                Op("aten::mm", S_MM, ins=[GZT, YV], outs=[M], kernels=[12]),
                Op("aten::t", S_T, ins=[M], outs=[GMAT2])]),
            Op("aten::sum", "aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *,"
               " ScalarType? dtype=None) -> Tensor", ins=[GZ, [0], True, None], outs=[GB2_],
               kernels=[2]),
            Op("aten::view", S_VIEW, ins=[GB2_, [10]], outs=[GB2])]),
        _accumulate(GB2, DB2),
        Op(ev + "TBackward0", children=[Op("TBackward0", ins=[GMAT2], seq=13, fw_tid=1, children=[
            Op("aten::t", S_T, ins=[GMAT2], outs=[GW2])])]),
        _accumulate(GW2, DW2),
        Op(ev + "ViewBackward0", children=[Op("ViewBackward0", ins=[GYV], seq=12, fw_tid=1,
           children=[Op("aten::view", S_VIEW, ins=[GYV, [2, 4, 6, 6]], outs=[GY])])]),
        Op(ev + "ReluBackward0", children=[Op("ReluBackward0", ins=[GY], seq=11, fw_tid=1,
           children=[Op("aten::threshold_backward", "aten::threshold_backward(Tensor grad_output,"
                        " Tensor self, Scalar threshold) -> Tensor", ins=[GY, Y, 0], outs=[GY2],
                        kernels=[6])])]),
        Op(ev + "ConvolutionBackward0", children=[Op("ConvolutionBackward0", ins=[GY2], seq=10,
           fw_tid=1, children=[Op("aten::convolution_backward",
                                  "aten::convolution_backward(Tensor grad_output, Tensor input, "
                                  "Tensor weight, SymInt[]? bias_sizes, SymInt[] stride, SymInt[] "
                                  "padding, SymInt[] dilation, bool transposed, SymInt[] "
                                  "output_padding, SymInt groups, bool[3] output_mask) -> (Tensor, "
                                  "Tensor, Tensor)",
                                  ins=[GY2, X, W, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                       [False, True, True]],
                                  outs=[UNDEF, GW, GB], kernels=[50, 5])])]),
        _accumulate(GW, DW),
        _accumulate(GB, DB),
    ]


def optimizer_ops() -> list[Op]:
    grads = [DW, DB, DW2, DB2]
    return [Op("Optimizer.step#Adam.step", children=[
        Op("aten::_foreach_add_", "aten::_foreach_add_.Scalar(Tensor(a!)[] self, Scalar scalar) "
           "-> ()", ins=[STEPS, 1]),
        Op("aten::_foreach_lerp_", "aten::_foreach_lerp_.Scalar(Tensor(a!)[] self, Tensor[] "
           "tensors1, Scalar weight) -> ()", ins=[EA, grads, 0.1], kernels=[7]),
        Op("aten::_foreach_addcdiv_", "aten::_foreach_addcdiv_.Scalar(Tensor(a!)[] self, Tensor[]"
           " tensor1, Tensor[] tensor2, Scalar value=1) -> ()",
           ins=[[W, B, W2, B2], EA, EAS, -0.001], kernels=[9]),
    ])]


@dataclass
class Built:
    graph: dict
    profiler: dict
    kernels_by_top: dict[str, float]  # top-level op name (first occurrence) -> kernel µs


def build_step(layout: str = "1.0.1", record_function_ids: bool = False, cuda: bool = True,
               shuffle_events: bool = False, autograd_thread: bool = True,
               zero_grad: bool = True, attention: tuple[bool, ...] = ()) -> Built:
    """The step as (graph JSON, profiler JSON) in the given flavour; ``attention``: the
    ``is_causal`` flags of fused attention calls made after the loss (none by default)."""
    fwd, bwd, opt = forward_ops(), backward_ops(), optimizer_ops()
    fwd[-1:-1] = attention_ops(attention)
    main_tid, bwd_tid = 1, (2 if autograd_thread else 1)
    nodes: list[dict] = []
    events: list[dict] = []
    counters = {"id": 3 if autograd_thread else 2, "rf": 0, "ts": 1000.0, "gpu": 5000.0,
                "corr": 100000}
    ext = {main_tid: 0, bwd_tid: 500}

    def emit(op: Op, parent: int, tid: int) -> tuple[int, float]:
        counters["id"] += 1
        counters["rf"] += 1
        node_id, rf = counters["id"], counters["rf"]
        ts = counters["ts"]
        counters["ts"] += 2
        kern = 0.0
        for k in op.kernels:
            counters["corr"] += 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "pid": 1, "tid": 1000 + tid, "ts": counters["ts"], "dur": 1,
                           "args": {"correlation": counters["corr"],
                                    "External id": counters["corr"]}})
            if cuda:
                events.append({"ph": "X", "cat": "kernel", "name": f"k{counters['corr']}",
                               "pid": 0, "tid": 7, "ts": counters["gpu"], "dur": k,
                               "args": {"correlation": counters["corr"], "stream": 7}})
            counters["gpu"] += k + 1
            counters["ts"] += 2
            kern += k
        ins, outs = _encode(op.ins), _encode(op.outs)
        common = {"name": op.name, "id": node_id}
        attrs = {"rf_id": rf, "fw_parent": 0, "seq_id": op.seq, "scope": 0, "tid": tid,
                 "fw_tid": op.fw_tid, "op_schema": op.schema}
        if layout == "1.0.1":
            node = {**common, "parent": parent, **attrs, "inputs": ins[0],
                    "input_shapes": ins[1], "input_types": ins[2], "outputs": outs[0],
                    "output_shapes": outs[1], "output_types": outs[2]}
        else:
            node = {**common, "ctrl_deps": parent,
                    "inputs": {"values": ins[0], "shapes": ins[1], "types": ins[2]},
                    "outputs": {"values": outs[0], "shapes": outs[1], "types": outs[2]},
                    "attrs": [{"name": k, "type": "int", "value": v} for k, v in attrs.items()]}
        ext[tid] += 1
        args: dict[str, Any] = {"External id": ext[tid]}
        if record_function_ids:
            args["Record function id"] = rf
        seq = op.seq if op.seq >= 0 else (op.children[0].seq if op.name.startswith(
            "autograd::engine") and op.children else -1)
        if seq >= 0:
            args["Sequence number"] = seq
        event = {"ph": "X", "cat": "user_annotation" if op.name.startswith("Optimizer.")
                 else "cpu_op", "name": op.name, "pid": 1, "tid": 1000 + tid, "ts": ts,
                 "args": args}
        events.append(event)
        for child in op.children:
            _, k = emit(child, node_id, tid)
            kern += k
        event["dur"] = counters["ts"] - ts + 1
        counters["ts"] += 3
        nodes.append(node)
        return node_id, kern

    kernels: dict[str, float] = {}
    roots = [(1, 1, "[pytorch|profiler|execution_trace|process]", 0),
             (2, 1, "[pytorch|profiler|execution_trace|thread]", main_tid)]
    if autograd_thread:
        roots.append((3, 1, "[pytorch|profiler|execution_trace|thread]", bwd_tid))
    for nid, parent, name, tid in roots:
        attrs = {"rf_id": 0, "fw_parent": 0, "seq_id": -1, "scope": 7, "tid": tid, "fw_tid": 0,
                 "op_schema": ""}
        if layout == "1.0.1":
            nodes.append({"name": name, "id": nid, "parent": parent, **attrs, "inputs": [],
                          "input_shapes": [], "input_types": [], "outputs": [],
                          "output_shapes": [], "output_types": []})
        else:
            nodes.append({"name": name, "id": nid, "ctrl_deps": parent,
                          "inputs": {"values": [], "shapes": [], "types": []},
                          "outputs": {"values": [], "shapes": [], "types": []},
                          "attrs": [{"name": k, "type": "int", "value": v}
                                    for k, v in attrs.items()]})
    bwd_root = 3 if autograd_thread else 2
    if zero_grad:
        emit(Op("Optimizer.zero_grad#Adam.zero_grad"), 2, main_tid)
    for op in fwd:
        _, k = emit(op, 2, main_tid)
        kernels.setdefault(op.name, k)
    for op in bwd:
        _, k = emit(op, bwd_root, bwd_tid)
        kernels.setdefault(op.name, k)
    for container in opt:
        counters["id"] += 1
        counters["rf"] += 1
        cid = counters["id"]
        cts = counters["ts"]
        ext[main_tid] += 1
        cargs: dict[str, Any] = {"External id": ext[main_tid]}
        if record_function_ids:
            cargs["Record function id"] = counters["rf"]
        cevent = {"ph": "X", "cat": "user_annotation", "name": container.name, "pid": 1,
                  "tid": 1000 + main_tid, "ts": cts, "args": cargs}
        events.append(cevent)
        crf = counters["rf"]
        for op in container.children:
            _, k = emit(op, cid, main_tid)
            kernels.setdefault(op.name, k)
        cevent["dur"] = counters["ts"] - cts + 1
        attrs = {"rf_id": crf, "fw_parent": 0, "seq_id": -1, "scope": 7, "tid": main_tid,
                 "fw_tid": 0, "op_schema": ""}
        if layout == "1.0.1":
            nodes.append({"name": container.name, "id": cid, "parent": 2, **attrs,
                          "inputs": [], "input_shapes": [], "input_types": [], "outputs": [],
                          "output_shapes": [], "output_types": []})
        else:
            nodes.append({"name": container.name, "id": cid, "ctrl_deps": 2,
                          "inputs": {"values": [], "shapes": [], "types": []},
                          "outputs": {"values": [], "shapes": [], "types": []},
                          "attrs": [{"name": k, "type": "int", "value": v}
                                    for k, v in attrs.items()]})
    if shuffle_events:
        random.Random(7).shuffle(events)
        random.Random(8).shuffle(nodes)
    events.append({"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",
                   "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": 1000})
    graph = {"schema": layout, "pid": 1, "time": "2025-01-01 00:00:00", "start_ts": 0,
             "nodes": nodes, "finish_ts": 1}
    profiler = {"schemaVersion": 1, "traceEvents": events, "traceName": "fixture"}
    return Built(graph=graph, profiler=profiler, kernels_by_top=kernels)


def write_pair(tmp: Path, built: Built, stem: str = "step") -> tuple[Path, Path]:
    graph, prof = tmp / f"graph_{stem}.json", tmp / f"profiler_{stem}.json"
    graph.write_text(json.dumps(built.graph))
    prof.write_text(json.dumps(built.profiler))
    return graph, prof
