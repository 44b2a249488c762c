"""Activation memory per layer and per pipeline stage against Korthikanti et al. 2022's formula.

    python bench/activation_memory.py                       # GPT sample, 8 layers, tp 4, pp 2, 4 micro-batches
    python bench/activation_memory.py --layers 16 --pp 4

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", section 4,
Table 2) count the bytes one transformer layer keeps for its backward, in fp16 with 1-byte dropout
masks: sbh(34 + 5as/h) without recomputation and tensor parallelism — 16 sbh values of 2 bytes,
two sbh dropout masks, and the attention scores, softmax output and its dropout mask (5as²b);
sbh(10 + 24/t + 5as/(ht)) with tensor parallelism t; 34·sbh/t with sequence parallelism and
selective recomputation; 2sbh (the layer input) with full recomputation, 2sbh/t with sequence
parallelism too.

The GPT sample (``sample_trace/gpt-cpu-bs8``, repeated to ``--layers`` as ``--num-layers`` does)
is fp32 (4 bytes a value), has no dropout (no masks) and a fused attention that keeps no scores
(no 5as/h term) but a second sbh output. So the same terms, counted in the trace's values, are
17 sbh values (16 + that output), plus small LayerNorm and log-sum-exp vectors. The bench prints,
per mode, what triosim keeps per layer (``activations_into_backward_bytes``), that count in sbh
values, Korthikanti's formula in fp16 bytes and in values, and the per-stage activation peaks
of the 1F1B pipeline (stage s keeps up to pp − s micro-batches in flight).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from triosim.graph import build_graph
from triosim.graph.strategy import Strategy
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.trace.repeat import load_repeated

GPT = Path(__file__).resolve().parents[1] / "sample_trace" / "gpt-cpu-bs8"
S, B, H, A, BYTES = 128, 8, 256, 4, 4  # the sample: sequence, batch, hidden, heads, fp32


def korthikanti_fp16_bytes(mode: str, t: int, sp: bool) -> float:
    """Per-layer bytes in fp16 (Korthikanti et al. 2022, Table 2 and section 5), in units of sbh."""
    scores = 5 * A * S / H
    if mode == "full":
        return 2 / (t if sp else 1)
    if mode == "selective":
        return 34 / t if sp else 10 + 24 / t
    return 34 / t + scores / t if sp else 10 + 24 / t + scores / t


def korthikanti_values(mode: str, t: int, sp: bool) -> float:
    """The same layer's kept *values* (masks and scores left out, as the sample has none), in sbh."""
    if mode == "full":
        return 1 / (t if sp else 1)
    return 16 / t if sp else 4 + 12 / t  # the LayerNorms' inputs and outputs stay whole without SP


def _pass_peak(g, stage: dict) -> int:
    """A stage's memory peak during the forward and backward passes (the optimizer's own
    temporaries left out), less its weights, gradients and optimizer state."""
    tasks, step_bytes = g.meta["memory"][stage["gpu"]]["occupancy"]
    passes = [int(n) for task, n in zip(tasks, step_bytes) if (g.attrs[task] or {}).get("stage") != "optimizer"]
    return max(passes) - stage["weights_bytes"] - stage["gradients_bytes"] - stage["optimizer_bytes"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    args = ap.parse_args()
    trace = load_repeated(GPT, args.layers, batch_size=B)
    micro = args.micro_batch_size
    sbh = S * micro * H  # values of one [s, b, h] activation of a micro-batch
    t, pp = args.tp, args.pp
    print(f"GPT sample x {args.layers} layers, s={S} b={micro} (micro-batch of {B}) h={H} a={A}, fp32; "
          f"tp {t}, pp {pp}, 1F1B")
    print(f"{'mode':<22}{'kept/layer':>14}{'sbh values':>12}{'Korthikanti values':>20}{'K. fp16 bytes':>15}"
          f"{'kept/stage (MiB)':>24}{'DAG pass peaks (MiB)':>22}{'ms':>10}")
    for mode, sp in (("none", False), ("none", True), ("selective", False), ("selective", True),
                     ("full", False), ("full", True)):
        start = time.perf_counter()
        strategy = Strategy(tp=t, pp=pp, micro_batch_size=micro, schedule="1f1b", sequence_parallel=sp,
                            recompute=mode)
        g = build_graph(trace, build_platform(num_gpus=t * pp), strategy)
        makespan = schedule(g).makespan
        wall = time.perf_counter() - start
        kept = g.meta["hybrid"]["recompute"]["activations_into_backward_bytes"]
        layer = max(set(kept), key=kept.count)  # most layers' (a stage cut can split one)
        # stage s of a 1F1B pipeline holds up to pp - s micro-batches' activations, L/pp layers each
        m = B // micro
        stages = [layer * args.layers / pp * min(pp - s, m) / (1 << 20) for s in range(pp)]
        peaks = [_pass_peak(g, x) / (1 << 20) for x in g.meta["hybrid"]["memory"]]
        label = mode + (" + SP" if sp else "")
        print(f"{label:<22}{layer:>14,}{layer / BYTES / sbh:>12.3f}{korthikanti_values(mode, t, sp):>20.3f}"
              f"{korthikanti_fp16_bytes(mode, t, sp):>15.3f}{' / '.join(f'{x:.1f}' for x in stages):>24}"
              f"{' / '.join(f'{x:.1f}' for x in peaks):>22}{makespan * 1e3:>10.2f}   ({wall:.1f} s)")
    print("kept/layer: bytes a layer keeps into backward per micro-batch on one TP rank; sbh values: that in "
          "fp32 [s, b, h] activations. The sample keeps one sbh/t more than Korthikanti's values (its fused "
          "attention's second output) unless that output is re-made (selective, full), + LayerNorm and "
          "log-sum-exp vectors (< 0.1 sbh). kept/stage: kept/layer x L/pp layers x the micro-batches 1F1B "
          "keeps in flight on the stage. DAG pass peaks: the memory plan's peak per stage during forward and "
          "backward, less weights, gradients and optimizer state (so it also holds one layer's backward "
          "working set, the embedding's and head's activations, and the gradients not yet written).")


if __name__ == "__main__":
    main()
