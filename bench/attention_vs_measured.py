"""How triosim times a flash-attention op against the H200's measured cuDNN attention.

triosim charges a fused attention op 4·b·h·s²·d FLOPs forward (2.5× backward) with no causal
discount (a trace does not say whether the mask is causal) at the device's bf16 GEMM curve. The
H200 measurements in bench/data/h200-curves.json (bench/device_curves.py, PyTorch SDPA with the
cuDNN backend, the kernels Transformer Engine's fused attention runs on Hopper) time the same
shapes with and without the causal mask. This prints, per shape, triosim's time, the measured
one and their ratio (above 1: triosim slower than the measurement).

    python bench/attention_vs_measured.py
"""

from __future__ import annotations

import json
from pathlib import Path

from triosim.hardware.device_db import get_device

DATA = Path(__file__).resolve().parent / "data" / "h200-curves.json"


def main() -> None:
    device = get_device("h200")
    curve = device.compute_curve("bf16")
    peak = device.matrix_peak("bf16")
    records = json.loads(DATA.read_text())["records"]
    by = {(tuple(r["shape"]), r["causal"], r["op"]): r for r in records if r.get("op", "").startswith("cudnn")}
    print("| b×h×s×d | mask | triosim fwd ms | cuDNN fwd ms | ratio | triosim bwd ms | cuDNN bwd ms | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (shape, causal, op), fwd in sorted(by.items()):
        if op != "cudnn fwd":
            continue
        b, h, s, d = shape
        flops = 4.0 * b * h * s * s * d
        t_fwd = flops / (peak * curve.at(flops))
        t_bwd = 2.5 * flops / (peak * curve.at(2.5 * flops))
        bwd = by[(shape, causal, "cudnn bwd")]
        print(f"| {b}×{h}×{s}×{d} | {'causal' if causal else 'full'} | {t_fwd * 1e3:.3f} | {fwd['t_s'] * 1e3:.3f} | "
              f"{t_fwd / fwd['t_s']:.2f} | {t_bwd * 1e3:.3f} | {bwd['t_s'] * 1e3:.3f} | {t_bwd / bwd['t_s']:.2f} |")


if __name__ == "__main__":
    main()
