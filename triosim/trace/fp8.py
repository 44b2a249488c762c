"""FP8 training as Transformer Engine runs it under Megatron-Core: the recipe and the closed forms.

``--dtype fp8`` trains in bf16 mixed precision (:mod:`triosim.trace.precision`) with the GEMMs of
the transformer layers' linear layers in FP8, as Transformer Engine (TE) does under Megatron-Core
(``--fp8-format``, ``--fp8-recipe``, ``--fp8-param-gather``; Micikevicius et al. 2022, "FP8
Formats for Deep Learning", arXiv:2209.05433: E4M3 in the forward pass, E5M2 for gradients, one
scale per tensor). A linear layer runs three GEMMs on FP8 operands (TE's low-precision training
docs, "Performance considerations", table 2): forward ``y = x·wᵀ`` (x and w rowwise), data
gradient ``dx = dy·w`` (dy rowwise, w columnwise), weight gradient ``dw = dyᵀ·x`` (dy and x
columnwise). Every FP8 operand is made from its bf16 tensor by a memory-bound quantize kernel.

The recipes (``--fp8-recipe``; TE's docs, one page each):

- ``delayed``: one scale per tensor from the amax history of earlier steps; the cast kernel
  records this step's amax as it casts (one read). The per-step history update is one small
  multi-tensor kernel over 1,024 fp32 values per tensor: not counted.
- ``current`` (Megatron's ``tensorwise``): one scale per tensor from this tensor's own amax:
  "Quantization is a memory-bound operation that requires reading the tensor twice" (an amax
  pass, then the cast; TE docs, "FP8 Current Scaling", performance analysis).
- ``blockwise`` (Hopper; DeepSeek-V3's scheme): an fp32 scale per 1×128 block of activations and
  gradients and per 128×128 tile of weights, computed in the cast kernel; the rowwise and
  columnwise copies are quantized separately from the bf16 tensor ("Handling transposes").
- ``mxfp8`` (Blackwell, SM 10.0+): an E8M0 (1-byte) scale per 32 consecutive elements, computed
  in the cast kernel; rowwise and columnwise copies are "numerically different — one cannot derive
  one from the other. Both must be quantized independently" (TE docs, "MXFP8").

Copies per quantize (:func:`copies`): on Hopper and Ada an FP8 tensor used columnwise must be
physically transposed ("Hopper: cannot efficiently access elements in columnwise fashion"), so
a per-tensor cast writes the rowwise and the transposed copy (TE's fused cast-transpose): 2. On
Blackwell "rowwise and columnwise usages share the same memory layout": 1. Blockwise and MXFP8
write two differently scaled copies everywhere: 2.

A quantize of E bf16 elements (:func:`quantize_bytes`) reads 2E and writes ``copies·(E + scale
bytes)``; ``current`` adds an amax kernel that reads 2E (:func:`amax_bytes`). Scale bytes per
copy: none for a per-tensor recipe (one fp32 scalar), E/32 for blockwise 1-D blocks (4 bytes per
128 elements) and for MXFP8 (1 byte per 32), E/4096 for blockwise 2-D weight tiles (4 bytes per
128×128), each rounded up. So an FP8 linear of input [M, K], weight [N, K] and output [M, N]
adds, with current scaling on Hopper: 6MK bytes in the forward pass (amax 2MK, cast 2MK read +
2MK written), 6MN in the backward pass (the same for dy), and 6NK for its weight.

Weights are cast once per iteration: TE's ``is_first_microbatch`` ("during the first microbatch
… FP8 weights are computed and cached"; Megatron passes it in its pipeline schedules) — except
under ZeRO-3, where the gathered weight is freed after each pass, so each micro-batch casts it
again. With ``--fp8-param-gather`` the parameters are FP8 tensors (Megatron builds the model
under TE's ``fp8_model_init``): the optimizer writes them from the fp32 master copy, the data-
parallel all-gather moves 1 byte per parameter instead of 2, and no bf16 weight is kept; only
the second usage is made after the gather (a transpose on Hopper: E read, E written; nothing
for a per-tensor recipe on Blackwell).

Memory: an FP8 linear's weight is kept in bf16 plus its cached FP8 versions (TE's
``is_first_microbatch``: "it allows caching of the FP8 versions of the weights"), one per usage
its GEMMs need — the rowwise copy and, on Hopper or with block scales, the columnwise one — 1
byte per element plus scales each (:func:`weight_copy_bytes`); with ``--fp8-param-gather`` the
FP8 parameter and its columnwise copy replace the bf16 weight. A linear's input is saved for the
weight gradient as one FP8 copy, "the columnwise quantized input" (TE docs, "Performance
considerations", memory usage: "1 MB (input in FP8 saved for backward)";
:func:`saved_input_bytes`), instead of bf16 — beside the bf16 tensor when another op's backward
needs that too (the attention output, which the attention backward reads).
"""

from __future__ import annotations

from dataclasses import dataclass

FP8_RECIPES = ("delayed", "current", "blockwise", "mxfp8")
# the modules Megatron-Core does not re-run under delayed scaling (its TransformerConfig refuses them)
DELAYED_REFUSED_MODULES = ("layernorm", "moe_act")
PER_TENSOR = frozenset({"delayed", "current"})
HIGH_BYTES = 2  # the bf16 tensors an FP8 cast reads
FP8_BYTES = 1
BLOCK_1D = 128  # blockwise: elements per 1-D block (activations, gradients)
BLOCK_2D = 128 * 128  # blockwise: elements per 2-D tile (weights)
BLOCK_SCALE_BYTES = 4  # blockwise: an fp32 scale per block
MX_BLOCK = 32  # MXFP8: elements per block, one E8M0 (1-byte) scale each


@dataclass(frozen=True)
class Fp8Training:
    """How a run trains in FP8: the recipe, whether parameters are gathered (and kept) in FP8,
    whether the device needs a physically transposed copy for columnwise use (Hopper, Ada), and
    the share of a weight cast each micro-batch's forward pass pays (1 / micro-batches: TE casts
    the weights in the first micro-batch and caches them; 1 under ZeRO-3)."""

    recipe: str = "current"
    param_gather: bool = False
    transposed_copy: bool = True
    weight_cast_share: float = 1.0

    def __post_init__(self) -> None:
        if self.recipe not in FP8_RECIPES:
            raise ValueError(f"unknown FP8 recipe {self.recipe!r} (known: {', '.join(FP8_RECIPES)})")

    @property
    def label(self) -> str:
        return {"delayed": "delayed scaling", "current": "current scaling", "blockwise": "blockwise scaling",
                "mxfp8": "MXFP8"}[self.recipe]

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "param_gather": self.param_gather, "transposed_copy": self.transposed_copy,
                "weight_cast_share": self.weight_cast_share}


@dataclass(frozen=True)
class CastBytes:
    """HBM bytes one memory-bound FP8 kernel reads and writes."""

    read: int
    written: int

    @property
    def total(self) -> int:
        return self.read + self.written


def copies(fp8: Fp8Training) -> int:
    """FP8 copies a quantize writes: the rowwise one and, where the recipe or the device needs it,
    the columnwise one (a transpose on Hopper; a second quantization for blockwise and MXFP8)."""
    if fp8.recipe in PER_TENSOR:
        return 2 if fp8.transposed_copy else 1
    return 2


def scale_bytes(elements: int, fp8: Fp8Training, weight: bool = False) -> int:
    """Bytes of the block scales of one FP8 copy of ``elements`` (0 for a per-tensor recipe)."""
    if fp8.recipe == "mxfp8":
        return -(-elements // MX_BLOCK)
    if fp8.recipe == "blockwise":
        return BLOCK_SCALE_BYTES * -(-elements // (BLOCK_2D if weight else BLOCK_1D))
    return 0


def quantize_bytes(elements: int, fp8: Fp8Training, weight: bool = False) -> CastBytes:
    """The cast kernel of ``elements`` bf16 values: reads them once, writes every FP8 copy with
    its scales."""
    per_copy = elements * FP8_BYTES + scale_bytes(elements, fp8, weight)
    return CastBytes(HIGH_BYTES * elements, copies(fp8) * per_copy)


def amax_bytes(elements: int, fp8: Fp8Training) -> CastBytes:
    """The amax pass before the cast: current scaling only (one read of the bf16 tensor)."""
    return CastBytes(HIGH_BYTES * elements if fp8.recipe == "current" else 0, 0)


def weight_cast_kernels(elements: int, fp8: Fp8Training) -> tuple[CastBytes, ...]:
    """The kernels of one cast of a weight of ``elements``: its amax pass (current scaling) and
    quantize, or with ``--fp8-param-gather`` only the second usage of the gathered FP8 parameter
    (a transpose: E read, E written), none where one copy serves both usages."""
    if fp8.param_gather:
        if copies(fp8) < 2:
            return ()
        per_copy = elements * FP8_BYTES + scale_bytes(elements, fp8, weight=True)
        return (CastBytes(per_copy, per_copy),)
    kernels = (amax_bytes(elements, fp8), quantize_bytes(elements, fp8, weight=True))
    return tuple(k for k in kernels if k.total)


def weight_copy_bytes(elements: int, fp8: Fp8Training) -> int:
    """Bytes of the FP8 weight kept beside a bf16 weight (or of the FP8 parameter itself with
    ``--fp8-param-gather``): every copy its GEMMs read (:func:`copies`: the rowwise one and, on
    Hopper or with block scales, the columnwise one), 1 byte per element plus scales each."""
    return copies(fp8) * (elements * FP8_BYTES + scale_bytes(elements, fp8, weight=True))


def saved_input_bytes(elements: int, fp8: Fp8Training) -> int:
    """Bytes of the FP8 copy of a linear's input saved for its weight gradient (the columnwise
    usage: one copy with its scales)."""
    return elements * FP8_BYTES + scale_bytes(elements, fp8)


def saved_input_elements(nbytes: int, fp8: Fp8Training, kept_bytes: int = 0) -> int:
    """The elements of an FP8 linear's input buffer of ``nbytes``: the inverse of
    :func:`saved_input_bytes` (plus ``kept_bytes`` per element where the bf16 tensor is kept
    beside the copy)."""
    def size(n: int) -> int:
        return n * kept_bytes + saved_input_bytes(n, fp8)

    unit = 1 << 20  # a whole number of scale blocks: the bytes per element without rounding
    n = int(nbytes * unit // size(unit))
    while n > 0 and size(n) > nbytes:  # the block scales round up: at most a step or two
        n -= 1
    while size(n + 1) <= nbytes:
        n += 1
    return n


def gathered_bytes_per_element(fp8: Fp8Training, training_bytes: int) -> int:
    """Bytes per parameter element the data-parallel all-gather moves: 1 with ``--fp8-param-gather``
    (the rowwise FP8 data; its scales, at most 1/4,096 of it for blockwise tiles, are not
    counted), else the training dtype's."""
    return FP8_BYTES if fp8.param_gather else training_bytes


__all__ = ["DELAYED_REFUSED_MODULES", "FP8_RECIPES", "CastBytes", "Fp8Training", "amax_bytes", "copies", "gathered_bytes_per_element",
           "quantize_bytes", "saved_input_bytes", "saved_input_elements", "scale_bytes", "weight_cast_kernels", "weight_copy_bytes"]
