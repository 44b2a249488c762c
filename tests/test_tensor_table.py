"""TensorTable: the pyarrow reader's column-kept tensors are the checker's {ID: Tensor} dictionary."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import triosim.trace.arrow_reader as arrow_module
from triosim.compute.op_time import batch_independent_ops
from triosim.trace import load_trace
from triosim.trace.checker import load_tensors as _load_tensors
from triosim.trace.model import FIELD_LIMIT
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace
from triosim.trace.tensor_table import TensorTable, column_or_none

SAMPLE = Path(__file__).resolve().parents[1] / "sample_trace"


def _both(root: Path):
    table, _ = arrow_module.read_tensors(root / "tensor.csv", FIELD_LIMIT)
    return table, _load_tensors(root / "tensor.csv")


@pytest.mark.parametrize("name", ["gpt-cpu-bs8", "resnet18-cpu-bs16"])
def test_the_table_is_the_checkers_dictionary(name) -> None:
    table, want = _both(SAMPLE / name)
    assert isinstance(table, TensorTable)
    assert len(table) == len(want) and list(table) == list(want)
    assert table == want and want == table
    assert list(table.items()) == list(want.items()) and list(table.values()) == list(want.values())
    assert all(table.at(c) == want[tid] for c, tid in enumerate(table.ids))
    assert np.array_equal(table.nbytes, [t.bytes for t in want.values()])
    assert table.storages == [t.storage for t in want.values()]
    assert table.categories == [t.category for t in want.values()]
    some = next(iter(want))
    assert some in table and "no such tensor" not in table and table.get(some) == want[some]
    assert pickle.loads(pickle.dumps(table)) == want


def test_columns_are_read_only_from_a_table() -> None:
    table, want = _both(SAMPLE / "gpt-cpu-bs8")
    assert column_or_none(want, "nbytes") is None
    assert column_or_none(table, "nbytes") is table.nbytes


def test_a_single_gpu_run_makes_no_tensor_objects(tmp_path) -> None:
    """Case 0 reads columns only: the objects are never made (what saves a fifth of loading)."""
    root = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=30, batch_size=4, seed=2))
    trace = load_trace(root, batch_size=4, fast=True)
    assert isinstance(trace.tensors, TensorTable)
    batch_independent_ops(trace)
    from triosim import build_platform, simulate
    from triosim.graph.strategy import Strategy

    simulate(trace, build_platform(1), Strategy(case=0))
    assert "_tensors" not in vars(trace.tensors)
    assert load_trace(root, batch_size=4, fast=False) == trace
