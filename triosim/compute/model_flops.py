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

from ..trace import Trace
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
    total = 0.0
    on_matrix: dict[str, bool] = {}  # a trace repeats a few op names thousands of times
    for op in trace.ops:
        if op.stage != "forward":
            continue
        hit = on_matrix.get(op.name)
        if hit is None:
            hit = on_matrix[op.name] = classify(op.name, op.stage)[1] in MATRIX_CLASSES
        if hit:
            total += op_cost(op, trace.tensors).flops
    return total


def model_flops_per_sample(trace: Trace, shapes_batch: int) -> float:
    """Model FLOPs of one sample: 3 × the forward's matrix-unit FLOPs, the trace's shapes being
    those of ``shapes_batch`` samples (the batch it was recorded at: batch scaling changes a
    trace's bytes and times, not its shapes)."""
    if shapes_batch <= 0:
        raise ValueError(f"shapes_batch must be positive, got {shapes_batch}")
    return PASSES_PER_ITERATION * forward_matrix_flops(trace) / shapes_batch


__all__ = ["PASSES_PER_ITERATION", "forward_matrix_flops", "megatron_gpt_flops", "model_flops_per_sample",
           "narayanan_gpt_flops"]
