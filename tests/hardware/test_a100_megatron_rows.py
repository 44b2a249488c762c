"""The shipped A100 device file and DGX A100 topology file against Korthikanti et al. 2022, Table 5
(Megatron-LM on DGX A100, sequence 2048, fp16), with no number set on those rows: the GEMM
efficiency is capped at the maximum achievable matmul throughput measured on an A100 (0.869 of
peak) and NVLink runs at NCCL's A100 bus-bandwidth cap (235 of 300 GB/s). The 22B rows (one node)
must stay within 3 % and 175B with selective recomputation and sequence parallelism within 5 %,
so a change to the run model or to those files that moves them shows here, not only in
``bench/megatron_validation.py``."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from triosim.cli.console import main

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "topologies" / "dgx-a100-superpod.yaml"
DEVICE = REPO / "triosim" / "hardware" / "device_data" / "a100-80gb.yaml"
MAMF = 0.869  # 271.2 of 312 TFLOP/s, measured (stas00/ml-engineering's MAMF table)
SEQSEL = ["--recompute", "selective", "--sequence-parallel"]
MESH_22B = ["--model", "megatron-22b", "--global-batch", "4", "-micro-batch-size", "4"]
ROWS = {  # (mesh flags, recomputation flags, published seconds, allowed |error|)
    "22b-full": (MESH_22B, ["--recompute", "full"], 1.42, 0.03),
    "22b-seqsel": (MESH_22B, SEQSEL, 1.10, 0.03),
    # Megatron-LM 2022 blocked on every batched send/receive (bench/megatron_validation.py)
    "175b-seqsel": (["--model", "gpt3-175b", "--pp", "8", "--schedule", "interleaved", "--virtual-stages", "3",
                     "--global-batch", "64", "-micro-batch-size", "1", "--pipeline-send", "blocking",
                     "--pipeline-scatter-gather"], SEQSEL, 13.75, 0.05),
}


def seconds(row: str) -> float:
    mesh, recompute, _, _ = ROWS[row]
    argv = ["run", *mesh, "--gpu", "a100-80gb", "--topology-file", str(TOPOLOGY), "--tp", "8", *recompute,
            "--dtype", "fp16", "-q"]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()
    return float(out.getvalue().strip()) / 1e3


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TRIOSIM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


def test_the_files_hold_their_sourced_values() -> None:
    eff = yaml.safe_load(DEVICE.read_text())["efficiency"]["compute_by_dtype"]
    for dtype in ("fp16", "bf16"):
        assert max(e for _, e in eff[dtype]["points"]) == MAMF
    assert yaml.safe_load(TOPOLOGY.read_text())["nvlink"]["efficiency"] == 0.78


@pytest.mark.parametrize("row", sorted(ROWS))
def test_published_rows_hold(row: str) -> None:
    _, _, published, allowed = ROWS[row]
    assert abs(seconds(row) / published - 1) < allowed
