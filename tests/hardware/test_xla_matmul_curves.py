"""The b200 and gb200 GEMM curves are what bench/xla_matmul_curves.py derives from XLA's measured
matmul table (bench/data/xla-matmul-sm90-sm100.json), and that script's rule in closed form."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from triosim.hardware.device_db import get_device

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "xla_matmul_curves.py"
XLA_COMMIT = "e97611c4c41c1f2dd331aca646792089f7f86b66"


@pytest.fixture(scope="module")
def xla():
    spec = importlib.util.spec_from_file_location("xla_matmul_curves", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def table(xla):
    return json.loads(xla.DATA.read_text())


def _points(curve) -> list[tuple[float, float]]:
    return [(x, f) for x, f in curve.points]


def test_the_stored_table_is_the_cited_commit_with_both_gpus(table) -> None:
    assert table["meta"]["commit"] == XLA_COMMIT
    gpus = {e["gpu"] for e in table["entries"]}
    assert gpus == {"sm_90", "sm_100_B200"}
    # b in 1, 2, 4 and m, n, k in 256..4096 (powers of two): 375 dots per GPU, five dtypes each
    assert len(table["entries"]) == 2 * 375
    assert all(len(e["flop_per_s"]) == 5 for e in table["entries"])
    assert XLA_COMMIT in Path(get_device("b200").path).read_text()


@pytest.mark.parametrize("name", ["b200", "gb200"])
def test_device_curves_are_the_scripts_points(xla, table, name) -> None:
    """Editing a curve by hand (or the table, or the rule) without the other fails here."""
    dev = get_device(name)
    recs = xla.device_records(table, "sm_100_B200")
    for dtype, curve in (("bf16", dev.compute_efficiency), ("fp8", dev.compute_by_dtype["fp8"])):
        scale = xla.mamf_ratio(dtype) if name == "gb200" else 1.0
        want = [(x, round(f * scale, 3)) for x, f, *_ in xla.curve(recs, dtype)]
        got = _points(curve)
        assert [x for x, _ in got] == pytest.approx([x for x, _ in want], rel=1e-3), (name, dtype)
        assert [f for _, f in got] == pytest.approx([f for _, f in want], abs=1e-9), (name, dtype)


def test_gb200_runs_a_large_gemm_faster_than_b200_by_the_mamf_ratio_not_the_peaks(xla) -> None:
    b200, gb200 = get_device("b200"), get_device("gb200")
    big = 1e12
    for dtype in ("bf16", "fp8"):
        rate_b = b200.matrix_peak(dtype) * b200.compute_curve(dtype).at(big)
        rate_g = gb200.matrix_peak(dtype) * gb200.compute_curve(dtype).at(big)
        g, b = xla.MAMF["gb200"][dtype][0], xla.MAMF["b200"][dtype][0]   # achieved TFLOPS
        assert rate_g / rate_b == pytest.approx(g / b, rel=2e-3), dtype


def test_parse_and_fraction_rule_in_closed_form(xla) -> None:
    text = '''constexpr char kDefaultMatmulPTable[] = R"pb(
  entries {
    key: "sm_100"
    value {
      entries {
        b: 2
        m: 1024
        n: 512
        k: 256
        flops { key: "bf16xbf16->bf16" value: 1000000000000 }
        flops { key: "f32xf32->f32" value: 500000000000 }
      }
    }
  }
)pb";'''
    entries = xla.parse_table(text)
    assert entries == [{"gpu": "sm_100", "b": 2, "m": 1024, "n": 512, "k": 256,
                        "flop_per_s": {"bf16xbf16->bf16": 10**12, "f32xf32->f32": 5 * 10**11}}]
    (bf16,) = (r for r in xla.device_records({"entries": entries}, "sm_100_B200") if r["dtype"] == "bf16")
    flops = 2 * 2 * 1024 * 512 * 256
    kernel_s = flops / 1e12                      # 537 us
    floor = get_device("b200").launch_floor_s
    assert bf16["flops"] == flops
    # the roofline adds the launch floor, so the fraction is taken on the kernel time less the floor
    assert bf16["frac_model"] == pytest.approx(flops / (2250e12 * (kernel_s - floor)))
