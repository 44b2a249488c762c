"""The models the tracer can train: the torchvision classification zoo and small GPTs.

A model here is what one training step needs: the ``nn.Module``, a batch (inputs, targets) and the
loss.  Image classifiers take ``[B, 3, S, S]`` images and class targets; the GPT-style language
model (token + position embeddings, pre-norm blocks of causal self-attention with separate q/k/v
projections and a GELU MLP, then a language-model head) takes ``[B, T]`` token ids and predicts the
next token, so that tensor parallelism of transformer layers (embedding and linear ops) can be
studied.  torch is imported inside the functions only: importing this module is free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .errors import TracerError

# Model families the original tracer collected, plus transformers.
FEATURED_MODELS: tuple[str, ...] = (
    "vgg11", "vgg13", "vgg16", "vgg19", "resnet18", "resnet34", "resnet50", "resnet101",
    "resnet152", "densenet121", "densenet161", "densenet169", "densenet201", "vit_b_16",
)
ORIGINAL_MODELS: tuple[str, ...] = (
    "vgg11", "vgg13", "vgg16", "vgg19", "resnet18", "resnet34", "resnet50", "resnet101",
    "resnet152", "densenet161", "densenet169", "densenet121", "densenet201",
)


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT-style decoder."""

    vocab_size: int
    seq_len: int
    n_layer: int
    n_head: int
    d_model: int


GPT_PRESETS: Mapping[str, GPTConfig] = MappingProxyType({
    # A few seconds per step on a laptop CPU; the default GPT sample trace.
    "gpt": GPTConfig(vocab_size=4096, seq_len=128, n_layer=4, n_head=4, d_model=256),
    # 16 heads (head dim 32), so Megatron-style tensor parallelism up to --tp 16 divides the
    # heads (the `gpt` preset's 4 heads refuse --tp 8); 2 layers, to be repeated to many layers
    # with `triosim trace repeat`.  The `gpt-h16-cpu-bs8` sample trace.
    "gpt-h16": GPTConfig(vocab_size=4096, seq_len=128, n_layer=2, n_head=16, d_model=512),
    # For tests: milliseconds per step.
    "gpt-tiny": GPTConfig(vocab_size=256, seq_len=16, n_layer=2, n_head=2, d_model=32),
    # GPT-2 small (124M parameters); for a GPU.
    "gpt2-small": GPTConfig(vocab_size=50257, seq_len=1024, n_layer=12, n_head=12, d_model=768),
})
LOCAL_MODELS: tuple[str, ...] = ("tinycnn",)


@dataclass
class ModelSpec:
    """A model ready to train: module, batch maker, loss and a one-line description."""

    name: str
    module: Any  # torch.nn.Module
    make_batch: Callable[[int, Any, Any], tuple[Any, Any]]  # (batch, device, generator)
    loss_fn: Callable[[Any, Any], Any]
    kind: str  # "image" or "text"
    description: str


def known_models() -> list[str]:
    """Names accepted by --model (torchvision classifiers need torchvision installed)."""
    names = set(GPT_PRESETS) | set(LOCAL_MODELS) | set(FEATURED_MODELS)
    try:
        import torchvision.models as tvm

        names |= set(tvm.list_models(module=tvm))
    except Exception:  # torchvision absent or too old: the featured names only
        pass
    return sorted(names)


def closest_model(name: str) -> str:
    """``; did you mean mobilenet_v2?`` for a near miss of a known model name, else "".

    Names are compared without ``_``/``-`` and case first (``mobilenetv2``, ``ResNet-50``), then
    by similarity (``resnt50``)."""
    import difflib

    known = known_models()
    squash = {k.replace("_", "").replace("-", "").lower(): k for k in known}
    key = name.replace("_", "").replace("-", "").lower()
    hit = squash.get(key) or next(iter(difflib.get_close_matches(key, list(squash), n=1, cutoff=0.75)), None)
    if hit is not None and hit in squash:
        hit = squash[hit]
    return f"; did you mean {hit}?" if hit and hit != name else ""


def _gpt_module(cfg: GPTConfig) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class CausalSelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(cfg.d_model, cfg.d_model)
            self.k = nn.Linear(cfg.d_model, cfg.d_model)
            self.v = nn.Linear(cfg.d_model, cfg.d_model)
            self.proj = nn.Linear(cfg.d_model, cfg.d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            h = cfg.n_head
            q = self.q(x).view(b, t, h, c // h).transpose(1, 2)
            k = self.k(x).view(b, t, h, c // h).transpose(1, 2)
            v = self.v(x).view(b, t, h, c // h).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(cfg.d_model)
            self.attn = CausalSelfAttention()
            self.ln2 = nn.LayerNorm(cfg.d_model)
            self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
            self.fc_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.d_model)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok_emb(idx) + self.pos_emb(pos)
            for block in self.blocks:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    return GPT()


def _tinycnn_module(num_classes: int) -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, num_classes))


def build_model(name: str, image_size: int = 224, num_classes: int = 1000,
                seq_len: int | None = None) -> ModelSpec:
    """Instantiate ``name`` with random weights (seed torch before calling for repeatability)."""
    import torch
    import torch.nn.functional as F

    def image_batch(batch: int, device: Any, gen: Any) -> tuple[Any, Any]:
        x = torch.randn(batch, 3, image_size, image_size, generator=gen).to(device)
        y = torch.randint(0, num_classes, (batch,), generator=gen).to(device)
        return x, y

    if name in GPT_PRESETS:
        cfg = GPT_PRESETS[name]
        if seq_len is not None:
            cfg = GPTConfig(cfg.vocab_size, seq_len, cfg.n_layer, cfg.n_head, cfg.d_model)
        if cfg.seq_len < 1:
            raise TracerError(f"--seq-len must be positive, got {cfg.seq_len}")

        def text_batch(batch: int, device: Any, gen: Any) -> tuple[Any, Any]:
            ids = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), generator=gen)
            return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)

        def lm_loss(logits: Any, targets: Any) -> Any:
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

        return ModelSpec(name=name, module=_gpt_module(cfg), make_batch=text_batch,
                         loss_fn=lm_loss, kind="text",
                         description=(f"GPT-style decoder: {cfg.n_layer} layers, d_model "
                                      f"{cfg.d_model}, {cfg.n_head} heads, vocab "
                                      f"{cfg.vocab_size}, sequence {cfg.seq_len}"))
    if image_size < 1:
        raise TracerError(f"--image-size must be positive, got {image_size}")
    if name == "tinycnn":
        return ModelSpec(name=name, module=_tinycnn_module(num_classes), make_batch=image_batch,
                         loss_fn=F.cross_entropy, kind="image",
                         description="tiny CNN (2 conv, batch norm, 2 linear, dropout)")
    try:
        import torchvision.models as tvm
    except ImportError:
        raise TracerError(f"model '{name}' needs torchvision: pip install 'triosim[tracer]'") \
            from None
    if name not in set(tvm.list_models(module=tvm)):
        raise TracerError(f"unknown model '{name}' (choose a torchvision classifier such as "
                          f"{', '.join(FEATURED_MODELS)}, or one of "
                          f"{', '.join(sorted(GPT_PRESETS) + list(LOCAL_MODELS))}){closest_model(name)}")
    kwargs: dict[str, Any] = {"weights": None, "num_classes": num_classes}
    if name.startswith("vit_"):
        kwargs["image_size"] = image_size
    try:
        module = tvm.get_model(name, **kwargs)
    except (ValueError, TypeError, AssertionError, RuntimeError) as exc:
        raise TracerError(f"cannot build model '{name}' at image size {image_size}: {exc}") \
            from None
    return ModelSpec(name=name, module=module, make_batch=image_batch, loss_fn=F.cross_entropy,
                     kind="image", description=f"torchvision {name} (random weights)")
