"""Model cards: a transformer's shapes as data (one YAML file per model), read strictly.

A card names what the training step of a decoder-only transformer computes: ``layers``,
``hidden`` (d_model), ``heads`` and ``kv_heads`` (fewer key/value heads than query heads is
grouped-query attention), ``ffn`` (the MLP's inner width), ``vocab``, ``seq_len`` (the training
sequence), ``activation`` (``gelu``: fc1 → GELU → fc2; ``swiglu``: gate and up projections, SiLU
of the gate times up, down projection), ``norm`` (``layernorm`` with a bias, ``rmsnorm``
without), ``tied_embeddings`` (the LM head reuses the token embedding), ``attention``
(``standard``: QKᵀ, softmax, dropout and ·V as separate kernels that keep the s×s scores for
the backward pass; ``flash``: one fused kernel that keeps only its output and the row
log-sum-exp), ``position`` (``learned``: a position-embedding table of ``seq_len`` rows;
``rope``: rotary, no parameters), ``bias`` (the linear layers have biases) and ``dropout``
(probability of the hidden and attention dropout; 0 means none, and no dropout ops). The
shipped cards cite the public source of each number under ``sources`` and the published
parameter count under ``published_params``.

Mixture-of-experts cards and the attention variants of 2024–25 models add the optional
``moe``, ``mla``, ``sliding_window``, ``head_dim`` and ``mtp_layers`` keys
(:mod:`triosim.trace.card_variants`), and ``published_active_params`` (parameters one token
uses, as the model's authors count them: ``active_counts_embedding: false`` when their count
leaves the input embedding out).

Every problem in a card is one :class:`~triosim.errors.ConfigError` line naming the file and
the key (a misspelt key gets a "did you mean").
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.resources
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..limits import MAX_LAYERS
from ..safe_yaml import parse_yaml_text, read_text_file
from .card_variants import (
    NESTED_SOURCE_KEYS,
    MlaSpec,
    MoeSpec,
    WindowSpec,
    attention_params,
    mlp_params,
    moe_mlp_params,
    parse_mla,
    parse_moe,
    parse_window,
)

ACTIVATIONS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
ATTENTIONS = ("standard", "flash")
POSITIONS = ("learned", "rope")
# Counts a card gives, and the largest each may be: a model of 10^6 layers or a 10^7-wide
# hidden size is a typo, and keeping them bounded keeps every shape product exact. Layers: as
# many as a trace may be repeated to.
COUNT_FIELDS = {"layers": MAX_LAYERS, "hidden": 1_000_000, "heads": 100_000, "kv_heads": 100_000,
                "ffn": 10_000_000, "vocab": 100_000_000, "seq_len": 10_000_000}
CHOICE_FIELDS = {"activation": ACTIVATIONS, "norm": NORMS, "attention": ATTENTIONS, "position": POSITIONS}
BOOL_FIELDS = ("tied_embeddings", "bias")
REQUIRED = (*COUNT_FIELDS, *CHOICE_FIELDS, *BOOL_FIELDS)
OPTIONAL = ("name", "description", "dropout", "published_params", "sources", "head_dim", "moe", "mla",
            "sliding_window", "mtp_layers", "published_active_params", "active_counts_embedding")
# Not shapes: what the generated trace does not depend on.
NOT_SHAPES = ("name", "description", "published_params", "published_active_params", "active_counts_embedding",
              "sources", "path")
KEYS = frozenset((*REQUIRED, *OPTIONAL))
# A card's name: a plain file name, never a path (``../x``, ``/tmp/x``), a hidden name or ``..``.
PLAIN_NAME = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


@dataclass(frozen=True)
class ModelCard:
    """One decoder-only transformer's shapes (see the module docstring for each field)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    activation: str
    norm: str
    tied_embeddings: bool
    attention: str
    position: str
    bias: bool
    dropout: float = 0.0
    description: str = ""
    published_params: float | None = None
    head_dim_given: int | None = None  # ``head_dim`` when it is not hidden / heads
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    sliding_window: WindowSpec | None = None
    mtp_layers: int = 0
    published_active_params: float | None = None
    active_counts_embedding: bool = True
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    path: str = field(default="", compare=False, hash=False)

    @property
    def head_dim(self) -> int:
        return self.head_dim_given or self.hidden // self.heads

    def is_moe_layer(self, layer: int) -> bool:
        """Layer ``layer`` (0-based; the MTP layers after the main ones) has an MoE MLP."""
        return self.moe is not None and (layer >= self.layers or self.moe.is_moe_layer(layer))

    @property
    def moe_layers(self) -> int:
        """MoE layers of the main model (the MTP layers not counted)."""
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @property
    def uniform_layers(self) -> bool:
        """Every layer alike (a trace of two layers repeats to the card's depth)."""
        return (self.moe is None or self.moe_layers == self.layers) and self.mtp_layers == 0 and (
            self.sliding_window is None or len(set(self.sliding_window.pattern)) == 1)

    def with_seq_len(self, seq_len: int) -> ModelCard:
        """The card trained at another sequence length (``--seq-len``)."""
        return replace(self, seq_len=seq_len)

    def shape_key(self) -> dict[str, Any]:
        """What the generated trace depends on (not the name, description or sources)."""
        data = asdict(self)
        for k in NOT_SHAPES:
            data.pop(k)
        return data

    def digest(self) -> str:
        """A hash of :meth:`shape_key`: two cards with the same shapes build the same trace."""
        text = json.dumps(self.shape_key(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def _norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def layer_parameters(self, layer: int, routed: int | None = None) -> int:
        """Layer ``layer``'s parameters (its MoE MLP with ``routed`` of its experts; default all)."""
        h, norm = self.hidden, self._norm_params()
        window = self.sliding_window
        attn = attention_params(h, self.heads, self.kv_heads, self.head_dim, self.bias, self.mla,
                                norm // h, window is not None and window.sinks)
        if self.is_moe_layer(layer):
            assert self.moe is not None
            mlp = moe_mlp_params(h, self.moe, self.activation, self.bias, routed)
        else:
            mlp = mlp_params(h, self.ffn, self.activation, self.bias)
        return 2 * norm + attn + mlp

    def _embedding_parameters(self) -> int:
        return self.vocab * self.hidden + (self.seq_len * self.hidden if self.position == "learned" else 0)

    def parameter_count(self) -> int:
        """Parameters implied by the shapes (the closed form the generated trace must match),
        the multi-token-prediction modules left out (:meth:`mtp_parameter_count`)."""
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        body = sum(self.layer_parameters(i) for i in range(self.layers))
        return body + self._embedding_parameters() + self._norm_params() + head

    def mtp_parameter_count(self) -> int:
        """The multi-token-prediction modules' own parameters (DeepSeek-V3: each two norms of its
        inputs, a 2·hidden → hidden projection, one transformer layer and a final norm; the
        embedding and the LM head are the main model's)."""
        h = self.hidden
        one = 3 * self._norm_params() + 2 * h * h + self.layer_parameters(self.layers - 1)
        return self.mtp_layers * one

    def active_parameter_count(self) -> int:
        """Parameters one token goes through: every MoE layer with ``top_k`` of its routed experts
        (the input embedding left out when ``active_counts_embedding`` is false, as the model's
        authors count it); the MTP modules left out."""
        if self.moe is None:
            total = self.parameter_count()
        else:
            head = 0 if self.tied_embeddings else self.vocab * self.hidden
            body = sum(self.layer_parameters(i, self.moe.top_k) for i in range(self.layers))
            total = body + self._embedding_parameters() + self._norm_params() + head
        if not self.active_counts_embedding:
            total -= self.vocab * self.hidden if not self.tied_embeddings else 0
        return total


# ----------------------------------------------------------------------------- reading


def _close(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"


def _count(where: str, key: str, value: Any) -> int:
    limit = COUNT_FIELDS[key]
    if isinstance(value, bool) or not isinstance(value, int):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(f"{where}: {key}: must be a whole number, got {shown}")
    if not 1 <= value <= limit:
        shown = str(value) if len(str(value)) <= 24 else f"a number of {len(str(value))} digits"
        raise ConfigError(f"{where}: {key}: must be between 1 and {limit:,}, got {shown}")
    return value


def _whole_key(where: str, key: str, value: Any, high: int, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(f"{where}: {key}: must be a whole number from {low} to {high:,}, got {shown}")
    return value


def _number(where: str, key: str, value: Any, low: float, high: float) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    x = math.nan
    if ok:
        try:
            x = float(value)
        except OverflowError:
            ok = False
    if not ok or not math.isfinite(x) or not low <= x <= high:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(f"{where}: {key}: must be a number from {low:g} to {high:g}, got {shown}")
    return x


def _text(where: str, key: str, value: Any, one_line: bool = False) -> str:
    """Text of the card, its whitespace collapsed; ``one_line``: a line break is an error (a
    description is shown as one line; a source may be folded over several)."""
    if not isinstance(value, str) or not value.strip() or len(value) > 2000 or \
            (one_line and len(value.strip().splitlines()) > 1):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(f"{where}: {key}: must be a non-empty line of text, got {shown}")
    return " ".join(value.split())


def _name(where: str, value: Any) -> str:
    """The card's ``name``: one plain word, usable as a file name (it names the card's cached
    trace, and ``--model NAME`` looks it up): no directory part, no ``..``, no spaces."""
    if not isinstance(value, str) or not PLAIN_NAME.fullmatch(value.strip()):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(f"{where}: name: must be a plain name of letters, digits, '.', '_', '+' and '-' "
                          f"(no '/', no '..', at most 100 characters), got {shown}")
    return value.strip().lower()


def parse_card(where: str, data: Any, default_name: str = "") -> ModelCard:
    """Check a card's mapping and build the ModelCard (``where`` names the file in errors)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of model fields (layers, hidden, heads, ...) at the top level")
    for key in data:
        if not isinstance(key, str) or key not in KEYS:
            raise ConfigError(f"{where}: unknown key {str(key)[:40]!r}{_close(str(key), sorted(KEYS))}")
    for key in REQUIRED:
        if key not in data:
            raise ConfigError(f"{where}: missing key {key!r}")
    counts = {k: _count(where, k, data[k]) for k in COUNT_FIELDS}
    choices = {}
    for key, allowed in CHOICE_FIELDS.items():
        value = data[key]
        word = value.strip().lower() if isinstance(value, str) else None
        if word not in allowed:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise ConfigError(f"{where}: {key}: must be one of {', '.join(allowed)}, got {shown}")
        choices[key] = word
    flags = {}
    for key in BOOL_FIELDS:
        if not isinstance(data[key], bool):
            raise ConfigError(f"{where}: {key}: must be true or false, got {str(data[key])[:40]!r}")
        flags[key] = data[key]
    head_dim = data.get("head_dim")
    if head_dim is not None:
        head_dim = _whole_key(where, "head_dim", head_dim, 100_000)
    elif counts["hidden"] % counts["heads"]:
        raise ConfigError(f"{where}: heads: {counts['heads']} does not divide hidden {counts['hidden']} "
                          "(each head is hidden / heads wide)")
    if counts["kv_heads"] > counts["heads"] or counts["heads"] % counts["kv_heads"]:
        raise ConfigError(f"{where}: kv_heads: must divide heads {counts['heads']} (grouped-query attention shares "
                          f"each key/value head among heads / kv_heads query heads), got {counts['kv_heads']}")
    dropout = _number(where, "dropout", data.get("dropout", 0.0), 0.0, 0.99)
    published = data.get("published_params")
    if published is not None:
        published = _number(where, "published_params", published, 1.0, 1e15)
    active = data.get("published_active_params")
    if active is not None:
        active = _number(where, "published_active_params", active, 1.0, 1e15)
    counts_embedding = data.get("active_counts_embedding", True)
    if not isinstance(counts_embedding, bool):
        raise ConfigError(f"{where}: active_counts_embedding: must be true or false, got {str(counts_embedding)[:40]!r}")
    moe = parse_moe(where, data["moe"], counts["layers"]) if "moe" in data else None
    mla = parse_mla(where, data["mla"]) if "mla" in data else None
    window = parse_window(where, data["sliding_window"], counts["seq_len"] * 1000) if "sliding_window" in data \
        else None
    if mla is not None and window is not None:
        raise ConfigError(f"{where}: sliding_window: not with mla (no model combines them)")
    if mla is not None and (flags["bias"] or choices["attention"] != "flash"):
        raise ConfigError(f"{where}: mla: needs bias false and attention flash (as DeepSeek's models have them)")
    mtp = _whole_key(where, "mtp_layers", data["mtp_layers"], 16, low=0) if "mtp_layers" in data else 0
    sources = data.get("sources", {})
    if not isinstance(sources, dict):
        raise ConfigError(f"{where}: sources: must map a field name to the public source of its number")
    for key, text in sources.items():
        if not isinstance(key, str) or key not in (KEYS | NESTED_SOURCE_KEYS) - {"sources", "name", "description"}:
            raise ConfigError(f"{where}: sources: unknown key {str(key)[:40]!r}{_close(str(key), sorted(REQUIRED))}")
        _text(where, f"sources.{key}", text)
    name = _name(where, data["name"]) if "name" in data else default_name
    if not name:
        raise ConfigError(f"{where}: missing key 'name'")
    description = _text(where, "description", data["description"], one_line=True) if "description" in data else ""
    return ModelCard(name=name, **counts, **choices, **flags, dropout=dropout, description=description,
                     published_params=published, head_dim_given=head_dim, moe=moe, mla=mla,
                     sliding_window=window, mtp_layers=mtp, published_active_params=active,
                     active_counts_embedding=counts_embedding, sources={k: " ".join(v.split()) for k, v in sources.items()},
                     path=where)


def read_card_file(path: str | os.PathLike) -> ModelCard:
    """Read and check one card file (``--model-file``)."""
    p = Path(path)
    return parse_card(str(p), parse_yaml_text(read_text_file(p, "model card"), str(p)), p.stem.lower())


def packaged_dir() -> Path:
    """Where the shipped cards live."""
    return Path(str(importlib.resources.files("triosim.trace"))) / "model_cards"


@lru_cache(maxsize=1)
def shipped_cards() -> dict[str, ModelCard]:
    """The packaged cards by name (read and checked once)."""
    cards: dict[str, ModelCard] = {}
    for f in sorted(packaged_dir().glob("*.yaml")):
        card = read_card_file(f)
        if card.name in cards:
            raise ConfigError(f"{f}: name: {card.name} is also defined in {cards[card.name].path}")
        cards[card.name] = card
    return cards


def get_card(name: str) -> ModelCard:
    """The shipped card called ``name`` (case-insensitive); an unknown name lists the known ones."""
    cards = shipped_cards()
    key = str(name).strip().lower()
    if key in cards:
        return cards[key]
    close = difflib.get_close_matches(key, list(cards), n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ConfigError(f"--model {str(name)[:60]!r}: no such model card{hint} (known: {', '.join(sorted(cards))}; "
                      "`triosim models` lists them, --model-file FILE.yaml reads your own)")


__all__ = ["ACTIVATIONS", "ATTENTIONS", "ModelCard", "NORMS", "POSITIONS", "get_card", "packaged_dir", "parse_card",
           "read_card_file", "shipped_cards"]
