"""bench/device_host_power.py (run by bench/device_curves.py on a lent GPU) in its CPU smoke form:
the records it leaves in a run's meta, and what the printed table says of them."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run():
    curves = _load("device_curves")
    bench = curves.Bench(torch, "cpu", time.monotonic() + 60)
    return curves.Run(torch, bench, dict(curves.H200), "cpu", None)


@pytest.fixture(scope="module")
def host_power():
    return _load("device_host_power")


def test_host_suite_times_each_op_and_the_read(run, host_power):
    host_power.host_suite(run, smoke=True)
    host = run.meta["host"]
    assert set(host["launch_us"]) == {"add_ (1 element)", "linear bf16 128x64x64", "layer_norm bf16", "silu bf16",
                                      "sdpa bf16 causal"}
    assert all(v > 0 for v in host["launch_us"].values())
    assert host["launch_and_item_us_median"] > 0


def test_sustained_suite_reports_first_and_sustained_rates(run, host_power):
    host_power.sustained_suite(run, smoke=True)
    rec = run.meta["sustained"]["bf16 gemm"]
    assert rec["shape"] == [64, 64, 64] and rec["flops_per_call"] == 2.0 * 64 ** 3
    assert rec["windows"] == len(rec["window_fracs"]) >= 1
    # the two rates are the first window's and the median of the second half's, as fractions of peak
    tail = sorted(rec["window_fracs"][rec["windows"] // 2:])
    assert min(tail) <= round(rec["sustained_frac"], 4) <= max(tail)
    assert rec["first_frac"] == pytest.approx(rec["window_fracs"][0], rel=1e-3, abs=1e-4)


def test_windows_split_the_run_in_timed_windows(host_power):
    calls = []
    ws = host_power.windows(torch, lambda: calls.append(1), 0.05, 10, False)
    assert len(calls) == 10 * len(ws)
    assert all(t1 >= t0 and per >= 0 for t0, t1, per in ws)


def test_describe_prints_the_clock_when_read(host_power):
    meta = {"sustained": {"fp8 gemm": {"shape": [8192] * 3, "first_frac": 0.72, "sustained_frac": 0.61,
                                       "windows": 48, "sm_mhz_first": 1980.0, "sm_mhz_sustained": 1410.0,
                                       "power_w_sustained": 699.0, "throttle_reasons": ["0x4"]}},
            "host": {"launch_us": {"add_ (1 element)": 4.5}, "launch_and_item_us_median": 20.0}}
    lines = host_power.describe(meta)
    assert lines[0] == ("sustained fp8 gemm 8192x8192x8192: first window 0.720, sustained 0.610 of peak over 48 "
                        "windows, SM 1980.0 -> 1410 MHz at 699 W, throttle 0x4")
    assert lines[1] == "host launch µs: add_ (1 element) 4.5; launch + .item() 20.0 µs"
