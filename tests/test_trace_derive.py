"""The columnar trace loader and the fast ``derive`` give exactly what the straightforward code
gave: the data-flow facts of ``derive`` against a reference copy of the original per-op
implementation (kept here as the oracle), and ``load_trace(fast=True)`` against ``fast=False``
on the reference, synthetic and hypothesis-generated traces. Each property has a planted bug.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import triosim.trace.dataflow as trace_module
from triosim.trace import Op, Tensor, Trace, load_trace
from triosim.trace.buffer_columns import buffer_columns
from triosim.trace.dataflow import _forward_partners, _grad_ready_ops
from triosim.trace.model import PARAMETER_CATEGORIES
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace
from triosim.trace.synthetic_transformer import (
    SyntheticTransformer,
    write_synthetic_transformer,
)

# ----------------------------------------------------------------------------- the oracle
# The original derive, one Python step per op and tensor (before the loader was made columnar).

def _ref_dedup(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _ref_resolve_aliases(ops: list[Op], tensors: dict[str, Tensor]) -> dict[str, str]:
    """Map a read-but-never-written tensor to an earlier tensor of the same storage.

    Ops the tracer dropped (views, AccumulateGrad) leave such tensors behind; without this they
    would look like data fetched from outside the step. Storage IDs can be reused by the
    allocator, so only the latest earlier writer (or a parameter) counts, and it must be at
    least as large.
    """
    written = {tid for op in ops for tid in op.outputs}
    last_writer_by_storage: dict[str, str] = {}
    alias: dict[str, str] = {}
    seen: set[str] = set()
    for op in ops:
        for tid in op.inputs:
            # Decide at the first read only: a parameter read again after some op wrote a
            # view of its storage (a transposed weight) is still the parameter.
            if tid in seen or tid in written:
                continue
            seen.add(tid)
            t = tensors[tid]
            base = last_writer_by_storage.get(t.storage) if t.storage else None
            if base is not None and tensors[base].bytes >= t.bytes:
                alias[tid] = base
            elif t.storage and tensors[tid].category in PARAMETER_CATEGORIES:
                # Parameters live for the whole run, so their storage is never reused:
                # a later unwritten tensor of that storage is a view of the parameter.
                last_writer_by_storage.setdefault(t.storage, tid)
        for tid in op.outputs:
            st = tensors[tid].storage
            if st:
                last_writer_by_storage[st] = tid
    return alias


def reference_derive(trace: Trace) -> tuple[Trace, dict[str, tuple[int, ...]]]:
    """The original derive (the oracle)."""
    ops, tensors = trace.ops, trace.tensors
    alias = _ref_resolve_aliases(ops, tensors)

    def b(tid: str) -> str:
        return alias.get(tid, tid)

    reads = [_ref_dedup(b(t) for t in op.inputs) for op in ops]
    writes = [_ref_dedup(b(t) for t in op.outputs) for op in ops]
    first_read: dict[str, int] = {}
    first_write: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for i in range(len(ops)):
        for t in reads[i]:
            first_read.setdefault(t, i)
            consumers.setdefault(t, []).append(i)
        for t in writes[i]:
            first_write.setdefault(t, i)
    # External: read before (or by the same op as) its first write, or never written.
    external = sorted(
        (t for t, r in first_read.items() if first_write.get(t, len(ops)) >= r),
        key=lambda t: (first_read[t], t),
    )
    producer = {t: i for t, i in first_write.items() if first_read.get(t, len(ops)) > i}
    params = tuple(
        t for t in external if tensors[t].category in PARAMETER_CATEGORIES and tensors[t].bytes > 0
    )

    # Batch-invariant buffers: parameters, anything an optimizer op touches (gradients,
    # optimizer state) and aliases of those.
    invariant: set[str] = set(params)
    for i, op in enumerate(ops):
        if op.stage == "optimizer":
            invariant.update(reads[i])
            invariant.update(writes[i])
    invariant.update(tid for tid, base in alias.items() if base in invariant)

    trace = replace(
        trace,
        alias=alias,
        reads=reads,
        writes=writes,
        producer=producer,
        external=tuple(external),
        parameters=params,
        batch_invariant=frozenset(invariant),
    )
    return trace, {t: tuple(c) for t, c in consumers.items()}




def _same_facts(trace: Trace) -> None:
    got, (want, consumers) = trace_module.derive(trace), reference_derive(trace)
    assert got == want
    # The integer-coded columns derive made equal those of its buffer lists, coded afresh.
    fresh = buffer_columns(want.tensors, want.reads, want.writes)
    for name in ("ids", "index", "nbytes", "read_code", "read_op", "write_code", "write_op"):
        assert np.array_equal(getattr(got.buffer_columns, name), getattr(fresh, name)) if name not in ("ids", "index") \
            else getattr(got.buffer_columns, name) == getattr(fresh, name), name
    # Derived on first use, from the facts above (dictionary order included).
    assert list(got.consumers.items()) == list(consumers.items())
    partner = _forward_partners(want.ops, want.reads, want.writes, set(want.parameters))
    assert got.forward_partner == partner
    first_read = {p: consumers[p][0] for p in want.parameters}
    assert got.grad_ready_op == _grad_ready_ops(want.ops, want.reads, want.parameters, partner, first_read)


# ----------------------------------------------------------------------------- recorded and synthetic traces

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("model", ["vgg13", "resnet50"])
def test_reference_traces_derive_as_before(model, request):
    trace = load_trace(request.getfixturevalue(f"{model}_dir"), batch_size=128, fast=True)
    _same_facts(trace)
    assert load_trace(trace.path, batch_size=128, fast=False) == trace


@pytest.mark.parametrize("name", ["gpt-cpu-bs8", "gpt-h16-cpu-bs8", "resnet18-cpu-bs16"])
def test_bundled_traces_derive_as_before(name):
    trace = load_trace(REPO / "sample_trace" / name, fast=True)
    _same_facts(trace)
    assert load_trace(REPO / "sample_trace" / name, fast=False) == trace


def test_synthetic_traces_load_and_derive_as_before(tmp_path):
    dirs = [write_synthetic_trace(tmp_path / "mlp", SyntheticModel(layers=6, batch_size=4, seed=3)),
            write_synthetic_transformer(tmp_path / "tf", SyntheticTransformer(layers=2, seed=4))]
    for d in dirs:
        trace = load_trace(d, fast=True)
        _same_facts(trace)
        assert load_trace(d, fast=False) == trace


# ----------------------------------------------------------------------------- generated traces

CATEGORIES = ["weight", "weight", "bias", "input", "output", "grad", "running_mean", "self", "other", ""]


@st.composite
def traces(draw) -> Trace:
    """Small traces whose tensors share few storages, so that views, reused storage and
    parameter aliases all occur; ops read and write tensors with repeats."""
    n_tensors = draw(st.integers(2, 10))
    tensors = {}
    for k in range(n_tensors):
        tid = str(k + 1)
        storage = draw(st.sampled_from(["s1", "s1", "s1", "s2", "", "0", f"own{k}"]))
        nbytes = draw(st.sampled_from([0, 8, 8, 16]))
        shape = draw(st.sampled_from([None, (), (4,), (4, 2)]))
        tensors[tid] = Tensor(tid, nbytes, nbytes // 4, 4, draw(st.sampled_from(CATEGORIES)),
                              "" if storage == "0" else storage, shape)
    ids = st.sampled_from(sorted(tensors))
    n_ops = draw(st.integers(2, 12))
    stages = sorted(draw(st.lists(st.sampled_from([0, 1, 2]), min_size=n_ops, max_size=n_ops)))
    ops = [
        Op(i, i + 1, draw(st.sampled_from(["aten::mm", "aten::add_", "AddmmBackward0"])),
           tuple(draw(st.lists(ids, max_size=4))), tuple(draw(st.lists(ids, max_size=2))), 1e-6, 1e-6,
           ("forward", "backward", "optimizer")[stages[i]], False, i + 2)
        for i in range(n_ops)
    ]
    return Trace(path="generated", batch_size=4, ops=ops, tensors=tensors)


def _derive_property(examples: int, shrink: bool = True):
    # The planted-bug tests only need the failure, not its smallest example.
    phases = tuple(Phase) if shrink else (Phase.explicit, Phase.generate)

    @seed(20261205)
    @settings(max_examples=examples, deadline=None, database=None, phases=phases,
              suppress_health_check=[HealthCheck.too_slow])
    @given(traces())
    def prop(trace):
        _same_facts(trace)
        assert trace_module.derive(trace_module.derive(trace)) == trace_module.derive(trace)  # idempotent

    return prop


def test_generated_traces_derive_as_before():
    _derive_property(300)()


def test_property_catches_an_alias_walk_that_ignores_parameters(monkeypatch):
    """Planted bug: the alias walk forgets that a parameter's storage makes later unwritten
    tensors of that storage views of the parameter (as a shortcut skipping "unwritten" tensors
    might)."""
    original = trace_module._resolve_aliases

    def no_parameter_views(ops, tensors):
        bare = {k: t._replace(category="input") if t.category in PARAMETER_CATEGORIES else t
                for k, t in tensors.items()}
        return original(ops, bare)

    monkeypatch.setattr(trace_module, "_resolve_aliases", no_parameter_views)
    with pytest.raises(AssertionError):
        _derive_property(300, shrink=False)()


def test_property_catches_buffer_lists_with_repeats(monkeypatch):
    """Planted bug: an op's buffer list keeps a repeated tensor (the shortcut that keeps a
    tuple as it is taken for every list)."""
    monkeypatch.setattr(trace_module, "_buffers", lambda lists, alias: [tuple(alias.get(t, t) for t in x) for x in lists])
    with pytest.raises(AssertionError):
        _derive_property(300, shrink=False)()
