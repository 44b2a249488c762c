"""Measured efficiency of fused attention kernels: a device file's ``efficiency.attention``.

A fused attention kernel (FlashAttention, cuDNN's fused attention that Transformer Engine runs)
does not run at its GEMMs' efficiency: the softmax between its two products, the online
rescaling and, under a causal mask, the tiles on the diagonal cost time that a GEMM of the same
FLOPs does not spend. So a device file may give the measured fraction of the 16-bit matrix peak
per head size, direction and mask, each a curve over the op's keys per query (its sequence
length; a fraction of the FLOPs counted as attention benchmarks count them, the causal mask's as
half the full mask's). The sequence, not the FLOPs, places an op: tensor parallelism splits the
heads of a long sequence, which keeps its kernels' tiles and their efficiency (down to some two
waves of the GPU's SMs; fewer heads than that are not measured)::

    efficiency:
      attention:
        source: "..."
        head_dim_128:
          forward: [[keys, fraction], ...]          # full mask
          backward: [[keys, fraction], ...]
          forward_causal: [[keys, fraction], ...]
          backward_causal: [[keys, fraction], ...]

An op takes the curve of the nearest measured head size (by ratio; the larger on a tie), since a
kernel's tile shapes follow the head size; an op whose head size its trace does not show (0) takes none. A direction/mask the head size does not list, or a
device without the section, leaves the op to the GEMM curve (see :mod:`triosim.compute.roofline`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

CURVE_NAMES = ("forward", "backward", "forward_causal", "backward_causal")


@dataclass(frozen=True)
class AttentionCurves:
    """Per head size, the measured curves by name (``forward``, ``backward_causal``, ...)."""

    by_head_dim: dict[int, dict[str, Any]]
    source: str = field(default="", compare=False)

    def curve(self, backward: bool, causal: bool, head_dim: int) -> Any | None:
        """The curve for an op of this direction, mask and head size, or None when none is measured."""
        name = ("backward" if backward else "forward") + ("_causal" if causal else "")
        sizes = [d for d in self.by_head_dim if name in self.by_head_dim[d]]
        if not sizes or head_dim <= 0:
            return None
        nearest = min(sizes, key=lambda d: (abs(math.log(d / head_dim)), -d))
        return self.by_head_dim[nearest][name]


def parse_attention(where: str, raw: Any, parse_curve: Callable[[str, str, Any], Any]) -> AttentionCurves:
    """Check ``efficiency.attention`` and build its curves (``parse_curve`` reads one curve)."""
    key = "efficiency.attention"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: field {key} must map head_dim_N to its curves, with a source")
    source = raw.get("source")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"{where}: field {key}.source must say where the attention curves were measured")
    out: dict[int, dict[str, Any]] = {}
    for name, curves in raw.items():
        if name == "source":
            continue
        digits = str(name).removeprefix("head_dim_")
        if not str(name).startswith("head_dim_") or not digits.isdigit() or int(digits) <= 0:
            raise ConfigError(f"{where}: unknown field {key}.{name} (known: source, head_dim_N such as head_dim_128)")
        if not isinstance(curves, dict) or not curves:
            raise ConfigError(f"{where}: field {key}.{name} must map {', '.join(CURVE_NAMES)} to curves")
        bad = sorted(set(map(str, curves)) - set(CURVE_NAMES))
        if bad:
            raise ConfigError(f"{where}: unknown field {key}.{name}.{bad[0]} (known: {', '.join(CURVE_NAMES)})")
        out[int(digits)] = {c: parse_curve(where, f"{key}.{name}.{c}", curves[c]) for c in CURVE_NAMES if c in curves}
    if not out:
        raise ConfigError(f"{where}: field {key} lists no head_dim_N curves")
    return AttentionCurves(out, source.strip())


__all__ = ["AttentionCurves", "CURVE_NAMES", "parse_attention"]
