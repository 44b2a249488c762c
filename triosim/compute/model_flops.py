"""Model FLOPs of one training iteration: the work the model asks for, not the work the GPUs do.

Model FLOPs utilisation (MFU) divides these by the time and the GPUs' peak. They count one
forward and one backward pass per sample, the backward as twice the forward (dX and dW are one
product each), so **model FLOPs = 3 × forward FLOPs**. Work a run adds on top (activation
recomputation re-running a forward, a pipeline's bubbles, communication) is not model work and
is not counted: a run that recomputes does more FLOPs for the same model FLOPs, and its MFU says so.

Two counts, which agree on a GPT layer stack (``tests/compute/test_model_flops.py``):

- :func:`megatron_gpt_flops`: Megatron-LM's closed form for a GPT of ``l`` layers, hidden size
  ``h``, vocabulary ``V``, sequence ``s`` and a global batch of ``B`` samples,

      72·B·s·l·h² · (1 + s/(6h) + V/(12·l·h))

  Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", SC '21, arXiv:2104.04473) count 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) because every
  layer's forward runs twice under their full activation recomputation (4 passes: forward,
  forward again, backward = 2 forwards). Without it a layer does 3 passes, 3/4 of their layer
  terms: 72·B·s·l·h²·(1 + s/(6h)); the logit layer (the LM head, 2·B·s·h·V a forward) is never
  recomputed, so its 6·B·s·h·V is in both counts, which is V/(12·l·h) relative to 72·B·s·l·h².
  The forward of one layer is 24·B·s·h² (QKV, attention output and the 4h MLP's two products)
  plus 4·B·s²·h (QKᵀ and attention·V, no causal discount). Korthikanti et al. 2022 ("Reducing
  Activation Recomputation in Large Transformer Models", arXiv:2205.05198) report model FLOPs
  utilisation with this count (recomputation excluded) beside hardware FLOPs utilisation
  (recomputation included).
  :func:`narayanan_gpt_flops` is their formula as published.
- :func:`forward_matrix_flops`: for any trace, the FLOPs of its forward ops that run on the
  matrix units (matmul, convolution, attention) as the op-cost model
  (:mod:`triosim.compute.op_cost`) counts them from the ops' shapes. Norms, activations and
  other element-wise ops are left out, as in Megatron's count: they are a fraction of a percent
  of a transformer's FLOPs and MFU is measured against the matrix units' peak. On a GPT trace
  this is exactly the closed form's forward (embedding lookups do no multiply-adds; the LM head
  is a linear layer).

Forward FLOPs follow the batch linearly (every forward matmul, convolution and attention
product has the batch in its rows), so a trace's count at the batch its shapes were recorded at
gives the count per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..trace import Tensor, Trace
from ..trace.tensor_table import TensorTable
from .op_cost import op_cost
from .op_kinds import MATRIX_CLASSES, classify

# Model FLOPs per iteration = this many forward passes (backward = 2 forwards).
PASSES_PER_ITERATION = 3


def megatron_gpt_flops(global_batch: int, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """Model FLOPs of one iteration of a GPT (Megatron-LM's count, recomputation excluded):
    72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))."""
    b, s, n, h, v = (float(x) for x in (global_batch, seq_len, layers, hidden, vocab))
    return 72.0 * b * s * n * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * n * h))


def narayanan_gpt_flops(global_batch: int, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021's count, with full activation recomputation (every layer's forward
    run twice): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    b, s, n, h, v = (float(x) for x in (global_batch, seq_len, layers, hidden, vocab))
    return 96.0 * b * s * n * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * n * h))


def forward_matrix_flops(trace: Trace) -> float:
    """FLOPs of the trace's forward ops on the matrix units, at the shapes it was recorded with."""
    on_matrix: dict[str, bool] = {}  # a trace repeats a few op names thousands of times
    chosen = []
    for op in trace.ops:
        if op.stage == "forward":
            hit = on_matrix.get(op.name)
            if hit is None:
                hit = on_matrix[op.name] = classify(op.name, op.stage)[1] in MATRIX_CLASSES
            if hit:
                chosen.append(op.index)
    if not chosen:
        return 0.0
    # An op's FLOPs follow from its name and its tensors' shapes, categories and element counts
    # (and which of them repeat): a model's repeated layers are costed once. A 200,000-op trace
    # has 10^5 forward matmuls of a few thousand kinds, and making all its tensors' objects alone
    # took a second.
    codes_of, columns, tensor = _op_codes(trace)
    shapes, categories, numel = columns
    flops_of: dict[tuple, float] = {}
    total = 0.0
    ops = trace.ops
    for i in chosen:
        ins, outs = codes_of(i)
        key = (ops[i].name, tuple(shapes[c] for c in ins), tuple(categories[c] for c in ins),
               tuple(numel[c] for c in ins), tuple(shapes[c] for c in outs), tuple(numel[c] for c in outs),
               tuple(map(ins.index, ins)) if len(set(ins)) < len(ins) else None,
               tuple(map(outs.index, outs)) if len(set(outs)) < len(outs) else None)
        flops = flops_of.get(key)
        if flops is None:
            op = ops[i]
            made = {t: tensor(c) for t, c in zip((*op.inputs, *op.outputs), (*ins, *outs))}
            flops = flops_of[key] = op_cost(op, made).flops
        total += flops
    return total


def _op_codes(trace: Trace) -> tuple[Callable[[int], tuple[list, list]], tuple[Sequence, Sequence, Sequence],
                                     Callable[[Any], Tensor]]:
    """(op index → its input and output tensor keys, per-key (shapes, categories, element
    counts), key → Tensor). A trace read into columns gives integer codes, its columns and one
    tensor's object at a time; any other the tensor IDs and its Tensor objects."""
    tensors = trace.tensors
    given = trace._op_codes
    if isinstance(tensors, TensorTable) and given is not None and given[1] is tensors \
            and len(given[0]) == len(trace.ops):
        codes = given[2]
        n = len(trace.ops)
        in_code, out_code = codes.input_code.tolist(), codes.output_code.tolist()
        in_at = np.searchsorted(codes.input_op, np.arange(n + 1)).tolist()
        out_at = np.searchsorted(codes.output_op, np.arange(n + 1)).tolist()

        def coded(i: int) -> tuple[list, list]:
            return in_code[in_at[i]:in_at[i + 1]], out_code[out_at[i]:out_at[i + 1]]

        return coded, (tensors.shape_texts, tensors.categories, tensors.numel.tolist()), tensors.at

    class _Column(dict):
        def __init__(self, field: str) -> None:
            super().__init__()
            self.field = field

        def __missing__(self, tid: str):
            return getattr(tensors[tid], self.field)

    ops = trace.ops
    return (lambda i: (list(ops[i].inputs), list(ops[i].outputs))), \
        (_Column("shape"), _Column("category"), _Column("numel")), tensors.__getitem__


def model_flops_per_sample(trace: Trace, shapes_batch: int) -> float:
    """Model FLOPs of one sample: 3 × the forward's matrix-unit FLOPs, the trace's shapes being
    those of ``shapes_batch`` samples (the batch it was recorded at: batch scaling changes a
    trace's bytes and times, not its shapes)."""
    if shapes_batch <= 0:
        raise ValueError(f"shapes_batch must be positive, got {shapes_batch}")
    return PASSES_PER_ITERATION * forward_matrix_flops(trace) / shapes_batch


__all__ = ["PASSES_PER_ITERATION", "forward_matrix_flops", "megatron_gpt_flops", "model_flops_per_sample",
           "narayanan_gpt_flops"]
