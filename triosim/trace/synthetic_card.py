"""The training-step trace of a model card (:mod:`triosim.trace.model_card`) with its exact shapes.

What one step of a decoder-only transformer runs, op by op, as PyTorch's profiler names the ops
(the GPT sample traces of ``sample_trace/`` show the same names), on ``batch_size`` sequences:

- token embedding (plus the learned position embedding and their sum), dropout;
- per layer: norm → Q, K, V linears (K and V ``kv_heads × head_dim`` wide: grouped-query
  attention) → rotary embedding of Q and K (``position: rope``) → the attention core →
  output projection → dropout → residual add → norm → MLP (GELU: fc1, GELU, fc2; SwiGLU: gate
  and up linears, one fused SwiGLU op as Megatron-Core's, down linear) → dropout → residual add;
- final norm, LM head (the embedding's weight when tied), cross-entropy loss;
- the backward pass in reverse (the Q/K/V and gate/up input gradients summed by partner-less
  accumulation ops, each norm's backward adding the residual gradient, a tied embedding's two
  gradients summed), and one multi-tensor Adam op over every parameter, its gradient and its
  two moments.

The attention core, ``standard``: ``matmul`` (QKᵀ) → ``_softmax`` → ``native_dropout`` →
``matmul`` (·V) over ``[batch, heads, seq, seq]``, as eager PyTorch and Megatron-LM run it; the
backward pass reads the softmax output, the dropout mask and the dropout output (Korthikanti et
al.'s 5as/h bytes per layer; with ``kv_heads < heads`` the K and V heads are repeated first).
``flash``: one fused ``_scaled_dot_product_flash_attention`` op that keeps only its output and
the row log-sum-exp (fp32). Q, K, V, the scores and the context are read through views of one
storage (no copy), so the memory plan counts each once.

Element sizes: parameters, gradients and activations ``element_bytes`` (2 for bf16/fp16), the
Adam moments, norm statistics, log-sum-exp and loss fp32, dropout masks 1 byte (bool), token
IDs and targets 8 (int64). Dropout ops (and their masks) exist only when the card's dropout is
above 0. Every card is a decoder: ``meta.json`` says ``attention_mask: causal``, which halves a
fused attention op's counted FLOPs. The trace holds no measured times (every op is written with 0 µs): its op times come
from a GPU model. ``meta.json`` says ``device: synthetic`` and names the card.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .model_card import ModelCard
from .synthetic import write_trace_csvs
from .synthetic_mla import mla_backward, mla_forward
from .synthetic_moe import moe_backward, moe_forward
from .synthetic_mtp import mtp_backward, mtp_forward

FP32 = 4
# Bumped whenever the rows written for a card change: cached traces of older versions are not reused.
CARD_TRACE_VERSION = 7


@dataclass(frozen=True)
class CardTraceSpec:
    """What to build: the card, the batch (sequences per step), the element size of parameters,
    gradients and activations, and how many layers to write (a few; ``trace repeat`` makes more)."""

    card: ModelCard
    batch_size: int = 1
    element_bytes: int = 2
    layers: int = 2


class _CardTrace:
    """Builds the rows: one method per part of the step, in the order the step runs them."""

    def __init__(self, spec: CardTraceSpec) -> None:
        self.spec = spec
        c = spec.card
        self.c = c
        self.b, self.s, self.h = spec.batch_size, c.seq_len, c.hidden
        self.hd = c.head_dim
        self.kvw = c.kv_heads * self.hd
        self.qw = c.heads * self.hd  # the query (and attention output) width: hidden unless head_dim says
        self.tensors: list[tuple[int, tuple[int, ...], str]] = []
        self.ops: list[tuple[str, list[int], list[int], float, str, int]] = []
        self.size: dict[int, int] = {}
        self.storage: dict[int, int] = {}
        self.params: list[int] = []
        self.grad: dict[int, int] = {}

    # ----------------------------------------------------------------- tensors and ops

    def new(self, shape: tuple[int, ...], category: str = "output", nbytes: int | None = None) -> int:
        tid = len(self.tensors) + 1
        self.tensors.append((tid, shape, category))
        self.size[tid] = self.spec.element_bytes if nbytes is None else nbytes
        return tid

    def view(self, base: int, shape: tuple[int, ...]) -> int:
        """A view of ``base`` (same storage and bytes, another shape): read, never written."""
        tid = self.new(shape, self.tensors[base - 1][2], self.size[base])
        self.storage[tid] = self.storage.get(base, base)
        return tid

    def param(self, shape: tuple[int, ...], category: str = "weight") -> int:
        p = self.new(shape, category)
        self.params.append(p)
        return p

    def op(self, name: str, ins: list[int], outs: list[int], stage: str = "forward", tp: int = 0) -> None:
        self.ops.append((name, ins, outs, 0.0, stage, tp))

    def bwd(self, name: str, ins: list[int], outs: list[int], tp: int = 0) -> None:
        self.op(f"autograd::engine::evaluate_function: {name}", ins, outs, "backward", tp)

    def grads(self, *ps: int | None) -> list[int]:
        out = []
        for p in ps:
            if p is not None:
                self.grad[p] = self.new(self.tensors[p - 1][1])
                out.append(self.grad[p])
        return out

    def act(self, width: int | None = None) -> int:
        return self.new((self.b, self.s, self.h if width is None else width))

    # ----------------------------------------------------------------- forward parts

    def dropout(self, x: int) -> tuple[int, int | None]:
        """``native_dropout`` of ``x`` (output, 1-byte mask), or ``x`` itself without dropout."""
        if self.c.dropout <= 0:
            return x, None
        shape = self.tensors[x - 1][1]
        out, mask = self.new(shape), self.new(shape, "mask", 1)
        self.op("aten::native_dropout", [x], [out, mask])
        return out, mask

    def norm(self, x: int, width: int | None = None) -> dict:
        h = self.h if width is None else width
        n: dict = {"x": x, "w": self.param((h,))}
        n["b"] = self.param((h,), "bias") if self.c.norm == "layernorm" else None
        n["y"] = self.act(h)
        stats = (self.b, self.s, 1)
        if self.c.norm == "layernorm":
            n["stats"] = [self.new(stats, nbytes=FP32), self.new(stats, nbytes=FP32)]  # mean, rstd
            self.op("aten::layer_norm", [x, n["w"], n["b"]], [n["y"], *n["stats"]])
        else:
            n["stats"] = [self.new(stats, nbytes=FP32)]  # rstd
            self.op("aten::_fused_rms_norm", [x, n["w"]], [n["y"], *n["stats"]])
        return n

    def linear(self, x: int, width_in: int, width_out: int, tp: int = 1) -> dict:
        lin: dict = {"x": x, "w": self.param((width_out, width_in))}
        lin["b"] = self.param((width_out,), "bias") if self.c.bias else None
        lin["y"] = self.act(width_out)
        self.op("aten::linear", [x, lin["w"]] + ([lin["b"]] if lin["b"] else []), [lin["y"]], tp=tp)
        return lin

    def rope(self, t: int, width: int, table: int) -> int:
        out = self.act(width)
        self.op("aten::mul", [t, table], [out])
        return out

    def attention_core(self, L: dict, sliding: bool = False) -> None:
        b, s, hd, heads, kv = self.b, self.s, self.hd, self.c.heads, self.c.kv_heads
        q4 = self.view(L["qr"], (b, heads, s, hd))
        k4 = self.view(L["kr"], (b, kv, s, hd))
        v4 = self.view(L["v"]["y"], (b, kv, s, hd))
        L["ctx"] = self.new((b, heads, s, hd))
        if self.c.attention == "flash":
            L["lse"] = self.new((b, heads, s), nbytes=FP32)
            keys, values = k4, v4
            if sliding:  # each query sees the window's keys: the op's work is s × window, not s × s
                w = min(self.c.sliding_window.window, s)
                keys, values = self.view(L["kr"], (b, kv, w, hd)), self.view(L["v"]["y"], (b, kv, w, hd))
            L["core_in"] = [q4, keys, values]
            if self.c.sliding_window is not None and self.c.sliding_window.sinks:  # a learned sink logit per head
                L["sink"] = self.param((heads,))
                L["core_in"].append(L["sink"])
            self.op("aten::_scaled_dot_product_flash_attention", L["core_in"], [L["ctx"], L["lse"]])
            return
        if kv < heads:  # grouped-query attention, unfused: each K/V head repeated for its query heads
            L["k_rep"], L["v_rep"] = self.new((b, heads, s, hd)), self.new((b, heads, s, hd))
            self.op("aten::repeat_interleave", [k4], [L["k_rep"]])
            self.op("aten::repeat_interleave", [v4], [L["v_rep"]])
            k4, v4 = L["k_rep"], L["v_rep"]
        L["q4"], L["kt"], L["v4"] = q4, self.view(k4, (b, heads, hd, s)), v4
        scores, L["probs"] = self.new((b, heads, s, s)), self.new((b, heads, s, s))
        self.op("aten::matmul", [q4, L["kt"]], [scores])
        self.op("aten::_softmax", [scores], [L["probs"]])
        L["pd"], L["att_mask"] = self.dropout(L["probs"])
        self.op("aten::matmul", [L["pd"], v4], [L["ctx"]])

    def mlp(self, x: int, f: int) -> dict:
        """A dense MLP of inner width ``f`` on ``x``: its buffers, ``["out"]`` its output."""
        h = self.h
        L: dict = {}
        if self.c.activation == "gelu":
            L["fc1"] = self.linear(x, h, f)
            L["a"] = self.act(f)
            self.op("aten::gelu", [L["fc1"]["y"]], [L["a"]])
        else:
            L["gate"], L["up"] = self.linear(x, h, f), self.linear(x, h, f)
            L["a"] = self.act(f)
            # Megatron-Core's fused SwiGLU (bias_swiglu_fusion, on by default; SwiGLUFunction in
            # megatron/core/fusions/fused_bias_swiglu.py): one kernel that saves only its input,
            # the gate and up projections, and recomputes SiLU in its backward
            self.op("SwiGLUFunction", [L["gate"]["y"], L["up"]["y"]], [L["a"]])
        L["fc2"] = self.linear(L["a"], f, h)
        L["out"], L["f"] = L["fc2"]["y"], f
        return L

    def layer(self, x: int, table: int | None, index: int = 0) -> tuple[dict, int]:
        h, kvw, qw = self.h, self.kvw, self.qw
        L: dict = {"x": x, "n1": self.norm(x)}
        ln1 = L["n1"]["y"]
        if self.c.mla is not None:
            mla_forward(self, L, ln1, table)
            qw = self.c.heads * self.c.mla.v_head_dim
        else:
            L["q"], L["k"], L["v"] = self.linear(ln1, h, qw), self.linear(ln1, h, kvw), self.linear(ln1, h, kvw)
            L["qr"], L["kr"] = L["q"]["y"], L["k"]["y"]
            if table is not None:
                L["qr"], L["kr"] = self.rope(L["q"]["y"], qw, table), self.rope(L["k"]["y"], kvw, table)
            window = self.c.sliding_window
            self.attention_core(L, window is not None and window.is_sliding(index))
        L["o"] = self.linear(self.view(L["ctx"], (self.b, self.s, qw)), qw, h)
        od, L["m1"] = self.dropout(L["o"]["y"])
        L["x1"] = self.act()
        self.op("aten::add", [x, od], [L["x1"]])
        L["n2"] = self.norm(L["x1"])
        if self.c.is_moe_layer(index):
            L["moe"] = moe_forward(self, L["n2"]["y"])
            mlp_out = L["moe"]["y"]
        else:
            L["mlp"] = self.mlp(L["n2"]["y"], self.c.ffn)
            mlp_out = L["mlp"]["out"]
        fd, L["m2"] = self.dropout(mlp_out)
        out = self.act()
        self.op("aten::add", [L["x1"], fd], [out])
        return L, out

    # ----------------------------------------------------------------- backward parts

    def dropout_bwd(self, g: int, mask: int | None) -> int:
        if mask is None:
            return g
        out = self.new(self.tensors[g - 1][1])
        self.bwd("NativeDropoutBackward0", [g, mask], [out])
        return out

    def linear_bwd(self, g: int, lin: dict, grad_in_shape: tuple[int, ...] | None = None, tp: int = 1) -> int:
        gx = self.new(grad_in_shape or self.tensors[lin["x"] - 1][1])
        if lin["b"] is not None:
            self.bwd("AddmmBackward0", [g, lin["w"], lin["x"]], [gx, *self.grads(lin["w"], lin["b"])], tp=tp)
        else:
            self.bwd("MmBackward0", [g, lin["x"], lin["w"]], [gx, *self.grads(lin["w"])], tp=tp)
        return gx

    def summed(self, parts: list[int]) -> int:
        """Input gradients of linears that read one tensor, summed as autograd accumulates them."""
        acc = parts[0]
        for gx in parts[1:]:
            out = self.new(self.tensors[acc - 1][1])
            self.bwd("ViewBackward0", [gx, acc], [out], tp=1)
            acc = out
        return acc

    def norm_bwd(self, g: int, n: dict, residual: int | None) -> int:
        """The norm's input gradient plus ``residual`` (the gradient the residual add passes by)."""
        res = self.act(self.tensors[n["w"] - 1][1][0])
        name = "NativeLayerNormBackward0" if self.c.norm == "layernorm" else "FusedRmsNormBackward0"
        ps = [n["w"]] + ([n["b"]] if n["b"] else [])
        extra = [residual] if residual is not None else []
        self.bwd(name, [g, n["x"], *n["stats"], *ps, *extra], [*self.grads(*ps), res])
        return res

    def attention_core_bwd(self, L: dict, g_ctx: int) -> tuple[int, int, int]:
        b, s, hd, heads, kv = self.b, self.s, self.hd, self.c.heads, self.c.kv_heads
        if self.c.attention == "flash":
            gq, gk, gv = self.new((b, heads, s, hd)), self.new((b, kv, s, hd)), self.new((b, kv, s, hd))
            self.bwd("ScaledDotProductFlashAttentionBackward0", [g_ctx, *L["core_in"], L["ctx"], L["lse"]],
                     [gq, gk, gv, *self.grads(L.get("sink"))])
            return gq, gk, gv
        g_pd, gv = self.new((b, heads, s, s)), self.new((b, heads, s, hd))
        self.bwd("BmmBackward0", [g_ctx, L["pd"], L["v4"]], [g_pd, gv])
        g_probs = self.dropout_bwd(g_pd, L["att_mask"])
        g_scores = self.new((b, heads, s, s))
        self.bwd("SoftmaxBackward0", [g_probs, L["probs"]], [g_scores])
        gq, gk = self.new((b, heads, s, hd)), self.new((b, heads, s, hd))
        self.bwd("BmmBackward0", [g_scores, L["q4"], L["kt"]], [gq, gk])
        if kv < heads:  # the repeated heads' gradients summed back onto each K/V head
            gk_kv, gv_kv = self.new((b, kv, s, hd)), self.new((b, kv, s, hd))
            self.bwd("ExpandBackward0", [gv], [gv_kv])
            self.bwd("ExpandBackward0", [gk], [gk_kv])
            gk, gv = gk_kv, gv_kv
        return gq, gk, gv

    def mlp_bwd(self, g: int, L: dict) -> int:
        """The backward of :meth:`mlp` from its output gradient: its input's gradient."""
        g_a = self.linear_bwd(g, L["fc2"])
        if self.c.activation == "gelu":
            g_f1 = self.new(self.tensors[L["fc1"]["y"] - 1][1])
            self.bwd("GeluBackward0", [g_a, L["fc1"]["y"]], [g_f1])
            return self.linear_bwd(g_f1, L["fc1"])
        g_gate, g_up = self.act(L["f"]), self.act(L["f"])
        self.bwd("SwiGLUFunctionBackward", [g_a, L["gate"]["y"], L["up"]["y"]], [g_gate, g_up])
        return self.summed([self.linear_bwd(g_up, L["up"]), self.linear_bwd(g_gate, L["gate"])])

    def layer_bwd(self, L: dict, res: int, table: int | None) -> int:
        g = self.dropout_bwd(res, L["m2"])
        g_ln2 = moe_backward(self, g, L["moe"]) if "moe" in L else self.mlp_bwd(g, L["mlp"])
        res2 = self.norm_bwd(g_ln2, L["n2"], res)
        g_o = self.dropout_bwd(res2, L["m1"])
        if self.c.mla is not None:
            g_ctx = self.linear_bwd(g_o, L["o"], (self.b, self.c.heads, self.s, self.c.mla.v_head_dim))
            return self.norm_bwd(mla_backward(self, L, g_ctx, table), L["n1"], res2)
        g_ctx = self.linear_bwd(g_o, L["o"], (self.b, self.c.heads, self.s, self.hd))

        gq, gk, gv = self.attention_core_bwd(L, g_ctx)
        if table is not None:
            gq_in, gk_in = self.act(self.qw), self.act(self.kvw)
            self.bwd("MulBackward0", [gk, table], [gk_in])
            self.bwd("MulBackward0", [gq, table], [gq_in])
            gq, gk = gq_in, gk_in
        g_ln1 = self.summed([self.linear_bwd(gv, L["v"], self.tensors[L["n1"]["y"] - 1][1]),
                             self.linear_bwd(gk, L["k"], self.tensors[L["n1"]["y"] - 1][1]),
                             self.linear_bwd(gq, L["q"], self.tensors[L["n1"]["y"] - 1][1])])
        return self.norm_bwd(g_ln1, L["n1"], res2)

    # ----------------------------------------------------------------- the step

    def build(self) -> None:
        c, b, s, h = self.c, self.b, self.s, self.h
        ids = self.new((b, s), "indices", 8)
        wte = self.param((c.vocab, h))
        tok = self.act()
        self.op("aten::embedding", [wte, ids], [tok], tp=1)
        wpe = pos_ids = None
        x0 = tok
        if c.position == "learned":
            pos_ids, wpe = self.new((s,), "indices", 8), self.param((c.seq_len, h))
            pos, x0 = self.new((s, h)), self.act()
            self.op("aten::embedding", [wpe, pos_ids], [pos], tp=1)
            self.op("aten::add", [tok, pos], [x0])
        x, m0 = self.dropout(x0)
        # RoPE's cos/sin table: a constant every layer reads (fp32, one row per position)
        table = self.new((s, self.hd), "input", FP32) if c.position == "rope" else None
        layers = []
        for index in range(self.spec.layers):
            L, x = self.layer(x, table, index)
            layers.append(L)
        nf = self.norm(x)
        head = {"x": nf["y"], "w": wte if c.tied_embeddings else self.param((c.vocab, h)), "b": None}
        logits = self.act(c.vocab)
        self.op("aten::linear", [nf["y"], head["w"]], [logits], tp=1)
        target, loss = self.new((b, s), "target", 8), self.new((), nbytes=FP32)
        self.op("aten::cross_entropy_loss", [logits, target], [loss])
        mtps, hidden = [], x  # multi-token prediction: each module on the previous depth's hidden state
        for k in range(c.mtp_layers):
            M, hidden = mtp_forward(self, hidden, wte, head["w"], table, self.spec.layers + k)
            mtps.append(M)

        g_logits = self.act(c.vocab)
        self.bwd("NllLossBackward0", [loss, logits, target], [g_logits])
        g_nf = self.act()
        self.bwd("MmBackward0", [g_logits, nf["y"], head["w"]], [g_nf, *self.grads(head["w"])], tp=1)
        g_next, emb_parts = None, []
        for M in reversed(mtps):
            g_next, part = mtp_backward(self, M, g_next, table)
            emb_parts.append(part)
        res = self.norm_bwd(g_nf, nf, g_next)  # the MTP module's gradient of the hidden state added
        for L in reversed(layers):
            res = self.layer_bwd(L, res, table)
        g_x0 = self.dropout_bwd(res, m0)
        if wpe is not None:
            self.bwd("EmbeddingBackward0", [g_x0, pos_ids], self.grads(wpe), tp=1)
        if c.tied_embeddings:  # the head's gradient of the shared weight plus the embedding's
            part = self.new((c.vocab, h))
            self.bwd("EmbeddingBackward0", [g_x0, ids], [part], tp=1)
            self.op("aten::add_", [self.grad[wte], part], [self.grad[wte]], "backward")
        else:
            self.bwd("EmbeddingBackward0", [g_x0, ids], self.grads(wte), tp=1)
        for part in emb_parts:  # the MTP modules' share of the embedding's gradient
            self.op("aten::add_", [self.grad[wte], part], [self.grad[wte]], "backward")
        moments = [(self.new(self.tensors[p - 1][1], "input", FP32), self.new(self.tensors[p - 1][1], "input", FP32))
                   for p in self.params]
        # like torch's multi-tensor Adam: one list per kind, each in parameter order
        self.op("aten::_foreach_addcdiv_", self.params + [self.grad[p] for p in self.params]
                + [m for m, _ in moments] + [v for _, v in moments], [], "optimizer")


def leading_layers(card: ModelCard) -> int:
    """Decoder layers the trace holds before its repeated ones: an MoE card's first dense layers
    when every later layer is MoE (Megatron's pipeline rules count them; they run with the
    embedding). With MoE layers every k-th (k > 1) the repeated unit is not one layer: 0."""
    moe = card.moe
    if moe is None or card.moe_layers != card.layers - moe.first_dense:
        return 0
    return moe.first_dense


def write_card_trace(directory: str | os.PathLike, spec: CardTraceSpec) -> Path:
    """Write trace.csv, tensor.csv and meta.json of ``spec`` into ``directory``."""
    if spec.layers < 1 or spec.batch_size < 1 or spec.element_bytes not in (1, 2, 4, 8):
        raise ValueError(f"bad card trace spec: {spec.layers} layers, batch {spec.batch_size}, "
                         f"{spec.element_bytes}-byte elements")
    t = _CardTrace(spec)
    t.build()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    write_trace_csvs(out, t.tensors, t.ops, storage_base=1, element_bytes=t.size, storage=t.storage)
    c = spec.card
    meta = {"batch_size": spec.batch_size, "device": "synthetic", "model": c.name, "seq_len": c.seq_len,
            "model_card": c.name, "model_card_digest": c.digest(), "element_bytes": spec.element_bytes,
            "traced_layers": spec.layers, "card_layers": c.layers, "attention_mask": "causal",
            "leading_layers": leading_layers(c), "mtp_layers": c.mtp_layers,
            "model_description": f"model card {c.name}: {c.layers} layers, hidden {c.hidden}, {c.heads} heads "
                                 f"({c.kv_heads} key/value), FFN {c.ffn} ({c.activation}), vocab {c.vocab}, "
                                 f"sequence {c.seq_len}, {c.norm}, {c.attention} attention, {c.position} positions"}
    (out / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


__all__ = ["CARD_TRACE_VERSION", "CardTraceSpec", "write_card_trace"]
