"""How triosim times a fused attention op against the H200's measured cuDNN attention.

A run costs a fused attention op at 4·b·h·s²·d FLOPs forward (half under a causal mask, which a
model card's meta.json declares; 2.5× backward) and times it with the device file's measured
attention curve for the op's head size, direction and mask (the h200 and h100-sxm files carry the
cuDNN curves measured on an H200; a device without one charges the full mask at its GEMM curve).
The H200 measurements in bench/data/h200-curves.json (bench/device_curves.py, PyTorch SDPA with the
cuDNN backend, the kernels Transformer Engine's fused attention runs on Hopper) time the same
shapes with and without the causal mask. This prints, per shape, triosim's time (plus the
measured gap between back-to-back kernels, which the measured times include), the measured one
and their ratio (above 1: triosim slower than the measurement), and, for comparison, the time
the op had before the curves: the full mask's FLOPs at the bf16 GEMM curve.

    python bench/attention_vs_measured.py
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from triosim.compute.op_cost import op_cost
from triosim.compute.roofline import Precision, roofline_seconds
from triosim.hardware.device_db import get_device
from triosim.trace import Op, Tensor

DATA = Path(__file__).resolve().parent / "data" / "h200-curves.json"
GAP_S = 1.92e-6  # launch floor + measured back-to-back gap that the curves take out (device_curves.py)


def _tensor(tid: str, shape: tuple[int, ...], each: int = 2, category: str = "output") -> Tensor:
    n = 1
    for d in shape:
        n *= d
    return Tensor(tid, each * n, n, each, category, "", shape)


def attention_cost(b: int, h: int, s: int, d: int, causal: bool, backward: bool):
    """The cost a run gives a fused attention op of this shape (as a model card writes it)."""
    q, k, v, o = (_tensor(x, (b, h, s, d)) for x in ("q", "k", "v", "o"))
    lse = _tensor("lse", (b, h, s), 4)
    if backward:
        ins = [_tensor("g", (b, h, s, d), category="grad_output"), q, k, v, o, lse]
        outs = [_tensor(x, (b, h, s, d)) for x in ("dq", "dk", "dv")]
        name, stage = "autograd::engine::evaluate_function: ScaledDotProductFlashAttentionBackward0", "backward"
    else:
        ins, outs, name, stage = [q, k, v], [o, lse], "aten::_scaled_dot_product_flash_attention", "forward"
    op = Op(0, 1, name, tuple(t.id for t in ins), tuple(t.id for t in outs), 0.0, 0.0, stage, False, 2)
    return op_cost(op, {t.id: t for t in [*ins, *outs]}, causal=causal)


def main() -> None:
    device = get_device("h200")
    before = replace(device, attention_efficiency=None)
    bf16 = Precision("bf16")
    gap = GAP_S - device.launch_floor_s
    records = json.loads(DATA.read_text())["records"]
    by = {(tuple(r["shape"]), r["causal"], r["op"]): r for r in records if r.get("op", "").startswith("cudnn")}
    print("| b×h×s×d | mask | triosim fwd ms | cuDNN fwd ms | ratio | triosim bwd ms | cuDNN bwd ms | ratio "
          "| before: fwd ratio | before: bwd ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (shape, causal, op), fwd in sorted(by.items()):
        if op != "cudnn fwd":
            continue
        bwd = by[(shape, causal, "cudnn bwd")]
        row = []
        for rec, backward in ((fwd, False), (bwd, True)):
            cost = attention_cost(*shape, causal, backward)
            t = roofline_seconds(cost, device, bf16) + gap
            old = roofline_seconds(cost, before, bf16) + gap
            row.append((t, rec["t_s"], old))
        (tf, mf, of), (tb, mb, ob) = row
        b, h, s, d = shape
        print(f"| {b}×{h}×{s}×{d} | {'causal' if causal else 'full'} | {tf * 1e3:.3f} | {mf * 1e3:.3f} | "
              f"{tf / mf:.2f} | {tb * 1e3:.3f} | {mb * 1e3:.3f} | {tb / mb:.2f} | {of / mf:.2f} | {ob / mb:.2f} |")


if __name__ == "__main__":
    main()
