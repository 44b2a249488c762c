"""bench/megatron_bridge_rows.py: the published rows as typed, and the "needs FLAG" rule."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "megatron_bridge_rows.py"


@pytest.fixture(scope="module")
def rows():
    spec = importlib.util.spec_from_file_location("megatron_bridge_rows", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# The summary's iteration times, GBS * seq / (tokens/s/GPU * GPUs), as the issues list them
PUBLISHED_S = {"h100-8b": 9.070, "h100-70b": 10.227, "b200-8b": 4.280, "gb200-8b": 4.160, "gb200-70b": 7.599,
               "h100-405b": 14.027, "b200-405b": 6.197}


def test_every_row_fills_its_gpus_and_gives_the_published_time(rows):
    assert {r.key for r in rows.ROWS} == set(PUBLISHED_S)
    for r in rows.ROWS:
        assert r.dp * r.tp * r.pp * r.cp == r.gpus, r.key
        assert r.published_s == pytest.approx(PUBLISHED_S[r.key], abs=5e-4), r.key


def test_the_typed_flags_are_triosim_flags(rows):
    """A row runs only flags `triosim run` has (its pending settings aside): a misspelt flag fails here,
    not halfway through a benchmark."""
    available = rows.run_flags()
    for r in rows.ROWS:
        for dtype in rows.PRECISION:
            cmd, _ = rows.command(r, dtype, set())
            flags = {tok for tok in cmd if tok.startswith("--")}
            assert flags <= available, (r.key, sorted(flags - available))


def test_a_missing_flag_is_named_not_replaced(rows):
    (h100_8b,) = (r for r in rows.ROWS if r.key == "h100-8b")
    without = rows.run_flags() - {"--recompute-num-layers", "--recompute-method"}
    cmd, needs = rows.command(h100_8b, "fp8", without)
    assert needs == ["--recompute-granularity full --recompute-method block --recompute-num-layers 5"]
    assert "--recompute" not in cmd  # not run as another recomputation
    cmd, needs = rows.command(h100_8b, "fp8", without | {"--recompute-num-layers", "--recompute-method"})
    assert needs == []
    assert cmd[-6:] == ["--recompute", "full", "--recompute-method", "block", "--recompute-num-layers", "5"]


def test_offload_takes_either_spelling(rows):
    (gb200_70b,) = (r for r in rows.ROWS if r.key == "gb200-70b")
    base = rows.run_flags() - {"--cpu-offloading-num-layers", "--offload-activations"}
    assert rows.command(gb200_70b, "fp8", base)[1]
    cmd, needs = rows.command(gb200_70b, "fp8", base | {"--offload-activations"})
    assert not needs and cmd[-2:] == ["--offload-activations", "40"]


def test_gemm_share_line_correlates_share_and_signed_error(rows):
    """Three rows whose error falls as their GEMM share rises: r = -1 exactly; the share and the
    error are the mean GPU's GEMM over the iteration and (simulated - published) / published."""
    def result(sim_ms: float, gemm_ms: float) -> dict:
        return {"makespan_ms": sim_ms, "breakdown": {"compute_by_kind": {"gemm_ms": gemm_ms}}}

    runs = [(10.0, result(11_000.0, 4_400.0)), (10.0, result(10_000.0, 5_000.0)), (10.0, result(9_000.0, 5_400.0))]
    assert rows.gemm_share_line(runs) == ("GEMM share of the iteration and error: r = -1.00 over 3 rows "
                                          "(share 40-60 %, error +10.0 to -10.0 %)")
    assert rows.gemm_share_line(runs[:2]) is None  # two points make no correlation


def test_the_tp_overlap_rows_run_their_recipes_userbuffer_tables(rows):
    """The rows with TP overlap pass the table their recipe names for the GPU and precision
    (Megatron-Bridge's COMM_OVERLAP_CONFIG_MAP), a file of this repository that reads cleanly."""
    from triosim.graph.tensor.userbuffers import userbuffer_table
    from triosim.safe_yaml import load_yaml_file

    available = rows.run_flags()
    repo = SCRIPT.parents[1]
    for r in rows.ROWS:
        for dtype in rows.PRECISION:
            cmd, needs = rows.command(r, dtype, available)
            assert not any("--tp-comm-overlap-cfg" in n for n in needs), r.key
            if "--tp-comm-overlap" not in r.flags:
                assert r.userbuffers is None and "--tp-comm-overlap-cfg" not in cmd, r.key
                continue
            path = cmd[cmd.index("--tp-comm-overlap-cfg") + 1]
            assert path == f"userbuffers/userbuffers_{dtype}_{r.userbuffers}.yaml", r.key
            table = userbuffer_table(load_yaml_file(repo / path), path)
            # FP8: the reduce-scatter GEMMs by ring exchange on 1 SM; BF16: pipelined
            assert table["proj_fprop"].method == ("ring_exchange" if dtype == "fp8" else "pipeline"), (r.key, dtype)
