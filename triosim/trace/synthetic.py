"""Synthetic layered-model traces (an MLP-like chain) for tests, demos and scaling benchmarks.

Forward op i reads activation i−1 and its weight and bias and writes activation i; a loss op
closes the forward pass; backward op i reads the gradient of activation i, activation i−1 and
weight i and writes the gradient of activation i−1 plus the weight and bias gradients; one
in-place optimizer op per layer (or one ``_foreach`` op over all of them) reads the parameters,
gradients and optimizer state. Written in
TrioSim's CSV format so it goes through the same loader as a real trace.
"""

from __future__ import annotations

import csv
import json
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SyntheticModel:
    layers: int = 4
    batch_size: int = 8
    width: int = 64
    seed: int = 0
    min_us: float = 10.0
    max_us: float = 1000.0
    tp_fraction: float = 0.5
    foreach_optimizer: bool = False


def _fmt(items) -> str:
    return "[" + "; ".join(str(x) for x in items) + "]"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def write_trace_csvs(out: Path, tensors: list[tuple], ops: list[tuple], storage_base: int = 0,
                     each_byte: Callable[[str], int] = lambda category: 4,
                     element_bytes: Mapping[int, int] | None = None, storage: Mapping[int, int] | None = None) -> None:
    """Write ``tensor.csv`` and ``trace.csv`` into ``out`` in TrioSim's format.

    ``tensors``: (id, shape, category) in creation order; ``ops``: (name, inputs, outputs, µs,
    stage, tpflag). Every tensor gets its own storage, ``storage_base + id``, unless ``storage``
    names another tensor's (a view shares its base's storage); ``element_bytes`` overrides
    ``each_byte`` per tensor.
    """
    element_bytes = element_bytes or {}
    storage = storage or {}
    shape_of = {tid: shape for tid, shape, _ in tensors}
    with open(out / "tensor.csv", "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["Index", "TensorID", "TensorShape", "TensorNumElement", "TensorEachByte", "TensorType",
                     "TensorStorgeid", "gpuid"])
        for idx, (tid, shape, cat) in enumerate(tensors):
            wr.writerow([idx, tid, "[" + ", ".join(map(str, shape)) + "]", _numel(shape),
                         element_bytes.get(tid, each_byte(cat)), cat, storage_base + storage.get(tid, tid), 0])
    with open(out / "trace.csv", "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["OperatorID", "OperatorName", "Operator_input", "Operator_output", "Operator_cudatime",
                     "Operator_cudatimenooverlap", "InputSize", "OutputSize", "gpuid", "stage", "tpflag"])
        for k, (name, ins, outs, us, stage, flag) in enumerate(ops, start=1):
            us_r = round(us, 3)
            wr.writerow([k, name, _fmt(ins), _fmt(outs), us_r, us_r, _fmt(_numel(shape_of[t]) for t in ins),
                         _fmt(_numel(shape_of[t]) for t in outs), 0, stage, flag])


def write_synthetic_trace(directory: str | os.PathLike, model: SyntheticModel = SyntheticModel()) -> Path:
    """Write trace.csv, tensor.csv and meta.json for ``model`` into ``directory``."""
    rng = random.Random(model.seed)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors: list[tuple] = []  # (id, shape, category)
    ops: list[tuple] = []  # (name, inputs, outputs, us, stage, tpflag)
    next_id = [1]

    def new(shape: tuple[int, ...], category: str) -> int:
        tid = next_id[0]
        next_id[0] += 1
        tensors.append((tid, shape, category))
        return tid

    b = model.batch_size
    widths = [rng.randint(max(1, model.width // 2), model.width * 2) for _ in range(model.layers + 1)]
    act = [new((b, widths[0]), "input")]
    weights, biases, tp = [], [], []
    for i in range(model.layers):
        w = new((widths[i + 1], widths[i]), "weight")
        bias = new((widths[i + 1],), "bias")
        out_t = new((b, widths[i + 1]), "output")
        flag = int(rng.random() < model.tp_fraction)
        ops.append(("aten::linear", [act[-1], w, bias], [out_t], rng.uniform(model.min_us, model.max_us), "forward", flag))
        act.append(out_t)
        weights.append(w)
        biases.append(bias)
        tp.append(flag)
    target = new((b,), "target")
    loss = new((), "output")
    ops.append(("aten::cross_entropy_loss", [act[-1], target], [loss], rng.uniform(model.min_us, model.max_us), "forward", 0))
    grad = new((b, widths[-1]), "output")
    ops.append(("autograd::engine::evaluate_function: NllLossBackward0", [loss, act[-1], target], [grad],
                rng.uniform(model.min_us, model.max_us), "backward", 0))
    grads_w, grads_b = [None] * model.layers, [None] * model.layers
    for i in reversed(range(model.layers)):
        g_in = new((b, widths[i]), "output")
        gw = new((widths[i + 1], widths[i]), "output")
        gb = new((widths[i + 1],), "output")
        ops.append(("autograd::engine::evaluate_function: AddmmBackward0", [grad, act[i], weights[i]], [g_in, gw, gb],
                    rng.uniform(model.min_us, model.max_us), "backward", tp[i]))
        grads_w[i], grads_b[i] = gw, gb
        grad = g_in
    state = {p: new(tensors[p - 1][1], "input") for p in weights + biases}
    params = [x for pair in zip(weights, biases) for x in pair]
    grads = [x for pair in zip(grads_w, grads_b) for x in pair]
    if model.foreach_optimizer:
        ops.append(("aten::_foreach_add_", params + grads + [state[p] for p in params], [],
                    rng.uniform(model.min_us, model.max_us), "optimizer", 0))
    else:  # one in-place update per layer, like a non-foreach optimizer
        for i in range(model.layers):
            group = [weights[i], biases[i], grads_w[i], grads_b[i], state[weights[i]], state[biases[i]]]
            ops.append(("aten::add_", group, [], rng.uniform(model.min_us, model.max_us) / 10, "optimizer", 0))

    write_trace_csvs(out, tensors, ops, storage_base=100000)
    (out / "meta.json").write_text(
        json.dumps({"batch_size": b, "device": "synthetic", "model": f"mlp{model.layers}", "seed": model.seed}) + "\n"
    )
    return out
