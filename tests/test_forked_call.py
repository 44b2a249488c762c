"""The forked child that reads trace.csv beside tensor.csv: same result as reading here."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import triosim.trace.forked_call as forked_module
import triosim.trace.plain_reader as plain_module
from triosim.trace.forked_call import ForkedCall
from triosim.trace.load import FIELD_LIMIT, TENSOR_COLUMNS, TRACE_COLUMNS
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
SAMPLE = Path(__file__).resolve().parents[1] / "sample_trace"


def _pid_and(x: int) -> tuple[int, int]:
    return os.getpid(), x * 2


class Refused(Exception):
    pass


def _refuse() -> None:
    raise Refused("no")


@needs_fork
def test_the_value_comes_from_another_process() -> None:
    pid, value = ForkedCall(_pid_and, 21).result()
    assert value == 42 and pid != os.getpid()


@needs_fork
def test_an_exception_in_the_child_is_raised_here() -> None:
    with pytest.raises(Refused, match="no"):
        ForkedCall(_refuse).result()


def test_without_fork_the_call_runs_here(monkeypatch) -> None:
    monkeypatch.delattr(forked_module.os, "fork")
    assert ForkedCall(_pid_and, 1).result() == (os.getpid(), 2)


def _slow_in_a_child(parent: int) -> str:
    if os.getpid() != parent:
        time.sleep(60)
    return "here" if os.getpid() == parent else "child"


@needs_fork
def test_a_child_that_dies_is_replaced_by_a_call_here() -> None:
    call = ForkedCall(_slow_in_a_child, os.getpid())
    os.kill(call._pid, 9)
    assert call.result() == "here"


@needs_fork
def test_cancel_stops_the_child() -> None:
    call = ForkedCall(time.sleep, 60)
    t0 = time.monotonic()
    call.cancel()
    assert time.monotonic() - t0 < 10


@needs_fork
@pytest.mark.parametrize("name", ["gpt-cpu-bs8", "synthetic"])
def test_plain_load_forked_equals_plain_load_here(tmp_path, name) -> None:
    root = (write_synthetic_trace(tmp_path / "s", SyntheticModel(layers=40, batch_size=4, seed=3))
            if name == "synthetic" else SAMPLE / name)
    args = (root, TENSOR_COLUMNS, TRACE_COLUMNS, FIELD_LIMIT, "nooverlap")
    here = plain_module.plain_load(*args, fork_min_bytes=1 << 60)
    forked = plain_module.plain_load(*args, fork_min_bytes=0)
    assert here is not None and forked is not None
    assert forked[:2] == here[:2]
    for a, b in zip(vars(forked[2]).values(), vars(here[2]).values()):
        assert (a == b).all() if hasattr(a, "all") else a == b


def _renumbered(src: Path, dst: Path, seed: int) -> Path:
    """A copy of a trace with its tensor IDs renumbered in a shuffled order (plain integers still)."""
    import csv
    import random
    import shutil

    shutil.copytree(src, dst)
    tensors = list(csv.reader((dst / "tensor.csv").open(newline="")))
    ids = sorted({row[1] for row in tensors[1:]}, key=int)
    new = dict(zip(ids, map(str, random.Random(seed).sample(range(1, 10 * len(ids)), len(ids)))))
    for row in tensors[1:]:
        row[1] = new[row[1]]
    ops = list(csv.reader((dst / "trace.csv").open(newline="")))
    for row in ops[1:]:
        for col in (2, 3):
            inner = row[col].strip("[]")
            row[col] = "[" + "; ".join(new[t.strip()] for t in inner.split(";")) + "]" if inner.strip() else "[]"
    for name, rows in (("tensor.csv", tensors), ("trace.csv", ops)):
        with (dst / name).open("w", newline="") as fh:
            csv.writer(fh).writerows(rows)
    return dst


@pytest.mark.parametrize("name", ["gpt-cpu-bs8", "synthetic"])
def test_the_plain_reader_matches_ids_in_any_order(tmp_path, name) -> None:
    """Tensor IDs neither sorted nor in row order, on one row each (synthetic) or several (GPT):
    the plain reader still gives what the checker gives."""
    from triosim.trace.load import _load_ops, _load_tensors

    src = (write_synthetic_trace(tmp_path / "s", SyntheticModel(layers=6, batch_size=4, seed=3))
           if name == "synthetic" else SAMPLE / name)
    root = _renumbered(src, tmp_path / "renumbered", seed=11)
    got = plain_module.plain_load(root, TENSOR_COLUMNS, TRACE_COLUMNS, FIELD_LIMIT, "nooverlap")
    assert got is not None
    tensors = _load_tensors(root / "tensor.csv")
    assert got[:2] == (tensors, _load_ops(root / "trace.csv", tensors, "nooverlap"))


def _handlers() -> tuple:
    import signal

    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


@needs_fork
def test_the_child_does_not_run_the_parents_signal_handlers() -> None:
    import signal

    def handler(signum, frame):  # what a sweep installs: it writes partial results
        raise AssertionError("the parent's handler ran in the child")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        term, _ = ForkedCall(_handlers).result()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert term == signal.SIG_DFL


@needs_fork
def test_a_call_forked_from_another_thread_still_works() -> None:
    import threading

    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("r", ForkedCall(_pid_and, 4).result()))
    thread.start()
    thread.join(60)
    assert out["r"][1] == 8


def test_a_refused_fork_runs_the_call_here(monkeypatch) -> None:
    def refuse():
        raise DeprecationWarning("fork() in a multi-threaded process")  # what -W error makes of it

    monkeypatch.setattr(forked_module.os, "fork", refuse)
    assert ForkedCall(_pid_and, 5).result() == (os.getpid(), 10)
