"""``--global-batch``: the per-replica batch and micro-batch count it implies, the same run as
``-batch-size-sim`` gives, its refusals, and sweeps (the micro-batch applies to every hybrid point).

Planted bugs each test catches (shown when the feature was added): N used as the per-replica
batch (no division by dp); the contradiction check with ``-batch-size-sim`` removed; the sweep's
micro-batch applying to pipelined points only (as before).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from triosim.cli.console import main
from triosim.config import configure, resolve_batches, sim_namespace
from triosim.config.batch_flags import global_batch_per_replica
from triosim.config.flags import FlagTable
from triosim.errors import ConfigError
from triosim.sweep.grid import build_grid

GPT = str(Path(__file__).resolve().parents[1] / "sample_trace" / "gpt-cpu-bs8")


def _ns(**options) -> argparse.Namespace:
    return sim_namespace({"trace_dir": GPT, **options})


@pytest.mark.parametrize("options, per_replica", [
    ({"dp": 2, "global_batch": 32}, 16),
    ({"dp": 4, "tp": 2, "global_batch": 64, "micro_batch_size": 2}, 16),
    ({"pp": 2, "global_batch": 24, "micro_batch_size": 3}, 24),
    ({"dp": 2, "global_batch": 32, "batch_size_sim": 16}, 16),  # the same number twice: no contradiction
    ({"dp": 2, "global_batch": 32, "batch_size": 4}, 16),  # -batch-size is the trace's recorded batch
])
def test_per_replica_batch_is_n_over_dp(options, per_replica):
    assert global_batch_per_replica(_ns(**options)) == per_replica
    assert resolve_batches(_ns(**options)).sim == per_replica


def test_not_given_changes_nothing():
    assert global_batch_per_replica(_ns(dp=2)) is None
    assert resolve_batches(_ns(dp=2, batch_size_sim=12)).sim == 12


def test_same_run_as_batch_size_sim(capsys):
    def time(*argv: str) -> float:
        assert main(["run", "-trace-dir", GPT, *argv, "-q"]) == 0
        return float(capsys.readouterr().out)

    a = time("--dp", "2", "--pp", "2", "--global-batch", "32", "-micro-batch-size", "4", "--schedule", "1f1b")
    b = time("--dp", "2", "--pp", "2", "-batch-size-sim", "16", "-micro-batch-size", "4", "--schedule", "1f1b")
    assert a == b


def test_configure_scales_the_trace_to_the_replica_batch():
    trace, platform, strategy = configure(trace_dir=GPT, dp=2, tp=2, global_batch=16, micro_batch_size=2)
    assert trace.batch_size == 8 and strategy.micro_batch_size == 2 and platform.num_gpus == 4


@pytest.mark.parametrize("options, needle", [
    ({"dp": 3, "global_batch": 32}, "--global-batch 32 is not a multiple of --dp 3: every data-parallel replica "
                                    "trains the same number of equal micro-batches (use --global-batch 30 or 33)"),
    ({"dp": 2, "global_batch": 36, "micro_batch_size": 8}, "--global-batch 36 is not a multiple of --dp 2 × "
                                                           "-micro-batch-size 8 = 16"),
    ({"dp": 2, "global_batch": 32, "micro_batch_size": 32}, "(use --global-batch 64)"),  # mb above N/dp
    ({"dp": 2, "global_batch": 32, "batch_size_sim": 8}, "--global-batch 32 over --dp 2 is 16 samples per replica, "
                                                         "but -batch-size-sim is 8"),
    ({"global_batch": 32}, "--global-batch needs the degrees of a hybrid run"),
    ({"case": 2, "global_batch": 32}, "--global-batch needs the degrees of a hybrid run"),
    ({"dp": 2, "global_batch": 0}, "--global-batch must be a positive integer, got 0"),
    ({"dp": 2, "global_batch": -64}, "--global-batch must be a positive integer, got -64"),
    ({"dp": 2, "global_batch": 10**400}, "--global-batch an integer of 401 digits over --dp 2 is above the limit"),
])
def test_refusals(options, needle):
    with pytest.raises(ConfigError) as exc:
        resolve_batches(_ns(**options))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_sweep_micro_batch_applies_to_every_hybrid_point():
    """A dp-only hybrid run accumulates gradients over its micro-batches: two micro-batch values
    are two configurations (a -case 2 run has none: one)."""
    grid = build_grid(FlagTable.from_cli(), cli_entries=[("dp", ["2"]), ("micro-batch-size", ["2", "4"])])
    assert [dict(p.values)["micro-batch-size"] for p in grid.points()] == [2, 4]
    grid = build_grid(FlagTable.from_cli(), cli_entries=[("case", ["2"]), ("micro-batch-size", ["2", "4"])])
    assert [dict(p.values)["micro-batch-size"] for p in grid.points()] == ["n/a"]


def test_sweep_rows_of_global_batch(tmp_path: Path, capsys):
    out = tmp_path / "s.csv"
    code = main(["sweep", "-trace-dir", GPT, "--dp", "2,3", "--global-batch", "16", "-micro-batch-size", "2",
                 "-j", "1", "--out", str(out), "-q"])
    capsys.readouterr()
    assert code == 0
    import csv

    rows = {r["dp"]: r for r in csv.DictReader(out.open())}
    assert rows["2"]["status"] == "ok" and rows["2"]["global_batch"] == "16" and rows["2"]["micro_batches"] == "4"
    assert rows["2"]["tokens_per_s"] and rows["2"]["tflops_per_gpu"]
    assert rows["3"]["status"] == "invalid" and "not a multiple of --dp 3 × -micro-batch-size 2" in rows["3"]["reason"]
