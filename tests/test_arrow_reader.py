"""The pyarrow reader of traces: what it reads equals the row-by-row checker's result, and what
it is not sure to read alike it leaves to the checker."""

from __future__ import annotations

import csv
import random
import shutil
import sys
from pathlib import Path

import pytest

import triosim.trace.arrow_reader as arrow_module
from triosim.errors import TriosimError
from triosim.trace import load_trace
from triosim.trace.checker import load_ops, load_tensors
from triosim.trace.model import FIELD_LIMIT
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

SAMPLE = Path(__file__).resolve().parents[1] / "sample_trace"


def _checked(root: Path):
    tensors = load_tensors(root / "tensor.csv")
    return tensors, load_ops(root / "trace.csv", tensors, "nooverlap")


def test_the_white_space_is_what_str_strip_removes() -> None:
    assert arrow_module.WHITESPACE == "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())


@pytest.mark.parametrize("name", ["gpt-cpu-bs8", "gpt-h16-cpu-bs8", "resnet18-cpu-bs16"])
def test_sample_traces_read_as_the_checker_reads_them(name) -> None:
    got = arrow_module.arrow_load(SAMPLE / name, FIELD_LIMIT, "nooverlap")
    assert got is not None
    assert got[:2] == _checked(SAMPLE / name)


def _renumbered(src: Path, dst: Path, seed: int, spell=str) -> Path:
    """A copy of a trace with its tensor IDs renumbered in a shuffled order (``spell``: how a
    number is written as an ID; plain integers by default)."""
    shutil.copytree(src, dst)
    tensors = list(csv.reader((dst / "tensor.csv").open(newline="")))
    ids = sorted({row[1] for row in tensors[1:]}, key=int)
    new = dict(zip(ids, map(spell, random.Random(seed).sample(range(1, 10 * len(ids)), len(ids)))))
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
def test_the_reader_matches_ids_in_any_order(tmp_path, name) -> None:
    """Tensor IDs neither sorted nor in row order, on one row each (synthetic) or several (GPT):
    the pyarrow reader still gives what the checker gives."""
    src = (write_synthetic_trace(tmp_path / "s", SyntheticModel(layers=6, batch_size=4, seed=3))
           if name == "synthetic" else SAMPLE / name)
    root = _renumbered(src, tmp_path / "renumbered", seed=11)
    got = arrow_module.arrow_load(root, FIELD_LIMIT, "nooverlap")
    assert got is not None
    assert got[:2] == _checked(root)


@pytest.mark.parametrize("spell", [lambda n: f"t{n}", lambda n: f"0{n}", lambda n: str(n * 10**12)],
                         ids=["named", "leading zero", "far apart"])
def test_ids_that_are_not_small_plain_numbers_are_matched_as_text(tmp_path, spell) -> None:
    """IDs the table of numbers cannot take (names, a leading zero, numbers far apart) are
    matched as strings, with the checker's result."""
    root = _renumbered(SAMPLE / "gpt-cpu-bs8", tmp_path / "renamed", seed=5, spell=spell)
    got = arrow_module.arrow_load(root, FIELD_LIMIT, "nooverlap")
    assert got is not None
    assert got[:2] == _checked(root)


def test_an_id_written_with_a_leading_zero_is_not_the_number(tmp_path) -> None:
    """Tensor "07" is not tensor "7": the checker rejects an op that lists "7", and so the
    reader leaves the files to it."""
    root = _renumbered(SAMPLE / "gpt-cpu-bs8", tmp_path / "renamed", seed=5)
    tensors = list(csv.reader((root / "tensor.csv").open(newline="")))
    ops = list(csv.reader((root / "trace.csv").open(newline="")))
    first = ops[1][3].strip("[]").split(";")[0].strip()
    for row in tensors[1:]:
        if row[1] == first:
            row[1] = "0" + first
    with (root / "tensor.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows(tensors)
    assert arrow_module.arrow_load(root, FIELD_LIMIT, "nooverlap") is None
    with pytest.raises(TriosimError, match="does not define"):
        load_trace(root, batch_size=8, fast=True)


def test_times_are_read_as_pythons_float_reads_them(tmp_path) -> None:
    """Times with long mantissas and exponents: pyarrow's double is Python's float(), bit for bit."""
    root = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=40, batch_size=4, seed=1))
    rows = list(csv.reader((root / "trace.csv").open(newline="")))
    rng = random.Random(4)
    for row in rows[1:]:
        whole = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 8)))
        fraction = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25)))
        row[4] = row[5] = whole + "." + fraction + rng.choice(["", "e-3", "E+2", "e0"])
    with (root / "trace.csv").open("w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    got = arrow_module.arrow_load(root, FIELD_LIMIT, "span")
    assert got is not None
    want = _checked(root)[1]
    assert [(op.duration_s, op.span_s) for op in got[1]] == [(op.span_s, op.span_s) for op in want]
    assert got[1] == [op._replace(duration_s=op.span_s) for op in want]


def _edit(path: Path, change) -> None:
    path.write_bytes(change(path.read_bytes()))


# Legal CSV (the checker reads it) that the pyarrow reader leaves to the checker.
DECLINED = {
    "blank line": ("trace.csv", lambda b: b.replace(b"\n", b"\n\n", 3)),
    "line break in a quoted cell": ("trace.csv", lambda b: b.replace(b",aten::linear,", b',"aten::\nlinear",', 1)),
    "space before a quote": ("tensor.csv", lambda b: b.replace(b',"[', b', "[', 1)),
    "lone carriage return": ("trace.csv", lambda b: b.replace(b"\n", b"\r", 2)),
    "extra cell": ("trace.csv", lambda b: b.replace(b"\n", b",extra\n", 2).replace(b",extra\n", b"\n", 1)),
    "quoted header": ("tensor.csv", lambda b: b.replace(b"TensorShape", b'"TensorShape"', 1)),
    "a size written 2.0": ("tensor.csv", lambda b: b.replace(b",4,weight,", b",4.0,weight,", 1)),
}


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_unusual_files_are_left_to_the_checker(tmp_path, case) -> None:
    root = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=3, batch_size=4, seed=2))
    name, change = DECLINED[case]
    before = (root / name).read_bytes()
    _edit(root / name, change)
    assert (root / name).read_bytes() != before
    assert arrow_module.arrow_load(root, FIELD_LIMIT, "nooverlap") is None

    def load(fast: bool):
        try:
            return load_trace(root, batch_size=4, fast=fast)
        except TriosimError as exc:
            return f"error: {exc}"

    assert load(True) == load(False)


def test_a_cell_over_the_field_limit_is_left_to_the_checker(tmp_path) -> None:
    root = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=3, batch_size=4, seed=2))
    assert arrow_module.arrow_load(root, 40, "nooverlap") is None
    assert arrow_module.arrow_load(root, FIELD_LIMIT, "nooverlap") is not None


def test_quoted_tensor_ids_are_read_as_the_checker_reads_them(tmp_path) -> None:
    """``['1'; "2"]``: the checker strips the quotes around each ID, and so does the reader."""
    root = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=3, batch_size=4, seed=2))
    _edit(root / "trace.csv", lambda b: b.replace(b"[", b"['", 1).replace(b";", b"';", 1))
    got = arrow_module.arrow_load(root, FIELD_LIMIT, "nooverlap")
    assert got is not None and got[:2] == _checked(root)


def test_reading_does_not_import_pandas() -> None:
    """pyarrow imports pandas when handed a Python value (a sixth of a second): the reader never does."""
    import subprocess

    code = ("import sys; from triosim.trace import load_trace; "
            f"load_trace({str(SAMPLE / 'gpt-cpu-bs8')!r}, batch_size=8, fast=True); print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
