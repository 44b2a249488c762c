"""Measure a GPU's efficiency curves (fraction of peak against work) for a triosim device file.

    python bench/device_curves.py --out curves.json               # on the GPU to measure (~2 min)
    python bench/device_curves.py --device h100-sxm --out h100.json   # peaks from that device file
    python bench/device_curves.py --yaml curves.json              # the curve block for a device file
    python bench/device_curves.py --smoke --out /tmp/s.json       # tiny sizes, CPU is enough

Needs PyTorch (and a CUDA GPU except with ``--smoke``). What it times, each op as the mean of
at least 10 calls after warm-up, with CUDA events:

- GEMMs in bf16 and fp16 (``torch.matmul`` on squares 256…16384; transformer shapes
  tokens × hidden × {1, 3, 4}·hidden as ``F.linear`` with bias and the two backward products
  dX = dY·W and dW = dYᵀ·X; attention-shaped ``torch.bmm``), fp32 with TF32 off and on, fp8
  through ``torch._scaled_mm`` where it works;
- scaled-dot-product attention (flash and cuDNN backends, bf16) forward and backward, causal or
  not, FLOPs 4·b·h·s²·d forward (half if causal) and 2.5× that backward (triosim's op costs);
- HBM: a device-to-device copy and an elementwise add, 64 KiB…4 GiB moved (bytes read + written),
  ``hot`` (the same buffers every call, small ones stay in L2) and ``cold`` (each call on buffers
  not touched lately);
- the launch floor: a one-element add, median of single-kernel event pairs, back-to-back mean,
  and (where the profiler works) the median kernel duration as CUPTI reports it;
- then (bench/device_host_power.py) the host's microseconds to launch a layer's eager ops and a
  device-to-host read, and an 8192³ GEMM run back to back for ``--sustained-s`` seconds (bf16,
  fp8, and bf16 alternating with an elementwise add), its rate and SM clock in the first window
  and sustained: whether the short bursts above ran at a clock a training step keeps.

Each record holds the FLOPs (or bytes), the mean seconds t and two fractions of the device's
peak: ``frac`` = work / (peak · t), and ``frac_model`` = work / (peak · (t − offset)), the
efficiency at which triosim's roofline (``max(...) + launch floor``) gives back the op's kernel
time as a trace (CUPTI) records it. Calls are queued behind a GPU sleep, so the host's launch
cost is not timed, but back-to-back calls still count the GPU's gap between two kernels, which
CUPTI does not: offset = the device file's launch floor + that gap, the gap being the measured
back-to-back time of a one-element add less its CUPTI kernel time (0 where the profiler does not
run). ``frac_model`` is left out for records shorter than 1.5 times the offset.

Curve rule (``--yaml``): for the compute curve, every GEMM record of the dtype (squares and
transformer shapes, forward and backward), binned by half-decades of FLOPs; each bin gives one
point at the median FLOPs and the median ``frac_model`` of its records. Memory: the cold copy
and add records, binned the same way by bytes. Attention: per head size, direction (forward,
backward) and mask (full, causal), one point per measured cuDNN sequence length at its
``frac_model`` (of two shapes of one length, the one with fewer heads).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

# H200 SXM peaks from the datasheet (dense), used when triosim's device file is not at hand.
H200 = {"bf16": 989.4, "fp16": 989.4, "fp32": 67.0, "tf32": 494.7, "fp8": 1978.9, "hbm_gbps": 4800.0,
        "launch_floor_us": 1.0}
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
SQUARES = (256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
HIDDENS = (1024, 2048, 4096, 8192, 12288)
TOKENS = (512, 2048, 8192)
BMM = [(bh, s, d) for bh in (64, 256, 1024) for s in (512, 1024, 2048, 4096) for d in (64, 128)]
SDPA = [(8, 16, 1024, 64), (4, 16, 2048, 64), (2, 16, 4096, 64), (16, 32, 512, 128), (8, 32, 1024, 128),
        (4, 32, 2048, 128), (2, 32, 4096, 128), (1, 32, 8192, 128), (1, 64, 8192, 128), (1, 32, 16384, 128)]
HBM_SIZES = tuple(2 ** k for k in range(16, 33))   # 64 KiB .. 4 GiB moved
POOL_BYTES = 1 << 30                               # per operand, for the cold HBM runs

SMOKE = {"squares": (64, 128), "hiddens": (64, 128), "tokens": (32,), "bmm": [(4, 64, 32)],
         "sdpa": [(1, 2, 64, 32)], "hbm": (2 ** 16, 2 ** 20)}


class Bench:
    """Times callables: CUDA events behind a GPU sleep, or the wall clock on the CPU."""

    def __init__(self, torch, device: str, deadline: float) -> None:
        self.torch = torch
        self.cuda = device == "cuda"
        self.deadline = deadline

    def late(self) -> bool:
        return time.monotonic() > self.deadline

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _sleep(self, seconds: float) -> None:
        # ~2 GHz SM clock; the sleep only has to outlast the host's queueing of the timed calls.
        self.torch.cuda._sleep(int(seconds * 2e9))

    def mean(self, fn, warm: int = 3, min_iter: int = 10, target_s: float = 0.02,
             host_us: float = 60.0) -> float:
        """Mean seconds per call of ``fn``: ``warm`` calls, then n ≥ ``min_iter`` calls timed
        together (n sized to about ``target_s``)."""
        for _ in range(warm):
            fn()
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        est = max(time.perf_counter() - t0, 1e-7)
        n = max(min_iter, min(200, int(target_s / est)))
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) / n
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._sleep(min(n * host_us * 1e-6, 0.05))
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / n

    def each(self, fn, n: int = 200) -> list[float]:
        """Seconds of each of ``n`` calls, each between its own pair of events (all queued
        behind a sleep, so each pair times the GPU only)."""
        torch = self.torch
        fn()
        self.sync()
        if not self.cuda:
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            return out
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        self._sleep(n * 40e-6)
        for a, b in pairs:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) * 1e-3 for a, b in pairs]


class Run:
    """The records of one measurement run and how to turn them into fractions of peak."""

    def __init__(self, torch, bench: Bench, peaks: dict, device: str, out: Path | None) -> None:
        self.torch, self.bench, self.peaks, self.device, self.out = torch, bench, peaks, device, out
        self.records: list[dict] = []
        self.meta: dict = {}
        self.skipped: list[str] = []

    def add(self, suite: str, op: str, dtype: str, shape, t: float, flops: float = 0.0,
            nbytes: float = 0.0, **extra) -> dict:
        peak = self.peaks["hbm_gbps"] * 1e9 if not flops else self.peaks[dtype] * 1e12
        work = flops or nbytes
        rec = {"suite": suite, "op": op, "dtype": dtype, "shape": list(shape), "flops": flops, "bytes": nbytes,
               "t_s": t, "peak": peak, "frac": work / (peak * t), **extra}
        self.records.append(rec)
        return rec

    def save(self) -> None:
        if self.out is not None:
            data = model_fractions({"meta": self.meta, "skipped": self.skipped, "records": self.records})
            self.out.write_text(json.dumps(data, indent=0) + "\n")

    def tensor(self, shape, dtype: str, scale: float = 1.0):
        torch = self.torch
        return torch.randn(*shape, device=self.device, dtype=getattr(torch, DTYPE_NAMES[dtype])) * scale


def gemm_suite(run: Run, dtype: str, squares, hiddens, tokens, bmm, full: bool = True) -> None:
    """Squares (matmul), transformer-shaped linears with their backward products, attention bmm."""
    torch, b = run.torch, run.bench
    F = torch.nn.functional
    for n in squares:
        if b.late():
            return
        x, w, bias = run.tensor((n, n), dtype), run.tensor((n, n), dtype), run.tensor((n,), dtype)
        f = 2.0 * n ** 3
        run.add("gemm_square", "matmul", dtype, (n, n, n), b.mean(partial(torch.matmul, x, w)), f)
        if full:
            run.add("gemm_square", "linear", dtype, (n, n, n), b.mean(partial(F.linear, x, w, bias)), f)
        del x, w, bias
    for h in hiddens:
        for mult in (1, 3, 4):
            out = mult * h
            w, bias = run.tensor((out, h), dtype, 0.02), run.tensor((out,), dtype)
            for t in tokens:
                if b.late():
                    return
                x, dy = run.tensor((t, h), dtype), run.tensor((t, out), dtype)
                f = 2.0 * t * h * out
                shape = (t, h, out)
                run.add("gemm_transformer", "linear", dtype, shape, b.mean(partial(F.linear, x, w, bias)), f)
                if full:
                    run.add("gemm_transformer", "dX=dY·W", dtype, shape, b.mean(partial(torch.matmul, dy, w)), f)
                    run.add("gemm_transformer", "dW=dYᵀ·X", dtype, shape,
                            b.mean(partial(torch.matmul, dy.t(), x)), f)
                del x, dy
            del w, bias
    for bh, s, d in bmm:
        if b.late():
            return
        if bh * s * s * 2 > 9e9:
            continue
        q, k = run.tensor((bh, s, d), dtype), run.tensor((bh, s, d), dtype)
        p = run.tensor((bh, s, s), dtype, 0.01)
        f = 2.0 * bh * s * s * d
        run.add("bmm", "Q·Kᵀ", dtype, (bh, s, d), b.mean(partial(torch.bmm, q, k.transpose(1, 2))), f)
        run.add("bmm", "P·V", dtype, (bh, s, d), b.mean(partial(torch.bmm, p, k)), f)
        del q, k, p


def fp32_suite(run: Run, squares, hiddens, tokens) -> None:
    """fp32 GEMMs with TF32 off (fp32 peak) and on (tf32 peak)."""
    torch = run.torch
    for mode, label in (("highest", "fp32"), ("high", "tf32")):
        torch.set_float32_matmul_precision(mode)
        try:
            before = len(run.records)
            gemm_suite(run, "fp32", squares, hiddens, tokens, [], full=False)
            for rec in run.records[before:]:   # re-express against the mode's own peak
                rec["dtype"] = label
                rec["peak"] = run.peaks[label] * 1e12
                rec["frac"] = rec["flops"] / (rec["peak"] * rec["t_s"])
        finally:
            torch.set_float32_matmul_precision("highest")


def fp8_suite(run: Run, squares, hiddens, tokens) -> None:
    """e4m3 x e4m3 -> bf16 through torch._scaled_mm (skipped where it does not run)."""
    torch, b = run.torch, run.bench
    one = torch.tensor(1.0, device=run.device)
    shapes = [(n, n, n) for n in squares] + [(t, h, m * h) for h in hiddens for m in (1, 4) for t in tokens]
    for t, h, out in shapes:
        if b.late():
            return
        x = run.tensor((t, h), "bf16").to(torch.float8_e4m3fn)
        w = run.tensor((out, h), "bf16").to(torch.float8_e4m3fn)
        fn = partial(torch._scaled_mm, x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        suite = "gemm_square" if t == h == out else "gemm_transformer"
        run.add(suite, "scaled_mm", "fp8", (t, h, out), b.mean(fn), 2.0 * t * h * out)
        del x, w


def sdpa_suite(run: Run, shapes, smoke: bool) -> None:
    """Flash (and cuDNN) attention in bf16, forward and backward, causal and not."""
    torch, b = run.torch, run.bench
    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = [("math", SDPBackend.MATH)] if smoke else [("flash", SDPBackend.FLASH_ATTENTION),
                                                          ("cudnn", SDPBackend.CUDNN_ATTENTION)]
    for name, backend in backends:
        for bs, h, s, d in shapes:
            for causal in (False, True):
                if b.late():
                    return
                q, k, v = (run.tensor((bs, h, s, d), "bf16").requires_grad_() for _ in range(3))
                fwd = 4.0 * bs * h * s * s * d / (2 if causal else 1)
                try:
                    with sdpa_kernel([backend]):
                        call = partial(F.scaled_dot_product_attention, q, k, v, is_causal=causal)
                        with torch.no_grad():
                            t = b.mean(call)
                        run.add("sdpa", f"{name} fwd", "bf16", (bs, h, s, d), t, fwd, causal=causal)
                        o = call()
                        g = torch.randn_like(o)
                        t = b.mean(partial(torch.autograd.grad, o, (q, k, v), g, retain_graph=True), host_us=200)
                        run.add("sdpa", f"{name} bwd", "bf16", (bs, h, s, d), t, 2.5 * fwd, causal=causal)
                        del o, g
                except RuntimeError as e:   # this backend does not take this shape (or at all)
                    run.skipped.append(f"sdpa {name} {(bs, h, s, d)} causal={causal}: {str(e).splitlines()[0]}")
                finally:
                    del q, k, v


def hbm_suite(run: Run, sizes, pool_bytes: int) -> None:
    """Copy and add, hot (same buffers) and cold (fresh slices of 1 GiB pools each call)."""
    torch, b = run.torch, run.bench
    f32 = torch.float32
    pool_n = pool_bytes // 4
    pools = [torch.empty(pool_n, device=run.device, dtype=f32).fill_(1.0) for _ in range(3)]
    cursor = [0]

    def views(n: int, k: int, count: int):
        """``count`` tuples of ``k`` length-n views, each into its own pool, never the same slot
        twice in a row."""
        slots = pool_n // n
        out = []
        for _ in range(count):
            i = cursor[0] % slots
            cursor[0] += 1
            out.append(tuple(pools[j][i * n:(i + 1) * n] for j in range(k)))
        return out

    for moved in sizes:
        for op, k, per in (("copy", 2, 8), ("add", 3, 12)):
            if b.late():
                return
            n = moved // per
            nbytes = n * per
            if n > pool_n:
                bufs = [torch.ones(n, device=run.device, dtype=f32) for _ in range(k)]
                hot = [tuple(bufs)]
            else:
                hot = views(n, k, 1)
            # larger than a pool (≥ 1 GiB an operand, many times the L2): every call is cold
            for mode in ("cold",) if n > pool_n else ("hot", "cold"):
                seq = views(n, k, 240) if mode == "cold" and n <= pool_n else hot * 240
                t = b.mean(partial(_stream, torch, op, iter(seq)), target_s=0.005, min_iter=10, warm=2)
                run.add("hbm", op, "fp32", (n,), t, nbytes=nbytes, mode=mode)
            del hot


def _stream(torch, op: str, buffers) -> None:
    """One copy or add on the next buffers of ``buffers``."""
    bufs = next(buffers)
    if op == "copy":
        bufs[1].copy_(bufs[0])
    else:
        torch.add(bufs[0], bufs[1], out=bufs[2])


def launch_suite(run: Run) -> None:
    """A one-element add: median single-kernel time, back-to-back mean, CUPTI kernel time."""
    torch, b = run.torch, run.bench
    x = torch.zeros(1, device=run.device)
    each = b.each(lambda: x.add_(1.0))
    run.meta["launch"] = {"event_pair_median_us": statistics.median(each) * 1e6,
                          "event_pair_min_us": min(each) * 1e6,
                          "back_to_back_mean_us": b.mean(lambda: x.add_(1.0), min_iter=200) * 1e6}
    if not b.cuda:
        return
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(200):
                x.add_(1.0)
            torch.cuda.synchronize()
        kernels = [(e.name, e.device_time_total) for e in prof.events() if e.device_time_total > 0]
        durs = [t for name, t in kernels if "add" in name.lower()] or [t for _, t in kernels]
        if durs:
            run.meta["launch"]["cupti_kernel_median_us"] = statistics.median(durs)
            run.meta["launch"]["cupti_kernels"] = len(durs)
    except Exception as e:  # the profiler is optional: record why it did not run
        run.skipped.append(f"launch cupti: {type(e).__name__}: {e}")


def environment(torch) -> dict:
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        meta.update(gpu=p.name, sm_count=p.multi_processor_count, memory_gib=round(p.total_memory / 2 ** 30, 1))
        meta["nvidia_smi"] = smi("name,driver_version,clocks.max.sm,clocks.max.mem,power.limit")
    return meta


def smi(fields: str) -> str:
    """``nvidia-smi --query-gpu=fields`` as one line, or why not."""
    try:
        q = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"], capture_output=True,
                           text=True, timeout=20)
        return " | ".join(q.stdout.strip().splitlines()) or q.stderr.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable: {e}"


def device_peaks(name: str) -> dict:
    """Peaks (TFLOPS, GB/s, µs) of a triosim device file; H200's built in."""
    try:
        from triosim.hardware.device_db import get_device
    except ImportError:
        if name.lower() in ("h200", "h200-sxm"):
            return dict(H200)
        raise SystemExit(f"device_curves: triosim is not importable; only h200's peaks are built in, not {name}") from None
    dev = get_device(name)
    peaks = {d: dev.matrix_peak(d) / 1e12 for d in ("bf16", "fp16", "fp32", "tf32", "fp8") if d in dev.matrix_flops}
    peaks.update(hbm_gbps=dev.hbm_bytes_per_s / 1e9, launch_floor_us=dev.launch_floor_s * 1e6)
    return peaks


def model_fractions(data: dict) -> dict:
    """Set every record's ``frac_model`` (module docstring) from its time and the run's launch
    measurements; returns ``data``."""
    meta = data["meta"]
    launch = meta.get("launch", {})
    gap_us = 0.0
    if "cupti_kernel_median_us" in launch and "back_to_back_mean_us" in launch:
        gap_us = max(0.0, launch["back_to_back_mean_us"] - launch["cupti_kernel_median_us"])
    offset = (meta["peaks"]["launch_floor_us"] + gap_us) * 1e-6
    meta["frac_model_offset_us"] = offset * 1e6
    for r in data["records"]:
        work = r["flops"] or r["bytes"]
        r["frac_model"] = work / (r["peak"] * (r["t_s"] - offset)) if r["t_s"] >= 1.5 * offset else None
    return data


def bins(records: list[dict], key: str, per_decade: int = 2) -> list[tuple[float, float, int, float, float]]:
    """(median work, median frac_model, count, lowest, highest) per 1/per_decade decade of ``key``."""
    groups: dict[int, list[dict]] = {}
    for r in records:
        if r.get("frac_model") is None or not r[key] > 0:
            continue
        groups.setdefault(math.floor(math.log10(r[key]) * per_decade), []).append(r)
    out = []
    for _, rs in sorted(groups.items()):
        x = 10 ** statistics.median(math.log10(r[key]) for r in rs)
        fracs = [r["frac_model"] for r in rs]
        out.append((x, min(1.0, statistics.median(fracs)), len(rs), min(fracs), max(fracs)))
    return out


def curve_yaml(data: dict, dtype: str = "bf16") -> str:
    """The efficiency block (compute, compute_by_dtype.fp32, memory) by the module's rule."""
    recs = data["records"]

    def gemms(d):
        return [r for r in recs if r["dtype"] == d and r["suite"] in ("gemm_square", "gemm_transformer")]

    def table(points, indent):
        return "".join(f"{' ' * indent}- [{x:.3e}, {f:.3f}]   # {n} measured, {lo:.2f}-{hi:.2f}\n"
                       for x, f, n, lo, hi in points)

    text = "  compute:\n" + table(bins(gemms(dtype), "flops"), 4)
    extra = [d for d in ("fp32", "tf32", "fp8") if gemms(d)]
    if extra:
        text += "  compute_by_dtype:\n"
        for d in extra:
            text += f"    {d}:\n" + table(bins(gemms(d), "flops"), 6)
    cold = [r for r in recs if r["suite"] == "hbm" and r.get("mode") == "cold"]
    if cold:
        text += "  memory:\n" + table(bins(cold, "bytes"), 4)
    return text + attention_yaml(recs)


def attention_yaml(recs: list[dict], backend: str = "cudnn") -> str:
    """The ``attention`` block: per head size, direction and mask, one point per measured sequence
    length of ``backend`` (cuDNN: the fused attention Transformer Engine runs on Hopper and later);
    where two shapes share a length, the one with fewer heads (the series' own)."""
    series: dict[int, dict[str, dict[int, tuple]]] = {}
    for r in recs:
        if r["suite"] != "sdpa" or not r["op"].startswith(f"{backend} "):
            continue
        name = ("backward" if r["op"].endswith("bwd") else "forward") + ("_causal" if r.get("causal") else "")
        frac = r["frac_model"] if r["frac_model"] is not None else r["frac"]
        b, h, s, d = r["shape"]
        points = series.setdefault(d, {}).setdefault(name, {})
        if s not in points or h < points[s][2][1]:
            points[s] = (s, frac, r["shape"])
    if not series:
        return ""
    text = f"  attention:   # {backend} fused attention, bf16: keys per query -> fraction of the bf16 peak\n"
    text += f"    source: >-\n      measured with bench/device_curves.py ({backend} SDPA backend)\n"
    for d in sorted(series):
        text += f"    head_dim_{d}:\n"
        for name in ("forward", "backward", "forward_causal", "backward_causal"):
            if name in series[d]:
                text += f"      {name}:\n" + "".join(
                    f"        - [{x}, {f:.3f}]   # {'x'.join(map(str, shape))}\n"
                    for x, f, shape in sorted(series[d][name].values()))
    return text


def print_table(data: dict) -> None:
    recs = data["records"]
    print(f"# {data['meta'].get('gpu', 'cpu')}  torch {data['meta'].get('torch')}  cuda {data['meta'].get('cuda')}")
    if "launch" in data["meta"]:
        print("launch floor:", ", ".join(f"{k} {v:.2f}" for k, v in data["meta"]["launch"].items()))
    print("| suite | op | dtype | shape | extra | work | µs | frac | frac_model |")
    print("|---|---|---|---|---|---:|---:|---:|---:|")
    for r in recs:
        extra = r.get("mode", "") or ("causal" if r.get("causal") else "")
        work = f"{r['flops']:.3g} F" if r["flops"] else f"{r['bytes']:.3g} B"
        fm = "" if r["frac_model"] is None else f"{r['frac_model']:.3f}"
        print(f"| {r['suite']} | {r['op']} | {r['dtype']} | {'x'.join(map(str, r['shape']))} | {extra} | {work} | "
              f"{r['t_s'] * 1e6:.1f} | {r['frac']:.3f} | {fm} |")
    for line in _host_power_lines(data["meta"]):
        print(line)
    for d in ("bf16", "fp16", "fp32", "tf32", "fp8"):
        pts = bins([r for r in recs if r["dtype"] == d and r["suite"].startswith("gemm")], "flops")
        if pts:
            print(f"\n{d} GEMM, median frac_model per half-decade: "
                  + ", ".join(f"{x:.1e}:{f:.2f}({n})" for x, f, n, _, _ in pts))
    for line in data.get("skipped", []):
        print("skipped:", line)


def _host_power_lines(meta: dict) -> list[str]:
    """The host and sustained-load lines (bench/device_host_power.py), when the run has them."""
    if "host" not in meta and "sustained" not in meta:
        return []
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import device_host_power
    return device_host_power.describe(meta)


def measure(args) -> int:
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import device_host_power as host_power
    smoke = args.smoke
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    if device == "cpu" and not smoke:
        print("device_curves: no CUDA GPU (use --smoke for a CPU check of the script)", file=sys.stderr)
        return 2
    peaks = device_peaks(args.device)
    bench = Bench(torch, device, time.monotonic() + (args.budget_s or 1e9))
    run = Run(torch, bench, peaks, device, args.out)
    run.meta = {**environment(torch), "device_file": args.device, "peaks": peaks, "smoke": smoke,
                "script": "bench/device_curves.py"}
    sz = SMOKE if smoke else {"squares": SQUARES, "hiddens": HIDDENS, "tokens": TOKENS, "bmm": BMM,
                              "sdpa": SDPA, "hbm": HBM_SIZES}
    steps = [
        ("launch", lambda: launch_suite(run)),
        ("gemm bf16", lambda: gemm_suite(run, "bf16", sz["squares"], sz["hiddens"], sz["tokens"], sz["bmm"])),
        ("sdpa", lambda: sdpa_suite(run, sz["sdpa"], smoke)),
        ("hbm", lambda: hbm_suite(run, sz["hbm"], (1 << 22) if smoke else POOL_BYTES)),
        ("gemm fp16", lambda: gemm_suite(run, "fp16", sz["squares"], sz["hiddens"], sz["tokens"], sz["bmm"])),
        ("fp32", lambda: fp32_suite(run, sz["squares"][:-1] if not smoke else sz["squares"], sz["hiddens"][:4],
                                    sz["tokens"])),
        ("fp8", lambda: fp8_suite(run, sz["squares"], sz["hiddens"], sz["tokens"])),
        ("host", lambda: host_power.host_suite(run, smoke=smoke)),
        ("sustained", lambda: host_power.sustained_suite(run, seconds=args.sustained_s, smoke=smoke)),
    ]
    if device == "cuda":   # bring the clocks up before the first timed call
        a = run.tensor((8192, 8192), "bf16")
        for _ in range(300):
            a @ a
        torch.cuda.synchronize()
        del a
    t_start = time.monotonic()
    for name, step in steps:
        if bench.late():
            run.skipped.append(f"{name}: not run, over --budget-s")
            continue
        t0 = time.monotonic()
        try:
            step()
        except Exception as e:  # one suite failing (fp8 on an old GPU) must not lose the others
            run.skipped.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        if device == "cuda":
            torch.cuda.empty_cache()
        run.meta.setdefault("suite_seconds", {})[name] = round(time.monotonic() - t0, 1)
        print(f"[{time.monotonic() - t_start:6.1f} s] {name} done, {len(run.records)} records", flush=True)
        run.save()
    if device == "cuda":
        run.meta["after"] = smi("clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active")
        run.save()
    print_table(model_fractions({"meta": run.meta, "records": run.records, "skipped": run.skipped}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the records here (JSON)")
    ap.add_argument("--device", default="h200", help="triosim device whose peaks the fractions use (default h200)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script (CPU is enough)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is present (with --smoke)")
    ap.add_argument("--budget-s", type=float, default=0.0, help="stop starting new measurements after this long")
    ap.add_argument("--sustained-s", type=float, default=12.0, help="seconds each sustained load runs (default 12)")
    ap.add_argument("--yaml", type=Path, metavar="JSON", help="print the efficiency block for a device file from a "
                    "results file, and exit")
    ap.add_argument("--table", type=Path, metavar="JSON", help="print the table of a results file, and exit")
    args = ap.parse_args()
    if args.yaml or args.table:
        data = model_fractions(json.loads((args.yaml or args.table).read_text()))
        if args.table:
            print_table(data)
        else:
            print(curve_yaml(data), end="")
        return 0
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
