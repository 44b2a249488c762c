"""The optional parts of a model card: mixture-of-experts MLPs and the attention variants of
2024–25 models, read strictly, and the parameter counts they imply.

- ``moe`` (a mapping): ``experts`` routed experts, ``top_k`` of them per token, each an MLP of
  ``expert_ffn`` inner width (the card's ``activation``); ``shared_experts`` experts every token
  goes through, each ``shared_ffn`` wide (DeepSeek's shared expert); which layers are MoE: the
  first ``first_dense`` layers are dense (the card's ``ffn``), then every ``every``-th layer is
  MoE (Megatron-Core's ``--moe-layer-freq``); ``router`` is ``softmax`` (softmax over the experts,
  then top-k: Mixtral, Qwen3, GPT-OSS) or ``sigmoid`` (sigmoid scores with a per-expert bias that
  balances the load without a loss: DeepSeek-V3); ``aux_loss`` the load-balancing loss
  coefficient (0: none). The router is one linear ``hidden → experts`` (with a bias when the
  card's ``bias`` is true, as GPT-OSS's router has).
- ``mla`` (a mapping): multi-head latent attention (DeepSeek-V2/V3): queries through a
  ``q_lora_rank`` bottleneck, keys and values through one ``kv_lora_rank`` latent plus a shared
  ``rope_head_dim``-wide rotary key; per head ``head_dim`` (no-rope) + ``rope_head_dim`` query/key
  width and ``v_head_dim`` value width.
- ``sliding_window`` (a mapping): ``window`` tokens of local attention on the layers the
  ``pattern`` marks ``sliding`` (the pattern repeats over the layers, ``full`` marks global
  attention), ``sinks``: a learned attention-sink logit per head (GPT-OSS).
- ``head_dim``: the attention head width when it is not hidden / heads (Qwen3, GPT-OSS).
- ``mtp_layers``: DeepSeek-V3's multi-token-prediction modules (each a projection of 2·hidden →
  hidden, two norms and one more transformer layer; the LM head and embedding are shared).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

ROUTERS = ("softmax", "sigmoid")
WINDOW_KINDS = ("sliding", "full")


@dataclass(frozen=True)
class MoeSpec:
    """A card's mixture-of-experts MLPs (module docstring)."""

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    shared_ffn: int = 0
    first_dense: int = 0
    every: int = 1
    router: str = "softmax"
    aux_loss: float = 0.0

    def is_moe_layer(self, layer: int) -> bool:
        """Layer ``layer`` (0-based) has an MoE MLP (Megatron-Core: the first ``first_dense``
        dense, then every ``every``-th)."""
        return layer >= self.first_dense and (layer - self.first_dense) % self.every == 0


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention's widths (module docstring)."""

    q_lora_rank: int
    kv_lora_rank: int
    rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class WindowSpec:
    """Sliding-window attention on a repeating layer pattern, with attention sinks."""

    window: int
    pattern: tuple[str, ...]
    sinks: bool = False

    def is_sliding(self, layer: int) -> bool:
        return self.pattern[layer % len(self.pattern)] == "sliding"


MOE_KEYS = {"experts": 100_000, "top_k": 100_000, "expert_ffn": 10_000_000, "shared_experts": 1_000,
            "shared_ffn": 10_000_000, "first_dense": 100_000, "every": 100_000}
MOE_REQUIRED = ("experts", "top_k", "expert_ffn")
MOE_OTHER = ("router", "aux_loss")
MLA_KEYS = {"q_lora_rank": 1_000_000, "kv_lora_rank": 1_000_000, "rope_head_dim": 100_000,
            "v_head_dim": 100_000}
WINDOW_KEYS = ("window", "pattern", "sinks")
# Where each nested key may be cited under ``sources`` (``moe.experts: "..."``).
NESTED_SOURCE_KEYS = frozenset([f"moe.{k}" for k in (*MOE_KEYS, *MOE_OTHER)]
                               + [f"mla.{k}" for k in MLA_KEYS]
                               + [f"sliding_window.{k}" for k in WINDOW_KEYS])


def _whole(where: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(f"{where}: {key}: must be a whole number from {low} to {high:,}, got {shown}")
    return value


def _mapping(where: str, key: str, data: Any, known: list[str]) -> dict:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {key}: must be a mapping of {', '.join(known)}")
    for k in data:
        if not isinstance(k, str) or k not in known:
            raise ConfigError(f"{where}: {key}: unknown key {str(k)[:40]!r} (known: {', '.join(known)})")
    return data


def parse_moe(where: str, data: Any, layers: int) -> MoeSpec:
    """The card's ``moe`` mapping, checked (``layers``: the card's depth, for ``first_dense``)."""
    data = _mapping(where, "moe", data, [*MOE_KEYS, *MOE_OTHER])
    for key in MOE_REQUIRED:
        if key not in data:
            raise ConfigError(f"{where}: moe: missing key {key!r}")
    got = {k: _whole(where, f"moe.{k}", data[k], 0 if k in ("shared_experts", "first_dense") else 1, high)
           for k, high in MOE_KEYS.items() if k in data}
    if got["top_k"] > got["experts"]:
        raise ConfigError(f"{where}: moe.top_k: {got['top_k']} is more than the {got['experts']} experts")
    if got.get("first_dense", 0) >= layers:
        raise ConfigError(f"{where}: moe.first_dense: {got['first_dense']} leaves no MoE layer of the {layers}")
    if got.get("shared_experts", 0) and "shared_ffn" not in got:
        raise ConfigError(f"{where}: moe.shared_ffn: missing (the width of each of the "
                          f"{got['shared_experts']} shared experts)")
    router = data.get("router", "softmax")
    if router not in ROUTERS:
        raise ConfigError(f"{where}: moe.router: must be one of {', '.join(ROUTERS)}, got {str(router)[:40]!r}")
    aux = data.get("aux_loss", 0.0)
    if isinstance(aux, bool) or not isinstance(aux, (int, float)) or not (math.isfinite(aux) and 0 <= aux <= 100):
        raise ConfigError(f"{where}: moe.aux_loss: must be a number from 0 to 100, got {str(aux)[:40]!r}")
    if not got.get("shared_experts", 0):
        got["shared_ffn"] = 0
    return MoeSpec(**got, router=router, aux_loss=float(aux))


def parse_mla(where: str, data: Any) -> MlaSpec:
    data = _mapping(where, "mla", data, list(MLA_KEYS))
    for key in MLA_KEYS:
        if key not in data:
            raise ConfigError(f"{where}: mla: missing key {key!r}")
    return MlaSpec(**{k: _whole(where, f"mla.{k}", data[k], 1, high) for k, high in MLA_KEYS.items()})


def parse_window(where: str, data: Any, seq_cap: int) -> WindowSpec:
    data = _mapping(where, "sliding_window", data, list(WINDOW_KEYS))
    if "window" not in data or "pattern" not in data:
        raise ConfigError(f"{where}: sliding_window: needs window and pattern")
    window = _whole(where, "sliding_window.window", data["window"], 1, seq_cap)
    pattern = data["pattern"]
    if not isinstance(pattern, list) or not pattern or len(pattern) > 1000 or \
            any(p not in WINDOW_KINDS for p in pattern):
        raise ConfigError(f"{where}: sliding_window.pattern: must be a list of {' and '.join(WINDOW_KINDS)} "
                          f"(repeated over the layers), got {str(pattern)[:40]!r}")
    sinks = data.get("sinks", False)
    if not isinstance(sinks, bool):
        raise ConfigError(f"{where}: sliding_window.sinks: must be true or false, got {str(sinks)[:40]!r}")
    return WindowSpec(window, tuple(pattern), sinks)


# ----------------------------------------------------------------------------- counts


def mlp_params(hidden: int, width: int, activation: str, bias: bool) -> int:
    """One MLP (or one expert) of inner width ``width``."""
    if activation == "gelu":
        return 2 * hidden * width + ((width + hidden) if bias else 0)
    return 3 * hidden * width + ((2 * width + hidden) if bias else 0)


def attention_params(hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool,
                     mla: MlaSpec | None, norm_each: int, sinks: bool) -> int:
    """One layer's attention: Q, K, V and output projections (GQA: K and V ``kv_heads`` wide), or
    MLA's down/up projections and latent norms (``norm_each`` parameters per normalised element:
    2 for LayerNorm, 1 for RMSNorm); plus a sink logit per head."""
    if mla is not None:
        qk = head_dim + mla.rope_head_dim
        n = (hidden * mla.q_lora_rank + norm_each * mla.q_lora_rank
             + mla.q_lora_rank * heads * qk
             + hidden * (mla.kv_lora_rank + mla.rope_head_dim) + norm_each * mla.kv_lora_rank
             + mla.kv_lora_rank * heads * (head_dim + mla.v_head_dim)
             + heads * mla.v_head_dim * hidden)
    else:
        q, kv = heads * head_dim, kv_heads * head_dim
        n = hidden * q + 2 * hidden * kv + q * hidden + ((q + 2 * kv + hidden) if bias else 0)
    return n + (heads if sinks else 0)


def moe_mlp_params(hidden: int, moe: MoeSpec, activation: str, bias: bool, experts: int | None = None) -> int:
    """One MoE MLP with ``experts`` of its routed experts (default all): router, experts, shared."""
    routed = moe.experts if experts is None else experts
    router = hidden * moe.experts + (moe.experts if bias else 0)
    return (router + routed * mlp_params(hidden, moe.expert_ffn, activation, bias)
            + moe.shared_experts * mlp_params(hidden, moe.shared_ffn, activation, bias))


__all__ = ["MOE_KEYS", "NESTED_SOURCE_KEYS", "ROUTERS", "MlaSpec", "MoeSpec", "WindowSpec", "attention_params",
           "mlp_params", "moe_mlp_params", "parse_mla", "parse_moe", "parse_window"]
