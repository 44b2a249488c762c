"""The parts of a Markdown page that claims are made of: fenced blocks, comments, tables.

Only what the docs use is read: fences of three or more backquotes (indented or not), HTML
comments that start a line, and pipe tables (a header row, a ``---`` row, data rows).
Positions are 0-based line indices and, inside a line, character offsets, so that a claim can
rewrite exactly the characters it owns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FENCE = re.compile(r"^(\s*)(`{3,})(.*)$")
COMMENT_START = re.compile(r"^\s*<!--\s*(/?doc-check|doc-table|doc-let)(\[[^\]]*\])?\s*(:)?")


@dataclass(frozen=True)
class Fence:
    start: int  # the opening line
    end: int  # the closing line (len(lines) when unclosed)
    lang: str
    indent: str

    @property
    def body(self) -> range:
        return range(self.start + 1, self.end)


@dataclass(frozen=True)
class Comment:
    start: int
    end: int  # the line holding ``-->``
    tag: str  # doc-check, /doc-check, doc-table or doc-let
    options: dict[str, str]
    body: str


@dataclass(frozen=True)
class Cell:
    line: int
    start: int  # offsets of the cell's text in its line
    end: int
    text: str

    @property
    def plain(self) -> str:
        """What a table template's ``{N}`` stands for: the cell's code spans, else its text."""
        spans = re.findall(r"`([^`]*)`", self.text)
        if spans:
            return " ".join(s.strip() for s in spans)
        return self.text.replace("**", "").strip()


@dataclass(frozen=True)
class Table:
    header: list[Cell]
    rows: list[list[Cell]]
    start: int
    end: int  # the line after the table


def fences(lines: list[str]) -> list[Fence]:
    out, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        ticks = opening.group(2)
        j = i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if closing and closing.group(2).startswith(ticks) and not closing.group(3).strip():
                break
            j += 1
        out.append(Fence(i, j, opening.group(3).strip(), opening.group(1)))
        i = j + 1
    return out


def fenced_lines(blocks: list[Fence]) -> set[int]:
    return {n for b in blocks for n in range(b.start, b.end + 1)}


def parse_options(text: str | None) -> dict[str, str]:
    """``[slow, columns=132]`` -> {"slow": "", "columns": "132"}."""
    options: dict[str, str] = {}
    for part in (text or "").strip("[]").split(","):
        if part.strip():
            name, _, value = part.partition("=")
            options[name.strip()] = value.strip()
    return options


def comments(lines: list[str], inside_fences: set[int]) -> list[Comment]:
    out, i = [], 0
    while i < len(lines):
        start = COMMENT_START.match(lines[i]) if i not in inside_fences else None
        if not start:
            i += 1
            continue
        j = i
        while "-->" not in lines[j]:
            j += 1
            if j == len(lines):
                raise ValueError(f"line {i + 1}: a doc-check comment that never ends (no -->)")
        text = "\n".join(lines[i : j + 1])
        body = text[start.end() :].rsplit("-->", 1)[0]
        out.append(Comment(i, j, start.group(1), parse_options(start.group(2)), body.strip()))
        i = j + 1
    return out


def split_row(line: str, number: int) -> list[Cell]:
    """The cells of a table row, with their offsets (pipes in code spans or escaped are text)."""
    bounds, in_code, k = [], False, 0
    while k < len(line):
        ch = line[k]
        if ch == "\\":
            k += 2
            continue
        if ch == "`":
            in_code = not in_code
        elif ch == "|" and not in_code:
            bounds.append(k)
        k += 1
    cells = []
    for a, b in zip(bounds, bounds[1:]):
        raw = line[a + 1 : b]
        lead = len(raw) - len(raw.lstrip())
        text = raw.strip()
        cells.append(Cell(number, a + 1 + lead, a + 1 + lead + len(text), text))
    return cells


def table_after(lines: list[str], index: int) -> Table:
    """The pipe table that starts at the first non-blank line at or after ``index``."""
    i = index
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i + 1 >= len(lines) or not lines[i].lstrip().startswith("|") or "---" not in lines[i + 1]:
        raise ValueError(f"line {index + 1}: a doc-table comment must be followed by a table")
    end = i + 2
    while end < len(lines) and lines[end].lstrip().startswith("|"):
        end += 1
    rows = [split_row(lines[n], n) for n in range(i + 2, end)]
    return Table(split_row(lines[i], i), rows, i, end)
