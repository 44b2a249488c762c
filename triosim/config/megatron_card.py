"""A model card from Megatron-LM's architecture arguments (``--hidden-size``,
``--num-attention-heads``, ``--swiglu`` ...), so a pasted Megatron command line describes the model.

With ``--model NAME`` (or ``--model-file``) the arguments replace that card's fields. Without one,
the card holds Megatron-LM's GPT defaults for every field the line leaves out
(``megatron/training/arguments.py``):

* ``--num-layers``, ``--hidden-size``, ``--num-attention-heads`` and ``--seq-length`` are required;
* ``--ffn-hidden-size``: 4 × hidden, or with ``--swiglu`` int(4 × hidden × 2/3 / 64) × 64;
* key/value heads: the attention heads, or ``--num-query-groups`` with ``--group-query-attention``;
* vocabulary: ``--vocab-size`` or GPT-2's 50,257 tokens, padded up to a multiple of
  ``--make-vocab-size-divisible-by`` (128) × the tensor-parallel size, as Megatron pads it;
* LayerNorm (``--normalization RMSNorm`` for RMSNorm), GELU, biases (``--disable-bias-linear``
  drops them), learned absolute positions (``--position-embedding-type rope`` or
  ``--use-rotary-position-embeddings`` for rotary), embeddings tied to the output layer
  (``--untie-embeddings-and-output-weights``), dropout 0.1 (``--hidden-dropout``);
* attention: unfused (softmax and dropout as separate kernels, Megatron-LM's ``local`` core
  attention) unless ``--use-flash-attn`` or ``--transformer-impl transformer_engine`` (a fused
  kernel).

The card is written as YAML under the cache (``<cache>/megatron-cards/``, its name a hash of its
contents, written atomically) and run as ``--model-file``, so the run's ``config`` block names a
file that reproduces it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict
from pathlib import Path

from ..errors import ConfigError
from ..output import atomic_write_text
from ..trace.model_card import ModelCard, get_card, parse_card, read_card_file

GPT2_VOCAB = 50257  # GPT-2 BPE, Megatron-LM's GPT tokenizer
_NORMS = {"layernorm": "layernorm", "rmsnorm": "rmsnorm"}
_POSITIONS = {"learned_absolute": "learned", "rope": "rope"}
_IMPLS = ("local", "transformer_engine")


def _flag_value(out: list[str], flag: str) -> str | None:
    """The last value of ``flag`` in a translated command line (``--f v`` or ``--f=v``)."""
    found = None
    for i, tok in enumerate(out):
        if tok == flag and i + 1 < len(out):
            found = out[i + 1]
        elif tok.startswith(flag + "="):
            found = tok.split("=", 1)[1]
    return found


def _remove_flag(out: list[str], flag: str) -> None:
    i = 0
    while i < len(out):
        if out[i] == flag:
            del out[i:i + 2]
        elif out[i].startswith(flag + "="):
            del out[i]
        else:
            i += 1


def positive_int(flag: str, text: str, where: str = "") -> int:
    """``text`` as a positive integer, else a one-line error naming ``flag`` (after ``where``)."""
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{where}{flag} must be a positive integer, got {text!r}") from None
    if value < 1:
        raise ConfigError(f"{where}{flag} must be a positive integer, got {value}")
    return value


def _fraction(flag: str, text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}{flag} must be a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise ConfigError(f"{where}{flag} must be a number in [0, 1), got {text!r}")
    return value


class CardArgs:
    """The architecture arguments of one command line, gathered as they are translated."""

    def __init__(self) -> None:
        self.values: dict[str, str | None] = {}

    def set(self, flag: str, value: str | None, where: str) -> None:
        self.values[flag] = value
        self.where = where

    def __bool__(self) -> bool:
        return bool(self.values)

    def emit(self, out: list[str]) -> None:
        """Replace ``--model``/``--model-file`` in ``out`` by the card these arguments make."""
        if not self.values:
            return
        import yaml  # only a line with architecture arguments needs it (the CLI imports stay light)

        card = self.card(out)
        text = yaml.safe_dump(_card_mapping(card), sort_keys=True)
        path = _card_dir() / f"megatron-args-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
        if not path.is_file():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(str(path), text)
            except OSError as exc:
                raise ConfigError(f"cannot write the model card {path} ({exc.strerror or exc}); set "
                                  "TRIOSIM_CACHE_DIR to a writable directory") from None
        _remove_flag(out, "--model")
        _remove_flag(out, "--model-file")
        out.extend(["--model-file", str(path)])

    def card(self, out: list[str]) -> ModelCard:
        """The card: the line's ``--model``/``--model-file`` with these fields replaced, or
        Megatron-LM's GPT defaults."""
        v = self.values
        model, model_file = _flag_value(out, "--model"), _flag_value(out, "--model-file")
        tp = positive_int("--tensor-model-parallel-size", _flag_value(out, "--tp") or "1")
        if model is not None or model_file is not None:
            base = read_card_file(model_file) if model_file is not None else get_card(model)
            fields = asdict(base)
        else:
            fields = self._megatron_defaults(out)
        hidden = positive_int("--hidden-size", v["--hidden-size"]) if "--hidden-size" in v else fields["hidden"]
        heads = positive_int("--num-attention-heads", v["--num-attention-heads"]) \
            if "--num-attention-heads" in v else fields["heads"]
        fields.update(hidden=hidden, heads=heads)
        if "--swiglu" in v:
            fields["activation"] = "swiglu"
        if "--ffn-hidden-size" in v:
            fields["ffn"] = positive_int("--ffn-hidden-size", v["--ffn-hidden-size"])
        elif model is None and model_file is None:
            fields["ffn"] = int(4 * hidden * 2 / 3 / 64) * 64 if fields["activation"] == "swiglu" else 4 * hidden
        if "--group-query-attention" in v or "--num-query-groups" in v:
            if "--num-query-groups" not in v:
                raise ConfigError("--group-query-attention needs --num-query-groups")
            fields["kv_heads"] = positive_int("--num-query-groups", v["--num-query-groups"])
        elif model is None and model_file is None:
            fields["kv_heads"] = heads
        if "--kv-channels" in v:
            width = positive_int("--kv-channels", v["--kv-channels"])
            fields["head_dim_given"] = None if width * heads == hidden else width
        _moe_fields(v, fields)
        if "--vocab-size" in v or (model is None and model_file is None):
            divisible = positive_int("--make-vocab-size-divisible-by", v.get("--make-vocab-size-divisible-by") or "128")
            vocab = positive_int("--vocab-size", v["--vocab-size"]) if "--vocab-size" in v else GPT2_VOCAB
            multiple = divisible * tp
            fields["vocab"] = math.ceil(vocab / multiple) * multiple
        if "--normalization" in v:
            norm = str(v["--normalization"]).lower()
            if norm not in _NORMS:
                raise ConfigError(f"--normalization must be LayerNorm or RMSNorm, got {v['--normalization']!r}")
            fields["norm"] = _NORMS[norm]
        position = v.get("--position-embedding-type")
        if "--use-rotary-position-embeddings" in v:
            position = "rope"
        if position is not None:
            if position not in _POSITIONS:
                raise ConfigError(f"--position-embedding-type must be learned_absolute or rope, got {position!r}")
            fields["position"] = _POSITIONS[position]
        if "--untie-embeddings-and-output-weights" in v:
            fields["tied_embeddings"] = False
        if "--disable-bias-linear" in v:
            fields["bias"] = False
        if "--hidden-dropout" in v:
            fields["dropout"] = _fraction("--hidden-dropout", str(v["--hidden-dropout"]), "")
        impl = v.get("--transformer-impl")
        if impl is not None and impl not in _IMPLS:
            raise ConfigError(f"--transformer-impl must be local or transformer_engine, got {impl!r}")
        if "--use-flash-attn" in v or impl == "transformer_engine":
            fields["attention"] = "flash"
        elif impl == "local":
            fields["attention"] = "standard"
        base_name = fields.get("name") or "megatron-args"
        fields["name"] = base_name if base_name.startswith("megatron-args") else f"{base_name}-megatron-args"
        fields["description"] = "from Megatron-LM arguments" + (f" over {base_name}" if base_name != "megatron-args"
                                                                 else " (Megatron-LM's GPT defaults for the rest)")
        fields.pop("path", None)
        fields["published_params"] = None
        return parse_card("Megatron-LM arguments", _card_mapping_from_fields(fields))

    def _megatron_defaults(self, out: list[str]) -> dict:
        layers, seq = _flag_value(out, "--num-layers"), _flag_value(out, "--seq-len")
        missing = [flag for flag, value in (("--num-layers", layers), ("--hidden-size", self.values.get("--hidden-size")),
                                            ("--num-attention-heads", self.values.get("--num-attention-heads")),
                                            ("--seq-length", seq)) if value is None]
        if missing:
            raise ConfigError(f"a model from Megatron-LM arguments needs {', '.join(missing)} (or --model NAME "
                              "for a shipped card whose fields they replace)")
        return {"name": "megatron-args", "layers": positive_int("--num-layers", layers), "hidden": 0, "heads": 0,
                "kv_heads": 0, "ffn": 0, "vocab": 0, "seq_len": positive_int("--seq-length", seq), "activation": "gelu",
                "norm": "layernorm", "tied_embeddings": True, "attention": "standard", "position": "learned",
                "bias": True, "dropout": 0.1, "sources": {}}


def _moe_fields(v: dict, fields: dict) -> None:
    """Megatron-Core's MoE arguments into the card's ``moe`` mapping (defaults as Megatron's:
    top-2, the experts as wide as ``--ffn-hidden-size``, every layer MoE, softmax router)."""
    names = ("--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
             "--moe-layer-freq", "--moe-router-score-function", "--moe-aux-loss-coeff")
    if not any(n in v for n in names):
        return
    moe = dict(fields.get("moe") or {})
    if "--num-experts" in v:
        moe["experts"] = positive_int("--num-experts", v["--num-experts"])
    elif not moe:
        raise ConfigError("the MoE arguments need --num-experts (or --model NAME of an MoE card)")
    moe.setdefault("top_k", 2)
    moe.setdefault("expert_ffn", fields["ffn"])
    if "--moe-router-topk" in v:
        moe["top_k"] = positive_int("--moe-router-topk", v["--moe-router-topk"])
    if "--moe-ffn-hidden-size" in v:
        moe["expert_ffn"] = positive_int("--moe-ffn-hidden-size", v["--moe-ffn-hidden-size"])
    if "--moe-shared-expert-intermediate-size" in v:
        moe.update(shared_experts=1, shared_ffn=positive_int("--moe-shared-expert-intermediate-size",
                                                             v["--moe-shared-expert-intermediate-size"]))
    if "--moe-layer-freq" in v:
        moe["every"] = positive_int("--moe-layer-freq", v["--moe-layer-freq"])
    if "--moe-router-score-function" in v:
        moe["router"] = str(v["--moe-router-score-function"])
    if "--moe-aux-loss-coeff" in v:
        try:
            moe["aux_loss"] = float(str(v["--moe-aux-loss-coeff"]))
        except ValueError:
            raise ConfigError(f"--moe-aux-loss-coeff must be a number, got {v['--moe-aux-loss-coeff']!r}") from None
    fields["moe"] = moe


def _card_mapping_from_fields(fields: dict) -> dict:
    keep = ("name", "description", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "activation",
            "norm", "tied_embeddings", "attention", "position", "bias", "dropout", "mtp_layers")
    out = {k: fields[k] for k in keep if k in fields}
    if fields.get("head_dim_given"):
        out["head_dim"] = fields["head_dim_given"]
    for key in ("moe", "mla", "sliding_window"):  # the optional parts of a card (triosim.trace.card_variants)
        if fields.get(key):
            out[key] = {k: (list(x) if isinstance(x, tuple) else x) for k, x in dict(fields[key]).items()}
    if "moe" in out and not out["moe"].get("shared_experts"):  # no shared expert: no width to give
        out["moe"].pop("shared_ffn", None)
    return out


def _card_mapping(card: ModelCard) -> dict:
    return _card_mapping_from_fields(asdict(card))


def _card_dir() -> Path:
    from .model_flags import cache_root

    return cache_root() / "megatron-cards"


__all__ = ["CardArgs", "GPT2_VOCAB"]
