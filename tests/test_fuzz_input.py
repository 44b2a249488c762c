"""Fuzzing the trace files: any bytes or cell values give exit code 0 or 2, never a traceback,
and exit 2 comes with exactly one line on stderr; the fast (pyarrow) reader returns exactly what
the row-by-row checker returns.

Hypothesis mutates a small synthetic trace: a cell of trace.csv or tensor.csv replaced by a
hostile value, a row cut short, bytes inserted, deleted or overwritten, or meta.json rewritten. The seed is
fixed and the number of examples bounded, so the test takes seconds. Each property comes with a
planted bug it must catch. A second strategy (:func:`consistency_mutations`) aims at the rules
across cells: two ops swapped (a tensor read before it is written, a 2-cycle), an OperatorID
given twice, a size list or a busy time changed to another valid number, a TensorType misspelt.
"""

from __future__ import annotations

import csv
import io
import os
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import triosim.trace.arrow_reader as arrow_module
import triosim.trace.checker as checker_module
import triosim.trace.model as model_module
from triosim.cli.console import main
from triosim.errors import TriosimError
from triosim.trace import load_trace
from triosim.trace.model import FIELD_LIMIT
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

HOSTILE = ["", " ", "nan", "NaN", "inf", "-inf", "1e400", "-1", "0", "1.5", "2.0", "1e3", str(2**63), str(2**53),
           "9" * 40, "abc", "[", "]", "[]", "[1;;2]", "[1; 2]", "['3']", "[inf]", "[1.5]", "[-4]", "\"", "forward",
           "backward", "optimizer", "weight", "bias", "1", "2", "3", "x" * 50]
FILES = ("trace.csv", "tensor.csv")


def _base(tmp: Path) -> Path:
    return write_synthetic_trace(tmp / "t", SyntheticModel(layers=2, batch_size=4, seed=5))


@st.composite
def mutations(draw, lines: bool = False):
    """A mutation; ``lines`` adds blank lines and cells holding a line break (legal CSV whose
    records are not one a line, which the pyarrow reader must leave to the checker)."""
    kind = draw(st.sampled_from(["cell", "cell", "bytes", "cut", "meta"] + (["lines", "lines"] if lines else [])))
    if kind == "lines":
        return ("lines", draw(st.sampled_from(FILES)), draw(st.integers(0, 12)), draw(st.sampled_from(["blank", "break"])))
    if kind == "cut":  # a row that lost its last fields (a truncated write)
        return ("cut", draw(st.sampled_from(FILES)), draw(st.integers(0, 12)), draw(st.integers(1, 3)))
    if kind == "cell":
        value = draw(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12)))
        return ("cell", draw(st.sampled_from(FILES)), draw(st.integers(0, 12)), draw(st.integers(0, 10)), value)
    if kind == "bytes":
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        return ("bytes", draw(st.sampled_from(FILES)), op, draw(st.integers(0, 10_000)),
                draw(st.binary(min_size=1, max_size=6)))
    value = draw(st.sampled_from(['{"batch_size": "abc"}', '{"batch_size": null}', '{"batch_size": NaN}',
                                  '{"batch_size": 1e400}', '{"batch_size": -3}', '{"batch_size": 4.5}', "[4]",
                                  '{"batch_size": 8}', "{", '{"batch_size": true}']))
    return ("meta", value)


def apply(d: Path, m: tuple) -> None:
    if m[0] == "cell":
        _, name, row, col, value = m
        rows = list(csv.reader(io.StringIO((d / name).read_text())))
        r = rows[1 + row % (len(rows) - 1)]
        r[col % len(r)] = value
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        (d / name).write_text(buf.getvalue())
    elif m[0] == "cut":
        _, name, row, n = m
        lines = (d / name).read_text().split("\n")
        i = 1 + row % (len(lines) - 2)
        lines[i] = ",".join(lines[i].split(",")[:-n])
        (d / name).write_text("\n".join(lines))
    elif m[0] == "lines":
        _, name, row, how = m
        if how == "blank":
            lines = (d / name).read_text().split("\n")
            lines.insert(1 + row % (len(lines) - 1), "")
            (d / name).write_text("\n".join(lines))
        else:  # a line break inside a (quoted) cell the checker accepts any text in
            rows = list(csv.reader(io.StringIO((d / name).read_text())))
            col = rows[0].index("OperatorName" if name == "trace.csv" else "TensorShape")
            r = rows[1 + row % (len(rows) - 1)]
            r[col] = r[col] + "\nx"
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(rows)
            (d / name).write_text(buf.getvalue())
    elif m[0] == "bytes":
        _, name, op, pos, data = m
        raw = (d / name).read_bytes()
        pos %= len(raw)
        if op == "insert":
            raw = raw[:pos] + data + raw[pos:]
        elif op == "delete":
            raw = raw[:pos] + raw[pos + len(data):]
        else:
            raw = raw[:pos] + data + raw[pos + len(data):]
        (d / name).write_bytes(raw)
    else:
        (d / "meta.json").write_text(m[1])


@st.composite
def consistency_mutations(draw):
    """A change that keeps every cell valid on its own but may break a rule across cells."""
    kind = draw(st.sampled_from(["swap", "same id", "size", "busy", "type"]))
    row, other = draw(st.integers(0, 12)), draw(st.integers(0, 12))
    if kind == "size":
        value = draw(st.sampled_from(["[]", "[1]", "[172]", "[156; 1677; 43]", "[8; 8]", "[43; 1677; 156]"]))
        return ("cell", "trace.csv", row, draw(st.sampled_from([6, 7])), value)
    if kind == "busy":
        return ("busy", row, draw(st.sampled_from([0.0, 0.001, 0.0015, 0.002, 1.0, 1e3])))
    if kind == "type":
        value = draw(st.sampled_from(["wieght", "bais", "weights", "Weight", "bias=None", "12", "a b", "save_mean", ""]))
        return ("cell", "tensor.csv", row, 5, value)
    return ("order", row, other, kind == "swap")


def apply_consistency(d: Path, m: tuple) -> None:
    if m[0] == "cell":
        apply(d, m)
        return
    rows = list(csv.reader(io.StringIO((d / "trace.csv").read_text())))
    if m[0] == "busy":  # the busy time set to the span plus a little
        r = rows[1 + m[1] % (len(rows) - 1)]
        r[5] = repr(float(r[4]) + m[2])
    else:
        _, a, b, swap = m
        a, b = 1 + a % (len(rows) - 1), 1 + b % (len(rows) - 1)
        if swap:
            rows[a], rows[b] = rows[b], rows[a]
        else:
            rows[a][0] = rows[b][0]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    (d / "trace.csv").write_text(buf.getvalue())


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
        except Exception as exc:  # what the user would see as a traceback
            raise AssertionError(f"traceback: {type(exc).__name__}: {exc}") from exc
    return code, err.getvalue()


def _fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _base(tmp_path_factory.mktemp("fuzz"))


def check_cli_on(d: Path, counts: Counter) -> None:
    code, err = run_cli(["run", "-trace-dir", str(d), "-q"])
    counts[code] += 1
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("triosim: error: "), err


def check_fast_equals_checker(d: Path, counts: Counter) -> None:
    """The pyarrow reader (alone, and through load_trace) equals the checker."""
    def load(fast: bool):
        try:
            return load_trace(d, batch_size=4, fast=fast)
        except TriosimError as exc:
            return f"error: {exc}"

    slow, fast = load(False), load(True)
    counts["rejected" if isinstance(slow, str) else "accepted"] += 1
    assert fast == slow
    try:
        tensors = checker_module.load_tensors(d / "tensor.csv")
        checked = (tensors, checker_module.load_ops(d / "trace.csv", tensors, "nooverlap"))
    except TriosimError as exc:
        checked = f"error: {exc}"
    got = arrow_module.arrow_load(d, FIELD_LIMIT, "nooverlap")
    counts["arrow read"] += got is not None
    if got is not None:
        assert not isinstance(checked, str), f"the pyarrow reader accepted files the checker rejects: {checked}"
        assert got[:2] == checked, "pyarrow"


def _mutation_property(tmp_path_factory, check, counts: Counter, examples: int, seed_value: int,
                       lines: bool = False):
    """``check(trace dir, counts)`` on mutated copies of the small trace (fixed seed)."""
    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, report_multiple_bugs=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(mutations(lines=lines))
    def prop(m):
        d = _fresh(tmp_path_factory)
        apply(d, m)
        check(d, counts)

    return prop


def _cli_property(tmp_path_factory, counts: Counter, examples: int):
    return _mutation_property(tmp_path_factory, check_cli_on, counts, examples, 20261203)


def _fast_property(tmp_path_factory, counts: Counter, examples: int):
    return _mutation_property(tmp_path_factory, check_fast_equals_checker, counts, examples, 20261204, lines=True)


def test_fuzzed_traces_exit_0_or_2_with_one_line(tmp_path_factory) -> None:
    counts: Counter = Counter()
    _cli_property(tmp_path_factory, counts, examples=int(os.environ.get("TRIOSIM_FUZZ_EXAMPLES", "40")))()
    print(f"\nfuzz (CLI): {sum(counts.values())} runs, exit 0: {counts[0]}, exit 2: {counts[2]}")
    assert counts[2] > 0  # the mutations do reach the checks


def test_fast_reader_equals_the_row_by_row_checker(tmp_path_factory) -> None:
    counts: Counter = Counter()
    _fast_property(tmp_path_factory, counts, examples=int(os.environ.get("TRIOSIM_FUZZ_EXAMPLES", "40")) * 2)()
    print(f"\nfuzz (fast reader): {counts['accepted'] + counts['rejected']} traces, accepted: {counts['accepted']}, "
          f"rejected: {counts['rejected']}; read by pyarrow: {counts['arrow read']}")
    assert counts["accepted"] > 0 and counts["rejected"] > 0 and counts["arrow read"] > 0


def _consistency_property(tmp_path_factory, counts: Counter, examples: int):
    @seed(20261205)
    @settings(max_examples=examples, deadline=None, database=None, report_multiple_bugs=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(st.lists(consistency_mutations(), min_size=1, max_size=3))
    def prop(ms):
        d = _fresh(tmp_path_factory)
        for m in ms:
            apply_consistency(d, m)
        check_cli_on(d, counts)
        check_fast_equals_checker(d, counts)

    return prop


def test_fuzzed_cross_cell_rules_both_readers_agree(tmp_path_factory) -> None:
    counts: Counter = Counter()
    _consistency_property(tmp_path_factory, counts, examples=int(os.environ.get("TRIOSIM_FUZZ_EXAMPLES", "40")))()
    print(f"\nfuzz (order, IDs, sizes, times, types): {counts['accepted'] + counts['rejected']} traces, "
          f"CLI exit 0: {counts[0]}, exit 2: {counts[2]}; accepted: {counts['accepted']}, rejected: "
          f"{counts['rejected']}; read by pyarrow: {counts['arrow read']}")
    assert counts["accepted"] > 0 and counts["rejected"] > 0 and counts["arrow read"] > 0


# ----------------------------------------------------------------------------- planted bugs


def test_cli_property_catches_an_unchecked_number(tmp_path_factory, monkeypatch) -> None:
    """Planted bug: sizes parsed with the old int(float(text)), which overflows on 'inf'."""

    def old_whole(text: str):
        return int(float(text))

    monkeypatch.setattr(model_module, "_whole_number", old_whole)
    monkeypatch.setattr("triosim.checks.whole_number", old_whole)
    with pytest.raises(AssertionError, match="traceback"):
        _cli_property(tmp_path_factory, Counter(), examples=200)()


def test_fast_property_catches_a_reader_that_skips_the_line_count(tmp_path_factory, monkeypatch) -> None:
    """Planted bug: the pyarrow reader no longer checks that each record is one line (a cell
    holding a line break, a blank line: the ops' line numbers are then not the checker's)."""
    monkeypatch.setattr(arrow_module, "_one_record_a_line", lambda records, data: True)
    with pytest.raises(AssertionError):
        _fast_property(tmp_path_factory, Counter(), examples=300)()


def test_fast_property_catches_a_reader_that_skips_the_size_lists(tmp_path_factory, monkeypatch) -> None:
    """Planted bug: the pyarrow reader no longer checks InputSize and OutputSize (cells it does
    not keep, but which the checker rejects when they are not lists of sizes, or not the sizes
    of tensor.csv: both checks are skipped)."""
    monkeypatch.setattr(arrow_module, "_SIZE_LIST", ".*")
    monkeypatch.setattr(arrow_module, "_check_sizes", lambda *args: None)
    with pytest.raises(AssertionError):
        _fast_property(tmp_path_factory, Counter(), examples=300)()


def test_fast_property_catches_a_reader_that_keeps_edge_spaces(tmp_path_factory, monkeypatch) -> None:
    """Planted bug: the pyarrow reader no longer strips the cells (the checker strips them)."""
    monkeypatch.setattr(arrow_module, "_stripped", lambda column, ascii_only: column)
    with pytest.raises(AssertionError):
        _fast_property(tmp_path_factory, Counter(), examples=300)()


@pytest.mark.parametrize("planted", ["sizes", "busy", "ids", "types"])
def test_consistency_property_catches_a_reader_without_a_rule(tmp_path_factory, monkeypatch, planted) -> None:
    """Planted bugs: the pyarrow reader without one of the cross-cell rules (sizes against
    tensor.csv, busy time within the span, unique OperatorIDs, TensorType names)."""
    if planted == "sizes":
        monkeypatch.setattr(arrow_module, "_check_sizes", lambda *args: None)
    elif planted == "busy":
        monkeypatch.setattr(arrow_module, "_busy_over_span", lambda busy, span: False)
    elif planted == "ids":
        monkeypatch.setattr(arrow_module, "_unique", lambda op_ids: True)
    else:
        monkeypatch.setattr(arrow_module, "tensor_type_problem", lambda raw: None)
    with pytest.raises(AssertionError):
        _consistency_property(tmp_path_factory, Counter(), examples=300)()
