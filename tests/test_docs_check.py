"""The docs show what triosim prints: their cheap claims re-run, and a planted stale number caught.

bench/check_docs.py checks every claim (docs/writing-docs.md); these tests run the ones not
marked [slow] and show that the checker reports a stale number and a stale output line and that
``--update`` writes the fresh ones back.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from doccheck.checker import apply_edits, check, doc_pages, find_claims, update  # noqa: E402
from doccheck.claims import Page  # noqa: E402
from doccheck.numbers import ClaimError, DocNumber, value_of  # noqa: E402
from doccheck.runner import Runner  # noqa: E402
from doccheck.tables import TableClaim  # noqa: E402


@pytest.fixture(scope="module")
def runner():
    with Runner(REPO) as r:
        yield r


def page_of(text: str, name: str = "docs/x.md") -> Page:
    return Page(Path(name), name, text.splitlines())


def copy_docs(root: Path) -> Path:
    (root / "docs").mkdir(parents=True)
    shutil.copy(REPO / "README.md", root / "README.md")
    for f in (REPO / "docs").glob("*.md"):
        shutil.copy(f, root / "docs" / f.name)
    return root


def test_every_claim_parses_and_runs_only_triosim_or_bench_scripts() -> None:
    claims = [c for p in doc_pages(REPO) for c in find_claims(p)]
    assert len(claims) >= 60
    for claim in claims:
        for command in claim.commands():
            assert command.split()[0] in ("triosim", "python"), (claim.where, command)
            assert "bench/" in command or command.startswith("triosim"), (claim.where, command)


def test_the_cheap_doc_claims_hold(runner) -> None:
    """Every claim not marked [slow] (the lead rewrites drifted docs with check_docs.py --update)."""
    claims = [c for p in doc_pages(REPO) for c in find_claims(p)]
    report = check(claims, runner, fast=True)
    problems = [f"{d.where}: {d.doc} -> {d.fresh}  $ {d.command}" for d in report.drifts]
    problems += [f"{o.claim.where}: {o.error}" for o in report.errors]
    if problems:
        pytest.fail("the docs no longer show what triosim prints (python bench/check_docs.py --update, "
                    "then read the diff):\n" + "\n".join(problems), pytrace=False)
    assert sum(o.checked for o in report.outcomes) >= 100


def test_a_planted_stale_number_is_reported_and_updated(tmp_path: Path, runner) -> None:
    """A stale number (in the text and its claim, as a page left behind has it) is reported with
    its line, its fresh value and the command, and --update writes the fresh value back."""
    root = copy_docs(tmp_path)
    page = root / "README.md"
    original = page.read_text(encoding="utf-8")
    assert original.count("682.36") == 2  # the claim's comment and the sentence
    planted = original.replace("682.36", "682.61")
    page.write_text(planted, encoding="utf-8")
    report = check(claims_of(root, "README.md", "triosim run -q"), runner)
    line = next(n for n, text in enumerate(planted.splitlines(), 1) if "the CPU's 682.61 ms" in text)
    assert [(d.where, d.doc, d.fresh, d.command) for d in report.drifts] == [
        (f"README.md:{line}", "682.61", "682.36", "triosim run -q")]
    update(report)
    assert page.read_text(encoding="utf-8") == original
    assert check(claims_of(root, "README.md", "triosim run -q"), runner).drifts == []


def claims_of(root: Path, name: str, command: str) -> list:
    (page,) = [p for p in doc_pages(root) if p.name == name]
    return [c for c in find_claims(page) if command in c.commands()]


def test_a_planted_stale_output_line_is_reported_and_updated(tmp_path: Path, runner) -> None:
    root = copy_docs(tmp_path)
    page = root / "docs" / "gpus.md"
    original = page.read_text(encoding="utf-8")
    row = next(line for line in original.splitlines() if line.startswith(" h100-sxm  │"))
    page.write_text(original.replace(row, row.replace("3,350", "3,305")), encoding="utf-8")
    claims = claims_of(root, "docs/gpus.md", "triosim gpus")
    report = check(claims, runner)
    assert len(report.drifts) == 1 and "-" + row.replace("3,350", "3,305") in report.drifts[0].note
    update(report)
    assert page.read_text(encoding="utf-8") == original


def test_a_planted_stale_table_cell_is_reported(tmp_path: Path, runner) -> None:
    text = ("<!-- doc-table:\nlet RUN = triosim run {1}\ncol 2: {RUN} -q => out\n-->\n"
            "| flags | ms |\n|---|---:|\n| `-batch-size-sim 16` | **682.36** |\n| `-batch-size-sim 8` | 1.00 |\n")
    page = page_of(text)
    (claim,) = find_claims(page)
    assert isinstance(claim, TableClaim) and len(claim.checks) == 2
    report = check([claim], runner)
    assert [(d.doc, d.fresh) for d in report.drifts] == [("1.00", f"{float(runner.run('triosim run -batch-size-sim 8 -q').stdout):.2f}")]
    fixed = apply_edits(page.lines, report.outcomes[0].edits)
    assert fixed[7] == f"| `-batch-size-sim 8` | {report.drifts[0].fresh} |" and fixed[6] == page.lines[6]


def test_a_slash_list_runs_the_template_once_per_item() -> None:
    page = page_of("<!-- doc-table: col 2: triosim run -GPUnumber {1} -case 2 -q => out -->\n"
                   "| GPUs | ms |\n|---|---|\n| 2 / 4 | 1.0 / 2.0 |\n")
    (claim,) = find_claims(page)
    assert [(c.command, c.index) for c in claim.checks] == [
        ("triosim run -GPUnumber 2 -case 2 -q", 0), ("triosim run -GPUnumber 4 -case 2 -q", 1)]


def test_values_are_written_as_the_doc_writes_them() -> None:
    assert DocNumber("3,130.07").format(3756.7225) == "3,756.72"
    assert DocNumber("813.97").format(1023.456) == "1,023.46"
    assert DocNumber("94.219222892").format(94.2) == "94.200000000"
    assert DocNumber("\u22127.9").format(-8.04) == "\u22128.0" and DocNumber("+0.1").format(2.0) == "+2.0"
    assert DocNumber("1.2e-15").format(3.04e-16) == "3.0e-16"
    assert DocNumber("84.9226842295").agrees(84.92268423, cap=9)
    assert not DocNumber("84.9226842295").agrees(84.92268433, cap=9)
    assert DocNumber("3,782.4").agrees(3782.444) and not DocNumber("3,782.4").agrees(3782.46)


def test_keys_read_json_paths_expressions_and_patterns() -> None:
    out = '{"a": {"b": 3}, "per_gpu": [{"gpu": 0, "x": 5}, {"gpu": 1, "x": 7}]}'
    assert value_of("a.b", out) == 3 and value_of("per_gpu[gpu=1].x*2", out) == 14
    assert value_of("=(a.b + per_gpu.0.x) / 4", out) == 2
    assert value_of("`Iteration time: ([\\d.]+) ms`", "Iteration time: 5.6625 ms") == 5.6625
    with pytest.raises(ClaimError):
        value_of("a.c", out)


def test_a_writing_command_stays_in_the_sandbox(runner) -> None:
    result = runner.run("triosim dag -case 4 -GPUnumber 2 --export dag.dot")
    assert result.code == 0 and (runner.sandbox / "dag.dot").is_file()
    assert not (REPO / "dag.dot").exists()


def test_a_claim_whose_values_are_not_in_its_text_is_an_error(runner) -> None:
    page = page_of("<!-- doc-check: triosim run -q => 682.36 -->\nThe CPU takes 682.35 ms.\n")
    report = check(find_claims(page), runner)
    assert len(report.errors) == 1 and "682.36" in report.errors[0].error
