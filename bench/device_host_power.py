"""Two measurements bench/device_curves.py runs after its curves: the host's cost of launching a
kernel from eager PyTorch, and the GPU's GEMM rate under sustained load, against its rate in the
short bursts the curves are timed in.

Why they are measured (what triosim cannot tell without them):

- **Sustained load.** The curves time each op as the mean of about 20 ms of back-to-back calls,
  with the GPU idle in between. A training step runs GEMMs back to back for seconds, at the
  board's power limit, and a GPU at its power limit lowers its SM clock. After the H200 run of
  the curves the board read 1,320 MHz at 619 W with the software power cap active (the
  ``after`` line of bench/data/h200-curves.json), against its 1,980 MHz maximum. Whether the
  timed bursts ran nearer 1,980 or nearer 1,320 MHz is what this suite finds out: it runs one
  GEMM (and a mix of GEMMs and memory-bound ops, closer to a transformer layer) back to back for
  ``seconds`` and reads the rate and the SM clock every window.
- **Host launch cost.** Each eager PyTorch op costs the host some microseconds to launch; a
  step made of many short kernels (a mixture-of-experts layer of small experts, without CUDA
  graphs) can leave the GPU waiting for the host. The suite queues calls behind a GPU sleep, so
  the host never waits for the GPU, and divides the host's wall time by the calls; it also
  times a device-to-host read (``.item()``), the synchronisation a token dispatcher does when it
  reads the tokens per expert.

Both land in the run's ``meta`` (``sustained`` and ``host``); nothing here changes a device file.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from functools import partial

SMI_FIELDS = "clocks.sm,power.draw,clocks_throttle_reasons.active"


class ClockLog:
    """``nvidia-smi`` readings (seconds since start, SM MHz, W, throttle reasons) taken every
    ``every`` seconds in a background thread while a suite runs."""

    def __init__(self, every: float = 0.25) -> None:
        self.every = every
        self.rows: list[tuple[float, float | None, float | None, str]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ClockLog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            row = read_smi()
            if row is None:
                return  # no nvidia-smi: nothing to log
            self.rows.append((round(time.monotonic() - self._t0, 3), *row))
            self._stop.wait(self.every)

    def between(self, t0: float, t1: float) -> list[tuple]:
        """Readings taken between ``t0`` and ``t1`` (seconds since the log started)."""
        return [r for r in self.rows if t0 <= r[0] <= t1]

    def since_start(self) -> float:
        return time.monotonic() - self._t0


def read_smi() -> tuple[float | None, float | None, str] | None:
    """(SM MHz, W, throttle reasons) of GPU 0, or None without nvidia-smi."""
    try:
        q = subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    parts = [p.strip() for p in q.stdout.strip().split(",")]
    if q.returncode != 0 or len(parts) != 3:
        return None
    return _number(parts[0]), _number(parts[1]), parts[2]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def windows(torch, fn, seconds: float, calls_per_window: int, on_cuda: bool) -> list[tuple]:
    """Run ``fn`` back to back for about ``seconds``: (start, end, seconds per call) per window of
    ``calls_per_window`` calls, times from CUDA events (the host stays ahead of the GPU) or the
    wall clock on the CPU."""
    out = []
    t_end = time.monotonic() + seconds
    if not on_cuda:
        while time.monotonic() < t_end:
            t0 = time.perf_counter()
            for _ in range(calls_per_window):
                fn()
            out.append((t0, time.perf_counter(), (time.perf_counter() - t0) / calls_per_window))
        return out
    marks = []
    while time.monotonic() < t_end:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls_per_window):
            fn()
        b.record()
        marks.append((a, b))
        if len(marks) > 4:  # keep the queue a few windows deep, never the whole run
            marks[-5][1].synchronize()
    torch.cuda.synchronize()
    t = 0.0
    for a, b in marks:
        dt = a.elapsed_time(b) * 1e-3
        out.append((t, t + dt, dt / calls_per_window))
        t += dt
    return out


def sustained_suite(run, seconds: float = 12.0, size: int = 8192, smoke: bool = False) -> None:
    """A ``size``³ GEMM (bf16, and fp8 where ``torch._scaled_mm`` runs) back to back for
    ``seconds``, then the same GEMM alternating with an elementwise add moving as many bytes as
    the GEMM takes time (a transformer layer's mix). Records, per load: the rate of the first
    window (the GPU as the curves find it) and the median of the last half (sustained), as
    fractions of the dtype's peak, with the SM clock and power read meanwhile."""
    torch, b = run.torch, run.bench
    n = 64 if smoke else size
    seconds = 0.3 if smoke else seconds
    loads = [("bf16", "gemm")]
    if not smoke:
        loads += [("fp8", "gemm"), ("bf16", "gemm+add")]
    result = run.meta.setdefault("sustained", {})
    for dtype, mix in loads:
        if b.late():
            run.skipped.append(f"sustained {dtype} {mix}: not run, over --budget-s")
            continue
        fn, flops = _gemm_call(run, dtype, n)
        if fn is None:
            run.skipped.append(f"sustained {dtype}: torch._scaled_mm does not run here")
            continue
        if mix == "gemm+add":
            fn = _with_add(run, fn, n)
        fn()
        b.sync()
        time.sleep(0.0 if smoke else 2.0)  # idle first, so the first window starts from a rested GPU
        with ClockLog() as log:
            t_run = log.since_start()
            # windows of about 0.25 s at 60 % of peak
            per_window = 200 if smoke else max(1, int(0.25 * run.peaks[dtype] * 1e12 * 0.6 / flops))
            ws = windows(torch, fn, seconds, per_window, b.cuda)
        tail = ws[len(ws) // 2:] or ws
        peak = run.peaks[dtype] * 1e12
        rec = {"shape": [n, n, n], "flops_per_call": flops, "windows": len(ws),
               "first_frac": flops / (peak * ws[0][2]), "sustained_frac": flops / (peak * statistics.median(
                   w[2] for w in tail)),
               "window_fracs": [round(flops / (peak * w[2]), 4) for w in ws]}
        clocks = log.between(t_run, t_run + seconds + 5)
        if clocks:
            half = clocks[len(clocks) // 2:]
            rec["sm_mhz_first"] = clocks[0][1]
            rec["sm_mhz_sustained"] = statistics.median(r[1] for r in half if r[1] is not None) if any(
                r[1] is not None for r in half) else None
            rec["power_w_sustained"] = statistics.median(r[2] for r in half if r[2] is not None) if any(
                r[2] is not None for r in half) else None
            rec["throttle_reasons"] = sorted({r[3] for r in half})
            rec["smi"] = clocks
        result[f"{dtype} {mix}"] = rec
        del fn
        if b.cuda:
            torch.cuda.empty_cache()


def _gemm_call(run, dtype: str, n: int):
    """(a call of an n³ GEMM in ``dtype``, its FLOPs), or (None, 0) where fp8 does not run."""
    torch = run.torch
    flops = 2.0 * n ** 3
    if dtype == "bf16":
        x, w = run.tensor((n, n), "bf16"), run.tensor((n, n), "bf16")
        return partial(torch.matmul, x, w), flops
    one = torch.tensor(1.0, device=run.device)
    try:
        x = run.tensor((n, n), "bf16").to(torch.float8_e4m3fn)
        w = run.tensor((n, n), "bf16").to(torch.float8_e4m3fn)
        fn = partial(torch._scaled_mm, x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        fn()
    except (RuntimeError, AttributeError, TypeError):
        return None, 0.0
    return fn, flops


def _with_add(run, gemm, n: int):
    """``gemm`` then an elementwise add of about the GEMM's duration at the device's HBM rate."""
    torch = run.torch
    t = run.bench.mean(gemm)
    elems = max(1024, int(t * run.peaks["hbm_gbps"] * 1e9 * 0.8 / 12))  # an fp32 add moves 12 bytes an element
    a, c, out = (torch.ones(elems, device=run.device) for _ in range(3))

    def both() -> None:
        gemm()
        torch.add(a, c, out=out)
    return both


def host_suite(run, calls: int = 400, smoke: bool = False) -> None:
    """Host microseconds to launch one eager op, for ops a transformer layer is made of, with the
    GPU asleep so the host never waits; and the round trip of a one-element device-to-host read."""
    torch, b = run.torch, run.bench
    F = torch.nn.functional
    calls = 20 if smoke else calls
    h = 64 if smoke else 1024
    x = run.tensor((128, h), "bf16")
    w = run.tensor((h, h), "bf16")
    norm_w = run.tensor((h,), "bf16")
    q = run.tensor((1, 4, 128, 64), "bf16")
    one = torch.zeros(1, device=run.device)
    ops = {
        "add_ (1 element)": lambda: one.add_(1.0),
        f"linear bf16 128x{h}x{h}": partial(F.linear, x, w),
        "layer_norm bf16": partial(F.layer_norm, x, (h,), norm_w),
        "silu bf16": partial(F.silu, x),
        "sdpa bf16 causal": partial(F.scaled_dot_product_attention, q, q, q, is_causal=True),
    }
    result = run.meta.setdefault("host", {"launch_us": {}})
    for name, fn in ops.items():
        fn()
        b.sync()
        if b.cuda:
            b._sleep(calls * 200e-6 + 0.05)  # outlasts the queueing below, so no call waits for the GPU
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host = (time.perf_counter() - t0) / calls
        b.sync()
        result["launch_us"][name] = round(host * 1e6, 2)
    reads = []
    for _ in range(20 if smoke else 100):
        one.add_(1.0)
        b.sync()
        t0 = time.perf_counter()
        one.add_(1.0)
        one.item()
        reads.append(time.perf_counter() - t0)
    result["launch_and_item_us_median"] = round(statistics.median(reads) * 1e6, 2)


def describe(meta: dict) -> list[str]:
    """Lines for the printed table."""
    lines = []
    for name, rec in meta.get("sustained", {}).items():
        clock = ""
        if rec.get("sm_mhz_sustained") is not None:
            clock = f", SM {rec.get('sm_mhz_first')} -> {rec['sm_mhz_sustained']:.0f} MHz at " \
                    f"{rec.get('power_w_sustained') or 0:.0f} W, throttle {','.join(rec.get('throttle_reasons', []))}"
        lines.append(f"sustained {name} {'x'.join(map(str, rec['shape']))}: first window {rec['first_frac']:.3f}, "
                     f"sustained {rec['sustained_frac']:.3f} of peak over {rec['windows']} windows{clock}")
    host = meta.get("host")
    if host:
        lines.append("host launch µs: " + ", ".join(f"{k} {v:.1f}" for k, v in host["launch_us"].items())
                     + f"; launch + .item() {host['launch_and_item_us_median']:.1f} µs")
    return lines


__all__ = ["ClockLog", "describe", "host_suite", "read_smi", "sustained_suite", "windows"]
