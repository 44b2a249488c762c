"""Multi-token prediction (DeepSeek-V3; Megatron-Core's ``--mtp-num-layers``) in a card trace
(:mod:`triosim.trace.synthetic_card`).

Module k (k = 1 … ``mtp_layers``) predicts the token k + 1 ahead. Forward, after the main loss:
the embedding of the input shifted by k (the main model's table), normalised; the previous depth's
hidden state (the main model's last layer output for k = 1), normalised; the two joined
(``aten::cat``, 2·hidden wide) and projected back to hidden (``eh_proj``); one transformer layer
(an MoE layer, as the main model's last); a final norm; the main model's LM head and a
cross-entropy loss. Backward mirrors it: the LM head's and the embedding's weight gradients are
added to the main model's (``aten::add_``), and the gradient of the hidden state it read is
summed with the main model's.
"""

from __future__ import annotations

from typing import Any

INT64, FP32 = 8, 4


def mtp_forward(t: Any, x: int, wte: int, head_w: int, table: int | None, index: int) -> tuple[dict, int]:
    """One MTP module of builder ``t`` on hidden state ``x``; returns its buffers and its layer's
    output (the next module's input)."""
    c, b, s, h = t.c, t.b, t.s, t.h
    M: dict = {"ids": t.new((b, s), "indices", INT64)}
    M["emb"] = t.act()
    t.op("aten::embedding", [wte, M["ids"]], [M["emb"]], tp=1)
    M["en"], M["hn"] = t.norm(M["emb"]), t.norm(x)
    M["cat"] = t.act(2 * h)
    t.op("aten::cat", [M["en"]["y"], M["hn"]["y"]], [M["cat"]])
    M["eh"] = t.linear(M["cat"], 2 * h, h)
    M["layer"], y = t.layer(M["eh"]["y"], table, index)
    M["nf"] = t.norm(y)
    M["head_w"], M["logits"] = head_w, t.act(c.vocab)
    t.op("aten::linear", [M["nf"]["y"], head_w], [M["logits"]], tp=1)
    M["target"], M["loss"] = t.new((b, s), "target", INT64), t.new((), nbytes=FP32)
    t.op("aten::cross_entropy_loss", [M["logits"], M["target"]], [M["loss"]])
    return M, y


def mtp_backward(t: Any, M: dict, g_out: int | None, table: int | None) -> tuple[int, int]:
    """The backward of one module (``g_out``: the gradient of its layer output from the next
    module, if any); returns the gradient of the hidden state it read and its part of the
    embedding's weight gradient. Its part of the LM head's gradient is added in place."""
    c, h = t.c, t.h
    g_logits = t.act(c.vocab)
    t.bwd("NllLossBackward0", [M["loss"], M["logits"], M["target"]], [g_logits])
    g_nf, part = t.act(), t.new((c.vocab, h))
    t.bwd("MmBackward0", [g_logits, M["nf"]["y"], M["head_w"]], [g_nf, part], tp=1)
    t.op("aten::add_", [t.grad[M["head_w"]], part], [t.grad[M["head_w"]]], "backward")
    res = t.norm_bwd(g_nf, M["nf"], g_out)
    res = t.layer_bwd(M["layer"], res, table)
    g_cat = t.linear_bwd(res, M["eh"])
    g_en, g_hn = t.act(), t.act()
    t.bwd("CatBackward0", [g_cat], [g_en, g_hn])
    g_x = t.norm_bwd(g_hn, M["hn"], None)
    g_emb = t.norm_bwd(g_en, M["en"], None)
    emb_part = t.new((c.vocab, h))
    t.bwd("EmbeddingBackward0", [g_emb, M["ids"]], [emb_part], tp=1)
    return g_x, emb_part


__all__ = ["mtp_backward", "mtp_forward"]
