"""Multi-head latent attention (DeepSeek-V2/V3) in a card trace (:mod:`triosim.trace.synthetic_card`).

Forward, on the norm output x ``[b, s, h]`` (H heads, d no-rope and r rope width per head, v
value width, latent ranks q_l and kv_l):

- queries: ``q_a`` linear h → q_l, RMS norm, ``q_b`` linear q_l → H·(d + r), rotary (``aten::mul``);
- keys and values: ``kv_a`` linear h → kv_l + r (the latent and one rope key shared by the
  heads), RMS norm of the latent, ``kv_b`` linear kv_l → H·(d + v), the rope key rotated and
  joined to each head's key (``aten::cat``: keys ``[b, H, s, d + r]``);
- one fused attention op over queries and keys of d + r and values of v per head, then the output
  projection H·v → h.

Backward mirrors it (the joined keys' gradient split back by ``CatBackward0``; the two
projections' input gradients summed). The attention op is costed as
:mod:`triosim.compute.op_cost` costs any fused attention (4·numel(q)·s: both products at the
query/key width d + r, where the value product is v wide: +20 % on this op for DeepSeek-V3).
"""

from __future__ import annotations

from typing import Any

FP32 = 4


def mla_forward(t: Any, L: dict, ln1: int, table: int | None) -> None:
    """Builder ``t``'s MLA of the norm output ``ln1``: fills ``L`` (``L["ctx"]`` the output of the
    attention op, ``[b, H, s, v]``)."""
    c, b, s, h = t.c, t.b, t.s, t.h
    m = c.mla
    heads, d, r, v = c.heads, c.head_dim, m.rope_head_dim, m.v_head_dim
    L["qa"] = t.linear(ln1, h, m.q_lora_rank)
    L["qn"] = t.norm(L["qa"]["y"], m.q_lora_rank)
    L["qb"] = t.linear(L["qn"]["y"], m.q_lora_rank, heads * (d + r))
    L["kva"] = t.linear(ln1, h, m.kv_lora_rank + r)
    latent = t.view(L["kva"]["y"], (b, s, m.kv_lora_rank))
    L["kvn"] = t.norm(latent, m.kv_lora_rank)
    L["kvb"] = t.linear(L["kvn"]["y"], m.kv_lora_rank, heads * (d + v))
    q = L["qb"]["y"]
    k_rope = t.view(L["kva"]["y"], (b, s, r))
    if table is not None:
        q, k_rope = t.rope(q, heads * (d + r), table), t.rope(k_rope, r, table)
    L["qr"] = q
    L["keys"] = t.new((b, heads, s, d + r))
    t.op("aten::cat", [t.view(L["kvb"]["y"], (b, heads, s, d)), k_rope], [L["keys"]])
    q4 = t.view(q, (b, heads, s, d + r))
    v4 = t.view(L["kvb"]["y"], (b, heads, s, v))
    L["ctx"] = t.new((b, heads, s, v))
    L["lse"] = t.new((b, heads, s), nbytes=FP32)
    t.op("aten::_scaled_dot_product_flash_attention", [q4, L["keys"], v4], [L["ctx"], L["lse"]])
    L["core_in"] = [q4, L["keys"], v4]


def mla_backward(t: Any, L: dict, g_ctx: int, table: int | None) -> int:
    """The backward of :func:`mla_forward` from the attention output's gradient; returns the
    gradient of its input (the query and key/value paths summed)."""
    c, b, s = t.c, t.b, t.s
    m = c.mla
    heads, d, r, v = c.heads, c.head_dim, m.rope_head_dim, m.v_head_dim
    gq, gk, gv = t.new((b, heads, s, d + r)), t.new((b, heads, s, d + r)), t.new((b, heads, s, v))
    t.bwd("ScaledDotProductFlashAttentionBackward0", [g_ctx, *L["core_in"], L["ctx"], L["lse"]], [gq, gk, gv])
    g_kvb, g_rope = t.act(heads * (d + v)), t.act(r)
    t.bwd("CatBackward0", [gk, gv], [g_kvb, g_rope])
    if table is not None:
        gq_in, g_rope_in = t.act(heads * (d + r)), t.act(r)
        t.bwd("MulBackward0", [gq, table], [gq_in])
        t.bwd("MulBackward0", [g_rope, table], [g_rope_in])
        gq, g_rope = gq_in, g_rope_in
    g_qn = t.linear_bwd(gq, L["qb"], t.tensors[L["qn"]["y"] - 1][1])
    g_qa = t.norm_bwd(g_qn, L["qn"], None)
    g_kvn = t.linear_bwd(g_kvb, L["kvb"])
    g_latent = t.norm_bwd(g_kvn, L["kvn"], None)
    g_kva = t.act(m.kv_lora_rank + r)
    t.bwd("CatBackward0", [g_latent, g_rope], [g_kva])
    return t.summed([t.linear_bwd(g_kva, L["kva"]), t.linear_bwd(g_qa, L["qa"])])


__all__ = ["mla_backward", "mla_forward"]
