"""``--gpu`` end to end: `triosim gpus`, the summary header, the JSON ``gpu`` and ``memory``
blocks, sweep columns, memory verdicts and ``--require-fit`` (issue 20)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from cli_capture import run as run_argv

SAMPLES = Path(__file__).resolve().parents[1] / "sample_trace"
GPT16 = str(SAMPLES / "gpt-h16-cpu-bs8")
R18 = str(SAMPLES / "resnet18-cpu-bs16")
H200 = str(SAMPLES / "resnet18-h200-bs16")



def cli(*argv: str) -> tuple[int, str, str]:
    return run_argv(list(argv))


def ms(*argv: str) -> float:
    code, out, err = cli("run", *argv, "-q")
    assert code == 0, err
    return float(out)


def result(tmp_path: Path, *argv: str) -> dict:
    path = tmp_path / "r.json"
    code, _, err = cli("run", *argv, "--json", str(path), "-q")
    assert code in (0, 3), err
    return json.loads(path.read_text())


def test_gpus_lists_the_database() -> None:
    code, out, _ = cli("gpus")
    assert code == 0
    for name in ("v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "mi300x", "l40s"):
        assert name in out
    code, out, _ = cli("gpus", "--json")
    rows = {d["name"]: d for d in json.loads(out)}
    assert rows["h100-sxm"]["matrix_tflops"]["bf16"] == 989.4 and rows["h100-sxm"]["memory_gb"] == 80


def test_gpus_checks_a_device_file(tmp_path: Path) -> None:
    from triosim.hardware.device_db import packaged_dir

    mine = tmp_path / "my-gpu.yaml"
    mine.write_text((packaged_dir() / "h100-sxm.yaml").read_text().replace("name: h100-sxm", "name: my-gpu"))
    code, out, _ = cli("gpus", "--gpu-file", str(mine), "--json")
    assert code == 0 and json.loads(out)[0]["name"] == "my-gpu"
    assert ms("-trace-dir", R18, "--gpu-file", str(mine)) == ms("-trace-dir", R18, "--gpu", "h100-sxm")


def test_an_edited_device_file_is_read_again(tmp_path: Path) -> None:
    """One process, the same --gpu-file path, the file edited between two runs (a sweep, the
    Python API, a fuzz test): the second run times ops on the edited device, not a cached one."""
    import os

    from triosim.hardware.device_db import packaged_dir

    mine = tmp_path / "my-gpu.yaml"
    text = (packaged_dir() / "h100-sxm.yaml").read_text()
    mine.write_text(text)
    fast = ms("-trace-dir", R18, "--gpu-file", str(mine))
    mine.write_text(text.replace("hbm_gbps: 3350", "hbm_gbps: 335"))
    os.utime(mine, ns=(1, 1))  # a different stamp even on a coarse clock
    assert ms("-trace-dir", R18, "--gpu-file", str(mine)) > fast
    mine.write_text("name: my-gpu\n")
    code, _, err = cli("run", "-trace-dir", R18, "--gpu-file", str(mine), "-q")
    assert code == 2 and "missing field" in err


def test_a_cpu_trace_on_an_h100_computes_at_least_20x_faster(tmp_path: Path) -> None:
    cpu = result(tmp_path, "-trace-dir", R18)["per_gpu"][0]["compute_ms"]
    gpu = result(tmp_path, "-trace-dir", R18, "--gpu", "h100-sxm")["per_gpu"][0]["compute_ms"]
    assert cpu > 20 * gpu


def test_link_bandwidth_matters_once_compute_is_a_gpus() -> None:
    flags = ("-trace-dir", GPT16, "-case", "2", "-GPUnumber", "8")
    slow, fast = (ms(*flags, "-ptp-bandwidth", bw, "--gpu", "h100-sxm") for bw in ("10", "900"))
    assert slow > 1.05 * fast
    slow, fast = (ms(*flags, "-ptp-bandwidth", bw) for bw in ("10", "900"))
    assert slow < 1.001 * fast  # CPU compute hides the links


def test_auto_keeps_a_gpu_traces_own_times_and_retarget_to_it_is_identical() -> None:
    plain = ms("-trace-dir", H200)
    assert ms("-trace-dir", H200, "--gpu", "h200") == plain
    assert ms("-trace-dir", H200, "--gpu", "h200", "--op-time-source", "trace") == plain
    assert ms("-trace-dir", H200, "--gpu", "h200", "--op-time-source", "retarget") == plain
    assert ms("-trace-dir", H200, "--gpu", "h100-sxm") > plain  # retargeted to a slower part
    assert ms("-trace-dir", H200, "--gpu", "b200") < plain


def test_json_gpu_block_only_with_gpu(tmp_path: Path) -> None:
    plain = result(tmp_path, "-trace-dir", R18)
    assert "gpu" not in plain and "memory" not in plain
    assert not any(k in plain["config"] for k in ("gpu", "gpu-file", "op-time-source", "dtype", "memory-overflow"))
    with_gpu = result(tmp_path, "-trace-dir", R18, "--gpu", "h100-sxm")
    gpu = with_gpu["gpu"]
    assert gpu["name"] == "h100-sxm" and gpu["op_time_source"] == "roofline"
    assert "ops_costed_by_bytes_only" in gpu and gpu["dtype"]
    assert with_gpu["memory"]["fits"] is True and with_gpu["memory"]["capacity_bytes"] == 80 * 10**9
    assert with_gpu["config"]["gpu"] == "h100-sxm"
    assert with_gpu["time_source"] == "roofline"  # no CPU-time notice: CPU times are not used


def test_summary_header_names_the_gpu_and_source() -> None:
    code, out, _ = cli("run", "-trace-dir", R18, "--gpu", "h100-sxm")
    assert code == 0
    assert "H100-SXM, op times: roofline from shapes" in out
    assert "measured on CPU" not in out
    code, out, _ = cli("run", "-trace-dir", R18, "--gpu", "h100-sxm", "--op-time-source", "trace")
    assert "H100-SXM, op times: measured" in out and "measured on CPU" in out  # CPU times used: say so


def test_a_batch_over_the_gpus_memory_is_a_verdict(tmp_path: Path) -> None:
    r = result(tmp_path, "-trace-dir", R18, "-batch-size-sim", "2048", "--gpu", "a100-40gb")
    mem = r["memory"]
    assert mem["fits"] is False and mem["capacity_bytes"] == 40 * 10**9
    worst = mem["worst"]
    assert worst["peak_bytes"] > mem["capacity_bytes"]
    assert {"weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes"} <= set(worst)
    assert r["fetched_bytes"] == 0  # planned without spilling
    code, out, _ = cli("run", "-trace-dir", R18, "-batch-size-sim", "2048", "--gpu", "a100-40gb")
    assert code == 0 and "does not fit: GPU 0 peaks at" in out and "A100-SXM4-40GB" in out
    # -capacity given wins over the device's memory
    assert result(tmp_path, "-trace-dir", R18, "-batch-size-sim", "2048", "--gpu", "a100-40gb",
                  "-capacity", "50")["memory"]["fits"] is True


def test_spill_stays_available() -> None:
    spill = ms("-trace-dir", R18, "-batch-size-sim", "2048", "--gpu", "a100-40gb", "--memory-overflow", "spill")
    verdict = ms("-trace-dir", R18, "-batch-size-sim", "2048", "--gpu", "a100-40gb")
    assert spill > verdict  # remote-memory traffic


def test_require_fit_exits_3_after_writing_outputs(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code, _, err = cli("run", "-trace-dir", R18, "-batch-size-sim", "2048", "--gpu", "a100-40gb", "--require-fit",
                       "--json", str(out), "-q")
    assert code == 3 and "does not fit" in err and out.is_file()
    assert cli("run", "-trace-dir", R18, "--gpu", "a100-40gb", "--require-fit", "-q")[0] == 0


def test_memory_verdict_per_pipeline_stage(tmp_path: Path) -> None:
    r = result(tmp_path, "-trace-dir", R18, "-case", "4", "-GPUnumber", "2", "--gpu", "h100-sxm")
    stages = [g["stage"] for g in r["memory"]["per_gpu"]]
    assert stages == [0, 1]


def sweep_csv(tmp_path: Path, *argv: str) -> list[dict]:
    out = tmp_path / "s.csv"
    code, _, err = cli("sweep", "-trace-dir", R18, *argv, "--out", str(out), "-q")
    assert code == 0, err
    return list(csv.DictReader(io.StringIO(out.read_text())))


def test_sweep_columns_only_with_gpu(tmp_path: Path) -> None:
    rows = sweep_csv(tmp_path, "-batch-size-sim", "16,2048")
    assert not {"gpu", "op_time_source", "memory"} & set(rows[0])
    rows = sweep_csv(tmp_path, "-batch-size-sim", "16,2048", "--gpu", "a100-40gb")
    assert [r["op_time_source"] for r in rows] == ["roofline", "roofline"]
    assert [r["memory"] for r in rows] == ["fits", "infeasible"]
    assert [r["gpu"] for r in rows] == ["a100-40gb", "a100-40gb"]


def test_config_block_with_gpu_round_trips(tmp_path: Path) -> None:
    r = result(tmp_path, "-trace-dir", R18, "--gpu", "h100-sxm", "--dtype", "bf16")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(r))
    again = result(tmp_path, "--config", str(cfg))
    assert again["makespan_ms"] == r["makespan_ms"] and again["gpu"]["dtype"] == "bf16"


@pytest.mark.parametrize("flags", [("--gpu", "h100"), ("--gpu", "a100", "--dtype", "bf16")])
def test_configure_takes_the_gpu_flags(flags) -> None:
    from triosim import configure

    opts = dict(zip((f.lstrip("-") for f in flags[::2]), flags[1::2]))
    trace, platform, _ = configure(trace_dir=R18, **opts)
    assert trace.time_source == "roofline"
