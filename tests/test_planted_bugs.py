"""Tests that kill five of the six planted bugs the suite once missed (issue 24; the sixth,
megatron's collectives sorted by op only, shows on no shipped trace, where no op holds both an
all-gather and a reduce-scatter: ``tests/graph/test_megatron_chained.py`` builds one that does).
Each test states the fact
the bug breaks; ``python bench/mutation_check.py`` plants each bug in a copy of the source and
shows its test failing, and the ``*_catches_*`` tests here plant it with monkeypatch."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import triosim.checks as checks_module
import triosim.graph.replica_symmetry as symmetry_module
import triosim.hardware.flow_network as flow_module
from triosim.compute.op_time import fit_model
from triosim.errors import TraceError
from triosim.graph.rank_map import RankMap
from triosim.graph.replica_symmetry import replicas_alike
from triosim.hardware.flow_network import Flow, maxmin_rates
from triosim.hardware.presets import build_platform
from triosim.schedule.flows import _new_flow
from triosim.trace import load_trace

SAMPLES = Path(__file__).resolve().parents[1] / "sample_trace"


# 1. flow_network: a link is full only when its residual is ~0 (1e-12), not below 1e-3.
def test_a_link_with_a_little_capacity_left_is_not_full() -> None:
    """Two flows on one link; the first is capped at 0.4996 of it by its solo rate, so the link
    keeps 0.0008 that the second takes: 0.5004, not 0.4996 (a flow frozen at residual 1e-3)."""
    a, b = Flow(0, 1.0, 0.4996, [(7, 1.0)]), Flow(1, 1.0, 1.0, [(7, 1.0)])
    maxmin_rates([a, b])
    assert a.rate == pytest.approx(0.4996, rel=1e-12) and b.rate == pytest.approx(0.5004, rel=1e-12)


# 2. schedule/flows: a transfer alone runs at its route's bottleneck, not its widest link.
def test_a_transfer_alone_runs_at_its_bottleneck() -> None:
    graph = SimpleNamespace(resources={0: [3, 4, 5]})
    flow = _new_flow(graph, 0, {3: 100e9, 4: 10e9, 5: 50e9}, 1e6, None, None)
    assert flow.solo_rate == 10e9 and flow.remaining == pytest.approx(1e6 * 10e9)


# 4. replica_symmetry: replicas whose DP groups meet the nodes differently are not alike.
def test_replicas_with_unalike_dp_groups_are_not_alike() -> None:
    """dp 3 × tp 2 × pp 2 ordered (pp, dp, tp) on nodes of 4: every pipeline and TP group meets
    the nodes alike, the DP groups do not."""
    platform = build_platform(num_gpus=12, topology="nvlink-cluster", gpus_per_node=4)
    ranks = RankMap(3, 2, 2, ("pp", "dp", "tp"))
    assert replicas_alike(platform, ranks) is False


def test_replica_check_catches_a_missing_dp_group_check(monkeypatch) -> None:
    calls = []
    real = symmetry_module._alike
    monkeypatch.setattr(symmetry_module, "_alike", lambda nodes: calls.append(1) or (real(nodes) if len(calls) < 3
                                                                                        else True))
    with pytest.raises(AssertionError):
        test_replicas_with_unalike_dp_groups_are_not_alike()


# 5. op_time: the fitted model's kernel floor is floor_us µs (2 µs by default), not a tenth.
def test_fitted_model_floor_is_the_kernel_floor() -> None:
    small = load_trace(SAMPLES / "resnet18-h200-bs16", batch_size=16)
    large = load_trace(SAMPLES / "resnet18-h200-bs64", batch_size=64)
    model = fit_model(small, [large], floor_us=2.0)
    measured = [op.duration_s for op in small.ops]
    assert model.floor == tuple(min(2e-6, t) for t in measured)
    assert all(model.seconds(i, 1) >= min(2e-6, t) for i, t in enumerate(measured))


# 6. the readers' limits are exclusive: a value equal to the limit is refused (>=, not >).
def _one_cell(tmp_path: Path, column: str, value: str) -> Path:
    import csv
    import io

    d = tmp_path / "t"
    shutil.copytree(SAMPLES / "resnet18-cpu-bs16", d)
    rows = list(csv.reader(io.StringIO((d / "trace.csv").read_text())))
    rows[1][rows[0].index(column)] = value
    if column == "Operator_cudatime":
        rows[1][rows[0].index("Operator_cudatimenooverlap")] = "1.0"
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    (d / "trace.csv").write_text(buf.getvalue())
    return d


@pytest.mark.parametrize("fast", [False, True])
def test_an_operator_id_at_the_count_limit_is_refused(tmp_path: Path, fast: bool) -> None:
    d = _one_cell(tmp_path, "OperatorID", str(checks_module.MAX_COUNT))
    with pytest.raises(TraceError, match="trace.csv:2: OperatorID: too large"):
        load_trace(d, batch_size=16, fast=fast)
    ok = _one_cell(tmp_path / "ok", "OperatorID", str(checks_module.MAX_COUNT - 1))
    assert load_trace(ok, batch_size=16, fast=fast).ops[0].op_id == checks_module.MAX_COUNT - 1


@pytest.mark.parametrize("fast", [False, True])
def test_an_op_time_at_the_time_limit_is_refused(tmp_path: Path, fast: bool) -> None:
    d = _one_cell(tmp_path, "Operator_cudatime", "32000000000000")  # MAX_TIME_US exactly
    with pytest.raises(TraceError, match="trace.csv:2: Operator_cudatime: time must be a finite number"):
        load_trace(d, batch_size=16, fast=fast)


def test_limit_tests_catch_a_limit_written_as_greater_than(tmp_path: Path, monkeypatch) -> None:
    """Planted bugs: the checker's count limit and the pyarrow reader's time limit inclusive."""
    import triosim.trace.arrow_reader as arrow_module

    real_cell_int = checks_module.cell_int

    def inclusive(text, file, row, column, *, minimum=0, maximum=checks_module.MAX_COUNT):
        return real_cell_int(text, file, row, column, minimum=minimum, maximum=maximum + 1)

    monkeypatch.setattr("triosim.trace.checker.cell_int", inclusive)
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        test_an_operator_id_at_the_count_limit_is_refused(tmp_path / "a", False)
    monkeypatch.undo()
    monkeypatch.setattr(arrow_module, "MAX_TIME_US", np.nextafter(checks_module.MAX_TIME_US, np.inf))
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        test_an_op_time_at_the_time_limit_is_refused(tmp_path / "b", True)


def test_flow_test_catches_a_residual_of_1e_3(monkeypatch) -> None:
    src = Path(flow_module.__file__).read_text().replace("residual[r] <= 1e-12", "residual[r] <= 1e-3")
    import sys
    import types

    planted = types.ModuleType("triosim.hardware.planted_flow")
    planted.__package__ = "triosim.hardware"
    monkeypatch.setitem(sys.modules, planted.__name__, planted)
    exec(compile(src, "planted_flow", "exec"), planted.__dict__)  # the module with the bug planted
    monkeypatch.setitem(globals(), "maxmin_rates", planted.maxmin_rates)
    monkeypatch.setitem(globals(), "Flow", planted.Flow)
    with pytest.raises(AssertionError):
        test_a_link_with_a_little_capacity_left_is_not_full()
