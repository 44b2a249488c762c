"""Which ops of a trace are the linear layers FP8 training runs in FP8.

Transformer Engine runs the GEMMs of its linear modules in FP8 (the transformer layers' QKV,
output projection and MLP linears under Megatron-Core); everything else stays in bf16: the
attention core (``--fp8-dot-product-attention`` is off by default in Megatron-Core), norms,
softmax, activations, the embedding, the loss and the LM head (Megatron's ``output_layer`` is not
a Transformer Engine module). Megatron-Core can also keep the first and last transformer layers
in bf16 (``--first-last-layers-bf16``): not modelled, every transformer layer runs in FP8.

Found from the trace's shapes: a forward matmul op that reads a 2-D parameter (its weight; an MoE
layer's grouped GEMM a 3-D ``[experts, N, K]`` one) and
one activation (its input) is an FP8 linear, unless it is the LM head — its output goes to a
loss, or its weight is also read by an op that is not a matmul (a tied embedding) — or an MoE
router: its scores (its output, or what one op makes of it: softmax, sigmoid) go to a top-k.
Megatron-Core's router is ``router_gating_linear``, a PyTorch product in the input's dtype (or
``--moe-router-dtype``), not a Transformer Engine module. A backward
matmul op that reads an FP8 linear's weight is that linear's backward (data and weight
gradients). Linears reading one input (separate Q, K, V projections; gate and up) quantize it
once, as Megatron-Core's fused QKV and fc1 linears do (:attr:`Fp8Linears.quantizers`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trace import Trace
from .op_kinds import base_name, classify


@dataclass(frozen=True)
class Fp8Linear:
    """One FP8 linear: its weight buffer, its input buffer and the weight's N (outputs) × K (inputs)."""

    weight: str
    input: str
    n: int
    k: int
    groups: int = 1  # experts of a grouped GEMM (its weight is groups × N × K)


@dataclass(frozen=True)
class Fp8Linears:
    """The FP8 linears of a trace: by forward op, by backward op, and their weights and inputs."""

    forward: dict[int, Fp8Linear]
    backward: dict[int, Fp8Linear]

    @property
    def quantizers(self) -> frozenset[int]:
        """The forward ops that quantize their input: the first FP8 linear reading each input.
        Linears that read one tensor are one linear in Megatron-Core (QKV; gate and up in fc1),
        which quantizes it once; the others reuse that FP8 copy."""
        first: dict[str, int] = {}
        for i in sorted(self.forward):
            first.setdefault(self.forward[i].input, i)
        return frozenset(first.values())

    @property
    def weights(self) -> frozenset[str]:
        return frozenset(lin.weight for lin in self.forward.values())

    @property
    def inputs(self) -> frozenset[str]:
        return frozenset(lin.input for lin in self.forward.values())

    def of(self, op: int) -> Fp8Linear | None:
        return self.forward.get(op) or self.backward.get(op)


def _kinds(trace: Trace) -> list[str]:
    return [classify(op.name, op.stage)[0] for op in trace.ops]


def _linear(trace: Trace, i: int, params: frozenset[str]) -> Fp8Linear | None:
    """Forward op ``i`` as a linear (weight, input buffer, N, K), or None when it is not one. The
    shapes are the op's own tensors' (a view of a buffer has the shape the op reads)."""
    listed = [trace.tensors[t] for t in dict.fromkeys(trace.ops[i].inputs)]
    # a 2-D weight, or a grouped GEMM's [experts, N, K] (Transformer Engine's GroupedLinear runs in FP8 too)
    weights = [t for t in listed if trace.base(t.id) in params and len(t.shape or ()) in (2, 3)]
    inputs = [t for t in listed if trace.base(t.id) not in params and trace.base(t.id) not in trace.batch_invariant
              and t.shape and t.numel > 0]
    if len(weights) != 1 or not inputs:
        return None
    w, x = weights[0], max(inputs, key=lambda t: t.numel)
    a, b = w.shape[-2:]
    groups = w.shape[0] if len(w.shape) == 3 else 1
    k = 1
    for d in reversed(x.shape):  # the contraction: the input's last dim(s) (heads × head dim, unflattened)
        k *= d
        if k in (a, b):
            return Fp8Linear(trace.base(w.id), trace.base(x.id), b if k == a else a, k, groups)
    for k in (b, a):  # an input read in another layout ([batch, heads, seq, head dim]): its elements tell
        if x.numel % k == 0:
            return Fp8Linear(trace.base(w.id), trace.base(x.id), b if k == a else a, k, groups)
    return None


def _routes(trace: Trace, i: int) -> bool:
    """Whether op ``i``'s output, or what one op makes of it, is read by a top-k (an MoE router)."""
    consumers = trace.consumers
    near = {c for k in trace.writes[i] for c in consumers.get(k, ())}
    near |= {c2 for c in tuple(near) for k in trace.writes[c] for c2 in consumers.get(k, ())}
    return any(base_name(trace.ops[c].name) == "topk" for c in near)


def find_fp8_linears(trace: Trace) -> Fp8Linears:
    """The trace's FP8 linears (see the module docstring)."""
    kinds = _kinds(trace)
    params = frozenset(trace.parameters)
    consumers = trace.consumers
    forward: dict[int, Fp8Linear] = {}
    for i, kind in enumerate(kinds):
        if kind != "matmul" or trace.ops[i].stage != "forward":
            continue
        lin = _linear(trace, i, params)
        if lin is None:
            continue
        to_loss = any(kinds[c] == "loss" for k in trace.writes[i] for c in consumers.get(k, ()))
        shared = any(kinds[c] not in ("matmul", "matmul_backward", "optimizer") for c in consumers.get(lin.weight, ()))
        if not to_loss and not shared and not _routes(trace, i):
            forward[i] = lin
    by_weight: dict[str, Fp8Linear] = {}
    for lin in forward.values():
        by_weight.setdefault(lin.weight, lin)
    backward: dict[int, Fp8Linear] = {}
    for i, kind in enumerate(kinds):
        if kind == "matmul_backward":
            lin = next((by_weight[k] for k in trace.reads[i] if k in by_weight), None)
            if lin is not None:
                backward[i] = lin
    return Fp8Linears(forward, backward)


__all__ = ["Fp8Linear", "Fp8Linears", "find_fp8_linears"]
