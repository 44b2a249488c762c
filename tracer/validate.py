"""Consistency checks of a trace directory (trace.csv + tensor.csv), as the tracer promises them.

The properties checked are the ones a simulator relies on:

* every tensor ID an op lists is defined in tensor.csv, and all rows of one ID agree on its size,
  element size and storage;
* ``InputSize`` / ``OutputSize`` have one entry per listed tensor, equal to its element count;
* data flows forward: an op's input was produced by an earlier op (directly, or a tensor with the
  same storage was), or comes from outside the step (parameters, optimizer state, the batch) —
  i.e. no op writes it except in place;
* stages run forward, then backward, then optimizer; times are non-negative;
* parameters are recognisable: the optimizer reads tensors of category weight/bias, and each has a
  gradient of the same size among the optimizer's inputs.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

STAGE_ORDER = {"forward": 0, "backward": 1, "optimizer": 2}


@dataclass
class TraceReport:
    """Problems found (empty = valid) and a few facts about the trace."""

    problems: list[str] = field(default_factory=list)
    ops: int = 0
    tensors: int = 0
    parameters: set[int] = field(default_factory=set)
    external: set[int] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.problems


def parse_list(text: str) -> list[int]:
    """``[4; 6; 8]`` -> [4, 6, 8] (the original loader's rules)."""
    body = text.strip().strip("[]").replace(" ", "")
    return [int(tok.strip("'")) for tok in body.split(";") if tok.strip("'")]


def check_trace_dir(path: str | os.PathLike[str], max_problems: int = 50) -> TraceReport:
    """Run every check on ``path``/trace.csv and ``path``/tensor.csv."""
    rep = TraceReport()
    d = Path(path)

    def problem(msg: str) -> None:
        if len(rep.problems) < max_problems:
            rep.problems.append(msg)

    with open(d / "tensor.csv", newline="", encoding="utf-8") as f:
        tensor_rows = list(csv.DictReader(f))
    with open(d / "trace.csv", newline="", encoding="utf-8") as f:
        op_rows = list(csv.DictReader(f))
    rep.ops = len(op_rows)
    size: dict[int, tuple[int, int, int]] = {}
    categories: dict[int, set[str]] = {}
    for i, r in enumerate(tensor_rows, start=2):
        tid = int(r["TensorID"])
        key = (int(r["TensorNumElement"]), int(r["TensorEachByte"]), int(r["TensorStorgeid"]))
        if tid in size and size[tid] != key:
            problem(f"tensor.csv:{i}: tensor {tid} has size/storage {key}, earlier {size[tid]}")
        size.setdefault(tid, key)
        categories.setdefault(tid, set()).add(r["TensorType"])
    rep.tensors = len(size)

    ops = []
    last_stage = 0
    for i, r in enumerate(op_rows, start=2):
        ins, outs = parse_list(r["Operator_input"]), parse_list(r["Operator_output"])
        for t in ins + outs:
            if t not in size:
                problem(f"trace.csv:{i}: op {r['OperatorID']} references tensor {t}, which "
                        "tensor.csv does not define")
        for col, ids in (("InputSize", ins), ("OutputSize", outs)):
            sizes = parse_list(r[col])
            expect = [size[t][0] for t in ids if t in size]
            if len(sizes) != len(ids) or (len(expect) == len(ids) and sizes != expect):
                problem(f"trace.csv:{i}: {col} {sizes} does not match the tensors' sizes "
                        f"{expect}")
        stage = r["stage"]
        if stage not in STAGE_ORDER:
            problem(f"trace.csv:{i}: unknown stage '{stage}'")
        elif STAGE_ORDER[stage] < last_stage:
            problem(f"trace.csv:{i}: stage {stage} after a later stage")
        else:
            last_stage = STAGE_ORDER[stage]
        for col in ("Operator_cudatime", "Operator_cudatimenooverlap"):
            if float(r[col]) < 0:
                problem(f"trace.csv:{i}: negative {col}")
        ops.append((i, r, ins, outs))

    storage = {t: s[2] for t, s in size.items()}
    # Tensors some op writes without reading them (a real producer, not an in-place update).
    producers: dict[int, list[int]] = {}
    for k, (_, _, ins, outs) in enumerate(ops):
        for t in outs:
            if t not in ins:
                producers.setdefault(t, []).append(k)
    produced_storages: dict[int, int] = {}
    for t, ks in producers.items():
        s = storage.get(t)
        if s is not None:
            produced_storages[s] = min(ks[0], produced_storages.get(s, ks[0]))
    for k, (i, r, ins, _) in enumerate(ops):
        for t in ins:
            first = producers.get(t, [None])[0]
            if first is not None and first < k:
                continue
            s_first = produced_storages.get(storage.get(t, -1))
            if s_first is not None and s_first < k:
                continue
            if first is None and s_first is None:
                rep.external.add(t)
                continue
            problem(f"trace.csv:{i}: op {r['OperatorID']} ({r['OperatorName']}) reads tensor "
                    f"{t} before any op produces it")

    opt_inputs = [t for _, r, ins, _ in ops if r["stage"] == "optimizer" for t in ins]
    rep.parameters = {t for t in opt_inputs if categories.get(t, set()) & {"weight", "bias"}}
    if any(r["stage"] == "optimizer" for _, r, _, _ in ops):
        if not rep.parameters:
            problem("no optimizer input is a weight or bias: parameters are not recognisable")
        opt_sizes: dict[int, int] = {}
        for t in set(opt_inputs) - rep.parameters:
            opt_sizes[size[t][0]] = opt_sizes.get(size[t][0], 0) + 1
        for p in sorted(rep.parameters):
            if opt_sizes.get(size[p][0], 0) == 0:
                problem(f"parameter {p} has no gradient of its size ({size[p][0]}) among the "
                        "optimizer's inputs")
    return rep
