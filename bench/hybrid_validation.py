"""Hybrid-parallel validation tables: closed forms against the simulator, printed as markdown.

    python bench/hybrid_validation.py            # every table
    python bench/hybrid_validation.py --only bubble|megatron|zero

(a) **Pipeline bubble.** A uniform synthetic MLP (every layer 100 µs forward and 100 µs backward,
    the loss ~0, transfers ~0): the bubble is the iteration time beyond the ideal (each stage's
    share of the work), over the ideal. The closed form
    is (P−1)/(V·R) for P stages, R micro-batches and V virtual stages per GPU. Every schedule runs
    through the hybrid builder (``--pp P --schedule gpipe|1f1b|interleaved``).
(b) **Megatron tensor-parallel volume.** On the GPT sample traces with ``--tp 4``: per layer two
    all-reduces forward and two backward of the activation b·s·h (or a reduce-scatter and an
    all-gather each with ``--sequence-parallel``), so 8·(T−1)/T·b·s·h bytes sent per GPU per layer.
(c) **ZeRO at ``--dp 8``.** On the GPT sample: DP traffic 2Ψ per step for ZeRO-0/1/2 (all-reduce, or
    reduce-scatter + all-gather) and 3Ψ for ZeRO-3 (two gathers and a reduce-scatter), i.e.
    2·(N−1)/N·Ψ and 3·(N−1)/N·Ψ bytes sent per GPU; static memory W + G + O, W + G + O/N,
    W + (G+O)/N and (W+G+O)/N (the (2+2+K)·Ψ/N_dp accounting in the trace's own dtype sizes).

Every number comes from the Python API in this process; nothing is recorded.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

from triosim import build_platform, load_trace, simulate
from triosim.graph.data.zero import buffer_roles
from triosim.graph.layer_count import count_layers
from triosim.graph.strategy import Strategy
from triosim.graph.tensor.megatron import find_blocks
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

REPO = Path(__file__).resolve().parents[1]
GPT_SAMPLES = ("gpt-cpu-bs8", "gpt-h16-cpu-bs8")
MIB = 2**20
SEQ = 128  # the GPT samples' sequence length


# ----------------------------------------------------------------------------- (a) bubble


def uniform_mlp(tmp: Path, layers: int, batch: int):
    """A chain of ``layers`` linears, 100 µs forward and backward each; the loss, its backward and
    the optimizer take 1 ns (the optimizer's share of a stage follows its parameter bytes, which
    differ per layer) so that every stage does the same work."""
    path = write_synthetic_trace(tmp / f"uniform{layers}", SyntheticModel(layers=layers, batch_size=batch, seed=0,
                                                                           min_us=100.0, max_us=100.0))
    trace = load_trace(path, batch_size=batch)
    ops = [op._replace(duration_s=1e-9) if "loss" in op.name.lower() or "Nll" in op.name or op.stage == "optimizer"
           else op for op in trace.ops]
    return replace(trace, ops=ops)


def bubble_rows(tmp: Path) -> list[str]:
    batch = 32
    trace = uniform_mlp(tmp, layers=16, batch=batch)
    work = sum(op.duration_s for op in trace.ops)
    rows = ["| schedule | P | V | R | run | iteration ms | ideal ms | simulated bubble | (P−1)/(V·R) | rel. diff |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    configs = [(s, p, 1, r) for s in ("gpipe", "1f1b") for p in (2, 4, 8) for r in (4, 8, 16, 32)]
    configs += [("interleaved", 4, v, r) for v in (2, 4) for r in (4, 8, 16, 32)]
    configs += [("interleaved", 2, 2, r) for r in (4, 16)]
    for schedule, p, v, r in configs:
        common = dict(micro_batch_size=batch // r, schedule=schedule, partition="time")
        strategy = Strategy(pp=p, virtual_stages=v, **common)
        run = f"--pp {p}" + (f" --virtual-stages {v}" if v > 1 else "")
        platform = build_platform(p, ptp_bandwidth_gbps=1e6, link_latency_us=0.0)
        res = simulate(trace, platform, strategy)
        ideal = work / p
        bubble = (res.makespan_s - ideal) / (work / p)
        closed = (p - 1) / (v * r)
        rows.append(f"| {schedule} | {p} | {v} | {r} | `{run}` | {res.makespan_ms:.4f} | {ideal * 1e3:.4f} | "
                    f"{bubble:.5f} | {closed:.5f} | {abs(bubble - closed) / closed:.0e} |")
    return rows


# ----------------------------------------------------------------------------- (b) Megatron


def megatron_rows() -> list[str]:
    rows = ["| trace | run | layers | b·s·h bytes | collectives | payload MiB | sent per GPU MiB | closed form MiB |",
            "|---|---|---|---|---|---|---|---|"]
    t = 4
    for name in GPT_SAMPLES:
        trace = load_trace(REPO / "sample_trace" / name, batch_size=8)
        layers = count_layers(trace).count
        bsh = next(trace.tensors[k].bytes for b in find_blocks(trace) if b.kind == "attention" for k in b.output)
        for sp in (False, True):
            res = simulate(trace, build_platform(t, topology="switch"),
                           Strategy(tp=t, sequence_parallel=sp, tp_style="megatron"))
            c = res.graph.meta["hybrid"]["collectives_dp0_tp0"]["tp"]
            kinds = _kinds(res.graph, "tp")
            # Per layer 4 block collectives of b·s·h (SP: 4 reduce-scatter + 6 all-gather pairs' halves),
            # 2 for the vocabulary-parallel embedding and head (SP: 3), and the cross-entropy's three
            # all-reduces of b·s fp32 values (12 KiB here), as docs/megatron.md counts them.
            ce = 3 * trace.batch_size * SEQ * 4
            if sp:
                closed = ((t - 1) / t * (10 * layers + 3) * bsh + 2 * (t - 1) / t * ce) / MIB
                form = f"(T−1)/T·(10L+3)·bsh + 2(T−1)/T·{ce // 1024} KiB = {closed:.3f}"
            else:
                closed = 2 * (t - 1) / t * ((4 * layers + 2) * bsh + ce) / MIB
                form = f"2(T−1)/T·((4L+2)·bsh + {ce // 1024} KiB) = {closed:.3f}"
            run = f"`--tp {t}{' --sequence-parallel' if sp else ''}`"
            rows.append(f"| {name} | {run} | {layers} | {bsh:,} | {kinds} | {c['payload_bytes'] / MIB:.3f} | "
                        f"{c['wire_bytes_per_gpu'] / MIB:.3f} | {form} |")
    return rows


def _kinds(graph, group_kind: str) -> str:
    """Collective counts by operation, for one replica's groups of ``group_kind``."""
    seen: dict[str, set] = {}
    for t in range(len(graph.kind)):
        a = graph.attrs[t] or {}
        if a.get("group_kind") == group_kind and "collective" in a and 0 in graph.devices[t]:
            label = a["collective"]  # "tp allreduce linear#18 mb0 stage0 dp0"
            seen.setdefault(a.get("op") or label.split()[1], set()).add(label)
    names = {"allreduce": "all-reduce", "reducescatter": "reduce-scatter", "allgather": "all-gather"}
    order = ("allgather", "reducescatter", "allreduce")  # forward gathers first, as the docs list them
    ranked = sorted(seen.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]))
    return " + ".join(f"{len(v)} {names.get(k, k.replace('_', '-'))}" for k, v in ranked)


# ----------------------------------------------------------------------------- (c) ZeRO


def zero_rows() -> list[str]:
    n = 8
    trace = load_trace(REPO / "sample_trace" / "gpt-cpu-bs8", batch_size=8)
    roles = buffer_roles(trace)
    w, g, o = (sum(trace.tensors[k].bytes for k in group) for group in (roles.weights, roles.gradients, roles.optimizer))
    psi = trace.parameter_bytes
    static = {0: w + g + o, 1: w + g + o / n, 2: w + (g + o) / n, 3: (w + g + o) / n}
    rows = [f"Ψ = {psi:,} B ({psi / MIB:.2f} MiB); W = {w / MIB:.2f}, G = {g / MIB:.2f}, O = {o / MIB:.2f} MiB "
            f"(fp32 weights and gradients, Adam's two states); N = {n}; MiB per GPU.", "",
            "| ZeRO | `--bucket-mb` | iteration ms | DP payload (Ψ) | sent per GPU | closed form | "
            "weights + grads + optimizer | closed form | gathered params at peak (most at once) | peak |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for zero, bucket in ((0, 25.0), (1, 25.0), (2, 25.0), (3, 25.0), (3, 1.0)):
        res = simulate(trace, build_platform(n, topology="switch"), Strategy(dp=n, zero=zero, bucket_mb=bucket))
        h = res.graph.meta["hybrid"]
        c = h["collectives_dp0_tp0"]["dp"]
        m = h["memory"][0]
        held = m["weights_bytes"] + m["gradients_bytes"] + m["optimizer_bytes"]
        wire = (3 if zero == 3 else 2) * (n - 1) / n * psi
        rows.append(f"| {zero} | {bucket:g} | {res.makespan_ms:.3f} | {c['payload_bytes'] / psi:.3f} | "
                    f"{c['wire_bytes_per_gpu'] / MIB:.3f} | {wire / MIB:.3f} | {held / MIB:.3f} | "
                    f"{static[zero] / MIB:.3f} | {m.get('gathered_params_bytes', 0) / MIB:.2f} "
                    f"({m.get('gathered_params_max_bytes', 0) / MIB:.2f}) | {m['peak_bytes'] / MIB:.2f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("bubble", "megatron", "zero"))
    args = ap.parse_args()
    if args.only in (None, "bubble"):
        print("### Pipeline bubble (uniform synthetic MLP, 16 layers, batch 32, `--partition time`)\n")
        with tempfile.TemporaryDirectory() as tmp:
            print("\n".join(bubble_rows(Path(tmp))) + "\n")
    if args.only in (None, "megatron"):
        print("### Megatron tensor-parallel volume (`--tp 4`, batch 8, `switch`)\n")
        print("\n".join(megatron_rows()) + "\n")
    if args.only in (None, "zero"):
        print("### ZeRO at `--dp 8` (GPT sample gpt-cpu-bs8, batch 8, `switch`)\n")
        print("\n".join(zero_rows()))


if __name__ == "__main__":
    main()
