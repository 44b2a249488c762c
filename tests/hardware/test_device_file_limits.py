"""A device file's numbers are checked after their conversion to SI units and within a plausible
range (a finite 1e300 in the file used to become an infinite capacity, an OverflowError or an
iteration of 10^294 s), and its names are one line of text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_capture import run

from triosim.errors import ConfigError
from triosim.hardware.device_db import packaged_dir, read_device_file

GOOD = (packaged_dir() / "h100-sxm.yaml").read_text()


def edited(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, 1)


OUT_OF_RANGE = [
    ("memory_gb 1e300", edited("memory_gb: 80", "memory_gb: 1e300"), "'memory_gb' must be between 1e-06 and 1e+09 GB"),
    ("memory_gb 1e-300", edited("memory_gb: 80", "memory_gb: 1.0e-300"), "'memory_gb' must be between"),
    ("hbm_gbps 1e300", edited("hbm_gbps: 3350", "hbm_gbps: 1.0e+300"), "'hbm_gbps' must be between 0.001 and 1e+06 GB/s"),
    ("launch_floor_us 1e300", edited("launch_floor_us: 1.0", "launch_floor_us: 1.0e+300"),
     "'launch_floor_us' must be between 0.001 and 1e+06 µs"),
    ("launch_floor_us 1e-320 (0 s once converted)", edited("launch_floor_us: 1.0", "launch_floor_us: 1.0e-320"),
     "'launch_floor_us' must be between"),
    ("matrix bf16 1e300", edited("  bf16: 989.4", "  bf16: 1.0e+300"),
     "'matrix_tflops.bf16' must be between 0.001 and 1e+06 TFLOPS"),
    ("vector fp32 1e305", edited("vector_tflops:\n  fp64: 34\n  fp32: 67", "vector_tflops:\n  fp64: 34\n  fp32: 1.0e+305"),
     "'vector_tflops.fp32' must be between"),
    ("block_read_gbps 1e300", edited("block_read_gbps: 11.7", "block_read_gbps: 1.0e+300"), "'block_read_gbps' must be between"),
    ("sm_count 1e300", edited("sm_count: 132", "sm_count: 1.0e+300"), "'sm_count' must be between 1 and 1e+06 SMs"),
    ("efficiency fraction 1e-300", edited("[1.0e+9, 0.92]", "[1.0e+9, 1.0e-300]"),
     "'efficiency.memory[4] fraction' must be between 1e-06 and 1 of peak"),
]
NOT_ONE_LINE = [
    ("display_name mapping", edited("display_name: H100-SXM", "display_name: {a: 1}"), "'display_name' must be a non-empty line"),
    ("display_name list", edited("display_name: H100-SXM", "display_name: [a, b]"), "'display_name' must be a non-empty line"),
    ("display_name two lines", edited("display_name: H100-SXM", 'display_name: "two\\nlines"'),
     "'display_name' must be a non-empty line of text (at most 200 characters), got 'two\\nlines'"),
    ("display_name empty", edited("display_name: H100-SXM", 'display_name: "  "'), "'display_name' must be a non-empty line"),
    ("name two lines", edited("name: h100-sxm", 'name: "h100\\nsxm"'), "'name' must be a non-empty line"),
    ("alias two lines", edited("aliases: [h100, h100-sxm5]", 'aliases: ["h1\\n00"]'), "'aliases[0]' must be a non-empty line"),
]


@pytest.mark.parametrize(("text", "message"), [(t, m) for _, t, m in OUT_OF_RANGE + NOT_ONE_LINE],
                         ids=[n for n, _, _ in OUT_OF_RANGE + NOT_ONE_LINE])
def test_device_file_numbers_and_names_are_checked(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "gpu.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        read_device_file(path)
    line = str(err.value)
    assert line.startswith(f"{path}: field ") and message in line and "\n" not in line, line



@pytest.mark.parametrize("argv", [["run", "-q"], ["gpus", "--json"]], ids=["run", "gpus"])
def test_a_huge_memory_is_one_line_not_a_traceback_or_infinity(tmp_path: Path, argv: list[str]) -> None:
    path = tmp_path / "gpu.yaml"
    path.write_text(edited("memory_gb: 80", "memory_gb: 1e300"))
    code, out, err = run([*argv, "--gpu-file", str(path)])
    assert code == 2 and "Infinity" not in out
    assert err.endswith(f"{path}: field 'memory_gb' must be between 1e-06 and 1e+09 GB, got 1e300\n")
    assert err.count("\n") == 1


def test_the_shipped_files_are_within_the_ranges() -> None:
    from triosim.hardware.device_db import shipped_devices

    shipped_devices.cache_clear()
    assert len(shipped_devices()) >= 9


def test_the_range_ends_themselves_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "gpu.yaml"
    path.write_text(edited("memory_gb: 80", "memory_gb: 1.0e+9").replace("launch_floor_us: 1.0", "launch_floor_us: 0.001"))
    dev = read_device_file(path)
    assert dev.memory_bytes == 1e18 and dev.launch_floor_s == pytest.approx(1e-9)
    assert json.dumps(dev.memory_bytes) == "1e+18"
