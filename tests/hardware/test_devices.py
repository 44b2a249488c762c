"""The device database: shipped files, names and aliases, and one-line errors for bad files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from triosim.errors import ConfigError
from triosim.hardware.device_db import (
    Curve,
    device_names,
    get_device,
    packaged_dir,
    read_device_file,
)

REQUIRED = {"v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "mi300x", "l40s"}


def test_the_shipped_devices_load_and_carry_sources():
    assert REQUIRED <= set(device_names())
    for name in device_names():
        dev = get_device(name)
        assert dev.vector_peak("fp32") > 0 and dev.hbm_bytes_per_s > 0 and dev.memory_bytes > 0
        assert all(dev.sources[k] for k in ("matrix_tflops", "vector_tflops", "hbm_gbps", "memory_gb"))
        assert dev.matrix_peak("fp32") <= dev.matrix_peak("bf16") if "bf16" in dev.matrix_flops else True


def test_dense_peaks_match_the_datasheets():
    h100 = get_device("H100-SXM")
    assert h100.matrix_peak("bf16") == 989.4e12 and h100.matrix_peak("tf32") == 494.7e12
    assert h100.hbm_bytes_per_s == 3350e9 and h100.memory_bytes == 80e9
    assert get_device("a100-80gb").matrix_peak("bf16") == 312e12
    assert get_device("b200").matrix_peak("fp8") == 4500e12


def test_names_are_case_insensitive_and_aliases_resolve():
    assert get_device("H100").name == "h100-sxm"
    assert get_device(" A100 ").name == "a100-80gb"
    with pytest.raises(ConfigError, match=r"unknown GPU \(known: a100-40gb.*did you mean h100-sxm\?"):
        get_device("h100-sxn")
    with pytest.raises(ConfigError, match="unknown GPU"):
        get_device("tpu-v5")


def test_curves_interpolate_in_log_space_and_clamp():
    c = Curve(((1e6, 0.1), (1e8, 0.5)))
    assert c.at(1.0) == 0.1 and c.at(1e12) == 0.5
    assert c.at(1e7) == pytest.approx(0.3)
    assert c.at(math.nan) == 0.1


GOOD = (packaged_dir() / "h100-sxm.yaml").read_text()


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "my.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace("hbm_gbps: 3350", "hbm_gbps: 0"), r"field 'hbm_gbps' must be a positive finite number"),
    (lambda s: s.replace("hbm_gbps: 3350", "hbm_gbps: .nan"), r"field 'hbm_gbps' must be a positive"),
    (lambda s: s.replace("  bf16: 989.4", "  bf16: -1"), r"field 'matrix_tflops.bf16' must be a positive"),
    (lambda s: s.replace("  bf16: 989.4", "  bf16: .inf"), r"field 'matrix_tflops.bf16'"),
    (lambda s: s.replace("  fp8: 1978.9", "  fp4: 1978.9"), r"field matrix_tflops.fp4: unknown dtype"),
    (lambda s: s.replace("memory_gb: 80\n", ""), r"missing field 'memory_gb'"),
    (lambda s: s + "colour: green\n", r"unknown field 'colour'"),
    (lambda s: s.replace('  hbm_gbps: "NVIDIA', '  hbm_gbpz: "NVIDIA'), r"missing field sources.hbm_gbps"),
    (lambda s: s.replace("[1.0e+9, 0.92]", "[1.0e+9, 1.5]"), r"efficiency.memory\[4\] fraction must be at most 1"),
    (lambda s: s.replace("[1.0e+9, 0.92]", "[1.0e+7, 0.92]"), r"sizes must increase"),
    (lambda s: s.replace("name: h100-sxm", "name: [h100"), r"line \d+: not valid YAML"),
    (lambda s: "- just a list\n", r"expected a mapping of device fields"),
])
def test_bad_device_files_are_one_line_errors_naming_file_and_field(tmp_path, edit, message):
    p = write(tmp_path, edit(GOOD))
    with pytest.raises(ConfigError, match=message) as err:
        read_device_file(p)
    assert str(p) in str(err.value) and "\n" not in str(err.value)


def test_a_users_device_file_loads(tmp_path):
    dev = read_device_file(write(tmp_path, GOOD.replace("name: h100-sxm", "name: My-GPU")))
    assert dev.name == "my-gpu" and dev.matrix_peak("fp8") == 1978.9e12


def test_non_utf8_and_missing_files(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_device_file(p)
    with pytest.raises(ConfigError, match="file not found"):
        read_device_file(tmp_path / "nope.yaml")


def test_sm_count_and_block_rate_are_optional_checked_and_sourced(tmp_path):
    h200 = get_device("h200")
    assert h200.sm_count == 132 and h200.block_read_bytes_per_s == 11.7e9 and h200.sources["block_read_gbps"]
    assert h200.block_limited_rate(64) == 64 * 11.7e9 and h200.block_limited_rate(1000) == 132 * 11.7e9
    assert h200.block_limited_rate(None) is None
    text = (packaged_dir() / "h200.yaml").read_text()
    bare = "\n".join(line for line in text.splitlines()
                     if not line.startswith(("sm_count", "block_read_gbps", "collective_sms")))
    (tmp_path / "bare.yaml").write_text(bare)
    assert read_device_file(tmp_path / "bare.yaml").block_limited_rate(64) is None
    (tmp_path / "bad.yaml").write_text(text.replace("sm_count: 132", "sm_count: 13.5"))
    with pytest.raises(ConfigError, match="bad.yaml: field 'sm_count' must be a whole number"):
        read_device_file(tmp_path / "bad.yaml")
    nosrc = "\n".join(line for line in text.splitlines() if not line.strip().startswith("block_read_gbps: \""))
    (tmp_path / "nosrc.yaml").write_text(nosrc)
    with pytest.raises(ConfigError, match="missing field sources.block_read_gbps"):
        read_device_file(tmp_path / "nosrc.yaml")


def test_step_curves_read_as_calculon_reads_its_tables():
    c = Curve(((1.0, 0.1), (1e9, 0.6), (1.6e10, 0.9), (1.28e11, 0.95)), step=True)
    assert c.at(0.5) == 0.1 and c.at(5e8) == 0.1 and c.at(1e9) == 0.6
    assert c.at(7.7e10) == 0.9  # log-linear would give 0.938 between 16 and 128 GFLOP
    assert c.at(1.28e11) == 0.95 and c.at(1e15) == 0.95
    assert Curve(c.points).at(7.7e10) == pytest.approx(0.9 + 0.05 * math.log(7.7e10 / 1.6e10) / math.log(8))


def test_a100_80gb_is_calculons_a100_description_capped_at_the_measured_matmul_maximum():
    a100 = get_device("a100-80gb")
    assert a100.processing_mode == "no_overlap"
    assert a100.compute_curve("fp16").at(0.5e9) == 0.1 and a100.compute_curve("fp16").at(2e9) == 0.6
    # Calculon's 0.9 from 16 GFLOP and 0.95 from 128, capped at 271.2 / 312 TFLOP/s (measured MAMF)
    assert a100.compute_curve("fp16").at(77.3e9) == 0.869 and a100.compute_curve("bf16").at(309e9) == 0.869
    assert a100.vector_curve("fp16").at(0.25e9) == 0.1 and a100.vector_curve("fp16").at(2e9) == 0.5
    assert a100.memory_efficiency.at(94.4e6) == 0.75 and a100.memory_efficiency.at(201e6) == 0.9
    assert a100.combine(2.0, 1.0) == 3.0 and get_device("h100-sxm").combine(2.0, 1.0) == 2.0
    h100 = get_device("h100-sxm")
    assert h100.vector_curve("bf16") is h100.compute_curve("bf16")  # no vector curve: the compute curves


@pytest.mark.parametrize("edit, message", [
    (lambda s: s + "processing_mode: overlap\n", r"field 'processing_mode' must be one of roofline, no_overlap"),
    (lambda s: s.replace("  memory:\n", "  memory:\n    interpolation: cubic\n    points:\n"),
     r"field efficiency.memory.interpolation must be one of log-linear, step"),
    (lambda s: s.replace("  memory:\n", "  memory:\n    kind: step\n    points:\n"), r"unknown field efficiency.memory.kind"),
    (lambda s: s.replace("  memory:\n", "  vector: 3\n  memory:\n"), r"field 'efficiency.vector' must be a list"),
])
def test_bad_processing_mode_and_curve_forms_are_one_line(tmp_path, edit, message):
    p = write(tmp_path, edit(GOOD))
    with pytest.raises(ConfigError, match=message) as err:
        read_device_file(p)
    assert str(p) in str(err.value) and "\n" not in str(err.value)


def test_a_step_curve_and_no_overlap_in_a_users_file(tmp_path):
    text = GOOD.replace("  memory:\n", "  vector:\n    interpolation: step\n    points: [[1, 0.2], [1.0e+9, 0.5]]\n"
                        "  memory:\n") + "processing_mode: no_overlap\n"
    dev = read_device_file(write(tmp_path, text))
    assert dev.processing_mode == "no_overlap" and dev.vector_curve("fp32").at(5e9) == 0.5
    assert dev.vector_curve("fp32").step and not dev.memory_efficiency.step
