"""The documentation stands alone: no citations of files that are not in the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Design notes and the original's question list live outside the repository; so do its traces.
CITATION = re.compile(r"DESIGN\b|ORIGINAL\.md|§\s?\d|\bQ\d{1,2}\b|\.\./shared|shared/reference")


def user_facing_files(root: Path = REPO) -> list[Path]:
    files = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    files += sorted((root / "triosim").rglob("*.py")) + sorted((root / "tracer").rglob("*.py"))
    return [f for f in files if f.is_file()]


def citations(files: list[Path]) -> list[str]:
    out = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), start=1):
            if CITATION.search(line):
                out.append(f"{f.name}:{n}: {line.strip()}")
    return out


def test_docs_help_and_docstrings_cite_nothing_outside_the_repository() -> None:
    assert citations(user_facing_files()) == []


@pytest.mark.parametrize("line", ["as DESIGN §5.1 says", "see ORIGINAL.md Q21", "read ../shared/reference/x"])
def test_the_check_catches_a_planted_citation(tmp_path: Path, line: str) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# fine\n")
    (tmp_path / "docs" / "x.md").write_text(f"text\n{line}\n")
    assert citations(user_facing_files(tmp_path)) == [f"x.md:2: {line}"]
