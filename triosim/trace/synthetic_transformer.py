"""Synthetic GPT-like traces (decoder layers of attention + MLP) for tests and benchmarks.

Forward: token embedding, then per layer LayerNorm → Q, K, V linears (or one fused QKV linear
and a split) → scaled-dot-product attention → output projection → residual add → LayerNorm →
fc1 → GELU → fc2 → residual add; a final LayerNorm, the LM head and the loss. With ``tied`` the head reads the embedding's table, and
the embedding's backward adds the head's part of its gradient. Backward mirrors it in reverse, with the Q/K/V input gradients summed by partner-less accumulation ops and each
LayerNorm backward writing the new residual gradient, as PyTorch's autograd does. One
``_foreach`` optimizer op (or one in-place op per parameter) reads every parameter, gradient
and two optimizer-state tensors. Written in TrioSim's CSV format, so it goes through the same
loader as a real trace.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from .synthetic import write_trace_csvs


@dataclass(frozen=True)
class SyntheticTransformer:
    layers: int = 2
    batch_size: int = 2
    seq_len: int = 16
    hidden: int = 32
    heads: int = 4
    ffn_mult: int = 4
    vocab: int = 64
    fused_qkv: bool = False
    tied: bool = False  # the LM head reads the embedding's table (tied input/output embeddings)
    foreach_optimizer: bool = True
    seed: int = 0
    min_us: float = 10.0
    max_us: float = 1000.0
    # The MLP reads the attention's output projection directly (no residual add or LayerNorm
    # between them): two blocks back to back, so one op ends the first and feeds the second.
    chained_blocks: bool = False


def write_synthetic_transformer(directory: str | os.PathLike,
                                model: SyntheticTransformer = SyntheticTransformer()) -> Path:
    """Write trace.csv, tensor.csv and meta.json for ``model`` into ``directory``."""
    if model.hidden % model.heads:
        raise ValueError("hidden must be a multiple of heads")
    rng = random.Random(model.seed)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors: list[tuple[int, tuple[int, ...], str]] = []
    ops: list[tuple[str, list[int], list[int], float, str, int]] = []
    b, s, h, f = model.batch_size, model.seq_len, model.hidden, model.hidden * model.ffn_mult
    hd = h // model.heads
    params: list[int] = []
    grad_of: dict[int, int] = {}

    def new(shape: tuple[int, ...], category: str = "output") -> int:
        tid = len(tensors) + 1
        tensors.append((tid, shape, category))
        return tid

    def param(shape: tuple[int, ...], category: str = "weight") -> int:
        p = new(shape, category)
        params.append(p)
        return p

    def op(name: str, ins: list[int], outs: list[int], stage: str = "forward", tp: int = 0) -> None:
        ops.append((name, ins, outs, rng.uniform(model.min_us, model.max_us), stage, tp))

    def bwd(name: str, ins: list[int], outs: list[int], tp: int = 0) -> None:
        op(f"autograd::engine::evaluate_function: {name}", ins, outs, "backward", tp)

    act = (b, s, h)
    ids = new((b, s), "indices")
    emb = param((model.vocab, h))
    x = new(act)
    op("aten::embedding", [emb, ids], [x], tp=1)
    layers = []
    for _ in range(model.layers):
        L: dict[str, int | list[int]] = {"x": x}
        L["ln1w"], L["ln1b"] = param((h,)), param((h,), "bias")
        L["ln1"] = new(act)
        op("aten::layer_norm", [x, L["ln1w"], L["ln1b"]], [L["ln1"]])
        if model.fused_qkv:
            L["qkvw"], L["qkvb"] = param((3 * h, h)), param((3 * h,), "bias")
            qkv = new((b, s, 3 * h))
            op("aten::linear", [L["ln1"], L["qkvw"], L["qkvb"]], [qkv], tp=1)
            L["qkv"] = qkv
            q, k, v = new(act), new(act), new(act)
            op("aten::split", [qkv], [q, k, v])
        else:
            qkv_out = []
            for name in "qkv":
                L[name + "w"], L[name + "b"] = param((h, h)), param((h,), "bias")
                t = new(act)
                op("aten::linear", [L["ln1"], L[name + "w"], L[name + "b"]], [t], tp=1)
                qkv_out.append(t)
            q, k, v = qkv_out
        L["q"], L["k"], L["v"] = q, k, v
        L["att"], L["lse"] = new((b, model.heads, s, hd)), new((b, model.heads, s))
        op("aten::scaled_dot_product_attention", [q, k, v], [L["att"], L["lse"]])
        L["ow"], L["ob"] = param((h, h)), param((h,), "bias")
        L["o"] = new(act)
        op("aten::linear", [L["att"], L["ow"], L["ob"]], [L["o"]], tp=1)
        if model.chained_blocks:
            L["x1"] = x  # the residual skips both blocks
            L["ln2"] = L["o"]
        else:
            L["x1"] = new(act)
            op("aten::add", [x, L["o"]], [L["x1"]])
            L["ln2w"], L["ln2b"] = param((h,)), param((h,), "bias")
            L["ln2"] = new(act)
            op("aten::layer_norm", [L["x1"], L["ln2w"], L["ln2b"]], [L["ln2"]])
        L["f1w"], L["f1b"] = param((f, h)), param((f,), "bias")
        L["f1"] = new((b, s, f))
        op("aten::linear", [L["ln2"], L["f1w"], L["f1b"]], [L["f1"]], tp=1)
        L["g"] = new((b, s, f))
        op("aten::gelu", [L["f1"]], [L["g"]])
        L["f2w"], L["f2b"] = param((h, f)), param((h,), "bias")
        L["f2"] = new(act)
        op("aten::linear", [L["g"], L["f2w"], L["f2b"]], [L["f2"]], tp=1)
        x = new(act)
        op("aten::add", [L["x1"], L["f2"]], [x])
        layers.append(L)
    lnfw, lnfb = param((h,)), param((h,), "bias")
    lnf = new(act)
    op("aten::layer_norm", [x, lnfw, lnfb], [lnf])
    headw = emb if model.tied else param((model.vocab, h))
    logits = new((b, s, model.vocab))
    op("aten::linear", [lnf, headw], [logits], tp=1)
    target = new((b, s), "target")
    loss = new((), "output")
    op("aten::cross_entropy_loss", [logits, target], [loss])

    def grads(*ps: int) -> list[int]:
        for p in ps:
            grad_of[p] = new(tensors[p - 1][1])
        return [grad_of[p] for p in ps]

    g_logits = new((b, s, model.vocab))
    bwd("NllLossBackward0", [loss, logits, target], [g_logits])
    g_lnf = new(act)
    # tied: the head's part of the table gradient, which autograd accumulates with the embedding's
    head_part = new((model.vocab, h), "grad") if model.tied else None
    bwd("MmBackward0", [g_logits, lnf, headw], [g_lnf, *([head_part] if model.tied else grads(headw))], tp=1)
    res = new(act)
    bwd("NativeLayerNormBackward0", [g_lnf, x, lnfw, lnfb], [*grads(lnfw, lnfb), res])
    for L in reversed(layers):
        g_g = new((b, s, f))
        bwd("AddmmBackward0", [res, L["g"], L["f2w"]], [g_g, *grads(L["f2w"], L["f2b"])], tp=1)
        g_f1 = new((b, s, f))
        bwd("GeluBackward0", [g_g, L["f1"]], [g_f1])
        g_ln2 = new(act)
        bwd("AddmmBackward0", [g_f1, L["f1w"], L["ln2"]], [g_ln2, *grads(L["f1w"], L["f1b"])], tp=1)
        if model.chained_blocks:
            res2 = g_ln2  # the attention block's output gradient is the MLP's input gradient
        else:
            res2 = new(act)
            bwd("NativeLayerNormBackward0", [g_ln2, L["x1"], L["ln2w"], L["ln2b"], res],
                [*grads(L["ln2w"], L["ln2b"]), res2])
        g_att = new((b, model.heads, s, hd))
        bwd("AddmmBackward0", [res2, L["ow"], L["att"]], [g_att, *grads(L["ow"], L["ob"])], tp=1)
        gq, gk, gv = new(act), new(act), new(act)
        bwd("ScaledDotProductAttentionBackward0", [g_att, L["q"], L["k"], L["v"], L["att"], L["lse"]],
            [gq, gk, gv])
        if model.fused_qkv:
            g_qkv = new((b, s, 3 * h))
            bwd("SplitBackward0", [gq, gk, gv, L["qkv"]], [g_qkv])
            g_ln1 = new(act)
            bwd("AddmmBackward0", [g_qkv, L["qkvw"], L["ln1"]], [g_ln1, *grads(L["qkvw"], L["qkvb"])], tp=1)
        else:
            acc = None
            for name, gin in (("v", gv), ("k", gk), ("q", gq)):
                gx = new(act)
                bwd("AddmmBackward0", [gin, L[name + "w"], L["ln1"]],
                    [gx, *grads(L[name + "w"], L[name + "b"])], tp=1)
                if acc is None:
                    acc = gx
                else:
                    summed = new(act)
                    bwd("ViewBackward0", [gx, acc], [summed], tp=1)
                    acc = summed
            g_ln1 = acc
        res3 = new(act)
        skip = res if model.chained_blocks else res2  # the residual gradient around the blocks
        bwd("NativeLayerNormBackward0", [g_ln1, L["x"], L["ln1w"], L["ln1b"], skip],
            [*grads(L["ln1w"], L["ln1b"]), res3])
        res = res3
    bwd("EmbeddingBackward0", [res, ids, *([head_part] if model.tied else [])], grads(emb), tp=1)

    state = {p: (new(tensors[p - 1][1], "input"), new(tensors[p - 1][1], "input")) for p in params}
    if model.foreach_optimizer:
        # like torch's multi-tensor Adam: one list per kind, each in parameter order
        op("aten::_foreach_addcdiv_", params + [grad_of[p] for p in params]
           + [state[p][0] for p in params] + [state[p][1] for p in params], [], "optimizer")
    else:
        for p in params:
            op("aten::add_", [p, grad_of[p], *state[p]], [], "optimizer")

    write_trace_csvs(out, tensors, ops, each_byte=lambda cat: 8 if cat in ("indices", "target") else 4)
    meta = {"batch_size": b, "device": "synthetic", "model": f"gpt{model.layers}", "seq_len": s,
            "model_description": f"synthetic GPT: {model.layers} layers, d_model {h}, {model.heads} heads, "
                                 f"vocab {model.vocab}, sequence {s}", "seed": model.seed}
    (out / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


__all__ = ["SyntheticTransformer", "write_synthetic_transformer"]
