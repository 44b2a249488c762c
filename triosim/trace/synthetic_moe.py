"""The mixture-of-experts MLP of a card trace (:mod:`triosim.trace.synthetic_card`), op by op as
Megatron-Core's ``MoELayer`` runs it on one GPU holding every expert (the graph spreads the
experts over the expert-parallel ranks and adds the all-to-alls: :mod:`triosim.graph.expert`).

Forward, on the norm's output x ``[b, s, h]`` (T = b·s tokens, E experts, k per token):

- router: ``aten::linear`` x → logits ``[b, s, E]`` (a bias when the card's ``bias``);
  ``aten::_softmax`` (``router: softmax``) or ``aten::sigmoid`` → scores (fp32);
  ``aten::topk`` → the k weights (fp32) and expert indices (int64) of each token;
- ``moe::permute``: x gathered into expert order, ``[b, s·k, h]`` (one row per token and chosen
  expert: T·k rows; the batch stays the leading dimension, as every activation of a trace has it),
  and the router weights into the same order (``[b, s·k]``, fp32: Megatron-Core's
  ``permuted_probs``);
- the experts as two grouped GEMMs (``aten::_grouped_mm``, Transformer Engine's
  ``GroupedLinear``): fc1 ``[T·k, h] × [E, n1, h]`` (n1 = 2·expert_ffn for SwiGLU: gate and up
  in one weight, as Megatron-Core's ``GroupedMLP`` holds them), the activation weighted by each
  row's router weight (SwiGLU: the fused ``WeightedSwiGLUFunction`` over the gate and up halves,
  Megatron-Core's ``weighted_bias_swiglu_impl``; GELU: ``aten::gelu`` then ``aten::mul`` by the
  weights, its unfused path), fc2 ``[T·k, f] × [E, h, f]``. Under balance every expert gets T·k/E
  rows: the op's FLOPs are those of T·k rows whatever the split;
- ``moe::unpermute``: the expert outputs scattered back to token order and summed over the
  token's k experts → ``[b, s, h]``. Megatron-Core applies the router weights in the experts'
  activation since its memory-efficient permutation (Megatron-LM, April 2025), so the
  un-permutation's backward reads no saved tensor: the experts' output is not kept for it;
- shared experts (``shared_experts`` > 0): one ordinary MLP of ``shared_experts · shared_ffn``
  inner width on x (Megatron-Core's ``SharedExpertMLP``), written after the permutation and before
  the experts (backward: after the un-permutation's backward), its output added to the routed
  one; with ``--moe-shared-expert-overlap`` the DAG runs it while the tokens are dispatched.

Backward mirrors it: the un-permutation's backward (the expert outputs' gradients, a gather),
fc2's grouped backward (data and weight gradients), the activation's (its input's gradient and
the permuted router weights'), fc1's grouped backward, the permutation's backward (the tokens'
gradients summed over their k rows, the router weights' put back in token order), the top-k and
score backward, the router's, and the shared MLP's; the
input gradients of router, experts and shared MLP are summed as autograd accumulates them.

The router's load-balancing loss (a few ops over ``[b, s, E]``) is not written.
"""

from __future__ import annotations

from typing import Any

FP32, INT64 = 4, 8


def moe_forward(t: Any, x: int) -> dict:
    """The MoE MLP of builder ``t`` (a :class:`~triosim.trace.synthetic_card._CardTrace`) on the
    norm output ``x``; returns the layer's saved buffers, ``M["y"]`` its output ``[b, s, h]``."""
    c, b, s, h = t.c, t.b, t.s, t.h
    moe = c.moe
    e, k, f = moe.experts, moe.top_k, moe.expert_ffn
    rows = s * k  # per sequence: the batch stays the leading dimension, so batch scaling resizes them
    n1 = 2 * f if c.activation == "swiglu" else f
    M: dict = {"x": x}
    M["router"] = t.linear(x, h, e, tp=0)
    M["scores"] = t.new((b, s, e), nbytes=FP32)
    t.op("aten::sigmoid" if moe.router == "sigmoid" else "aten::_softmax", [M["router"]["y"]], [M["scores"]])
    M["topw"], M["topi"] = t.new((b, s, k), nbytes=FP32), t.new((b, s, k), "indices", INT64)
    t.op("aten::topk", [M["scores"]], [M["topw"], M["topi"]])
    M["xp"], M["pp"] = t.new((b, rows, h)), t.new((b, rows), nbytes=FP32)
    t.op("moe::permute", [x, M["topi"], M["topw"]], [M["xp"], M["pp"]])
    if moe.shared_experts:  # written here, between the permutation and the experts: the DAG can run it
        M["shared"] = t.mlp(x, moe.shared_experts * moe.shared_ffn)  # while the tokens are dispatched
    M["w1"] = t.param((e, n1, h))
    M["b1"] = t.param((e, n1), "bias") if c.bias else None
    M["h1"] = t.new((b, rows, n1))
    t.op("aten::_grouped_mm", [M["xp"], M["w1"]] + ([M["b1"]] if M["b1"] else []), [M["h1"]])
    M["a"] = t.new((b, rows, f))
    if c.activation == "swiglu":  # Megatron-Core's fused, weighted SwiGLU over the gate and up halves of fc1
        gate, up = t.view(M["h1"], (b, rows, f)), t.view(M["h1"], (b, rows, f))
        t.op("WeightedSwiGLUFunction", [gate, up, M["pp"]], [M["a"]])
    else:  # the unfused path: the activation, then the router weights
        M["g1"] = t.new((b, rows, f))
        t.op("aten::gelu", [M["h1"]], [M["g1"]])
        t.op("aten::mul", [M["g1"], M["pp"]], [M["a"]])
    M["w2"] = t.param((e, h, f))
    M["b2"] = t.param((e, h), "bias") if c.bias else None
    M["y2"] = t.new((b, rows, h))
    t.op("aten::_grouped_mm", [M["a"], M["w2"]] + ([M["b2"]] if M["b2"] else []), [M["y2"]])
    routed = t.act()
    t.op("moe::unpermute", [M["y2"], M["topi"]], [routed])
    M["y"] = routed
    if moe.shared_experts:
        M["y"] = t.act()
        t.op("aten::add", [routed, M["shared"]["out"]], [M["y"]])
    return M


def moe_backward(t: Any, g: int, M: dict) -> int:
    """The backward of :func:`moe_forward` from the output gradient ``g``; returns the gradient
    of its input (the router's, the experts' and the shared MLP's parts summed)."""
    c = t.c
    b, s, h, rows = t.b, t.s, t.h, t.s * c.moe.top_k
    f = c.moe.expert_ffn
    parts = []
    gy2 = t.new((b, rows, h))
    t.bwd("MoeUnpermuteBackward0", [g, M["topi"]], [gy2])
    if c.moe.shared_experts:  # between the un-permutation's backward and the experts' (as forward)
        parts.append(t.mlp_bwd(g, M["shared"]))
    ga = t.new((b, rows, f))
    t.bwd("GroupedMmBackward0", [gy2, M["a"], M["w2"]], [ga, *t.grads(M["w2"], M["b2"])])
    gh1, gpp = t.new(t.tensors[M["h1"] - 1][1]), t.new((b, rows), nbytes=FP32)
    if c.activation == "swiglu":
        t.bwd("WeightedSwiGLUFunctionBackward", [ga, M["h1"], M["pp"]], [gh1, gpp])
    else:
        gg1 = t.new((b, rows, f))
        t.bwd("MulBackward0", [ga, M["g1"], M["pp"]], [gg1, gpp])
        t.bwd("GeluBackward0", [gg1, M["h1"]], [gh1])
    gxp = t.new((b, rows, h))
    t.bwd("GroupedMmBackward0", [gh1, M["xp"], M["w1"]], [gxp, *t.grads(M["w1"], M["b1"])])
    gx, gw = t.act(), t.new((b, s, c.moe.top_k), nbytes=FP32)
    t.bwd("MoePermuteBackward0", [gxp, gpp, M["topi"]], [gx, gw])
    parts.append(gx)
    gscores = t.new(t.tensors[M["scores"] - 1][1], nbytes=FP32)
    t.bwd("TopkBackward0", [gw, M["topi"]], [gscores])
    glogits = t.new(t.tensors[M["scores"] - 1][1])
    t.bwd("SigmoidBackward0" if c.moe.router == "sigmoid" else "SoftmaxBackward0", [gscores, M["scores"]], [glogits])
    parts.append(t.linear_bwd(glogits, M["router"], tp=0))
    return t.summed(parts)


__all__ = ["moe_backward", "moe_forward"]
