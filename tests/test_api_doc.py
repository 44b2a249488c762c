"""docs/api.md runs as written: its Python blocks, in order, print exactly its output blocks."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
BLOCK = re.compile(r"```(python|output)\n(.*?)```", re.S)


def cells(text: str) -> list[tuple[str, str | None]]:
    """(code, expected output or None) for each Python block of the page."""
    out: list[tuple[str, str | None]] = []
    for kind, body in BLOCK.findall(text):
        if kind == "python":
            out.append((body, None))
        elif out and out[-1][1] is None:
            out[-1] = (out[-1][0], body)
        else:
            raise AssertionError("an output block that follows no Python block")
    return out


def run_cells(text: str) -> list[tuple[str, str]]:
    """(printed, expected) for every cell that has an output block; cells share one namespace."""
    namespace: dict = {}
    checked = []
    for code, expected in cells(text):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, str(DOC), "exec"), namespace)
        if expected is not None:
            checked.append((printed.getvalue(), expected))
    return checked


def test_the_api_page_prints_what_it_shows() -> None:
    checked = run_cells(DOC.read_text(encoding="utf-8"))
    assert len(checked) >= 8
    for printed, expected in checked:
        assert printed == expected


def test_a_stale_output_block_is_caught() -> None:
    text = DOC.read_text(encoding="utf-8").replace("16 160 ops timed", "16 161 ops timed")
    with pytest.raises(AssertionError):
        for printed, expected in run_cells(text):
            assert printed == expected
