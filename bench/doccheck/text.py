"""Comparing a doc's copy of a command's output with a fresh one.

An expected block is compared line by line after *canonical* clean-up of both sides: trailing
spaces, wall-clock durations (``estimated in 0.3 s``) and absolute paths do not count. A line
that is only ``…`` (or ``...``) is a gap: the lines between gaps are segments that must appear,
in order, as consecutive lines of the output. Without a gap a block is the whole output, unless
its claim is an excerpt (a region of a page, or ``[excerpt]``): then it is one segment.

Where a segment is not in the output, the fresh lines it stands for are found by its *shape*
(numbers and the widths of rich's columns ignored), so that ``--update`` can rewrite it.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

GAP = {"…", "..."}
DURATION = re.compile(r"\b\d+(?:\.\d+)? ?(s|min)\b(?= |,|\)|;|$)")  # wall clock: "estimated in 0.3 s"
DIGITS = re.compile(r"[-+\u2212]?\d[\d,.]*")  # any number, glued to a word or not (dp4×tp2)
BOX_RUNS = re.compile(r"([─━═┄╌\-])\1+")


def canon(line: str) -> str:
    return DURATION.sub("<time>", line.rstrip())


def shape(line: str) -> str:
    text = DIGITS.sub("#", canon(line))
    return re.sub(r"\s+", " ", BOX_RUNS.sub(r"\1", text)).strip()


def trim(lines: list[str]) -> list[str]:
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


@dataclass
class Window:
    """One expected segment and where it is (or should be) in the output."""

    first: int  # index of the segment's first line among the expected lines
    count: int
    fresh: list[str] | None  # the output's lines for it; None when it cannot be found
    same: bool


def segments(expected: list[str]) -> list[tuple[int, int]]:
    out, start = [], 0
    for i, line in enumerate(expected + ["…"]):
        if line.strip() in GAP:
            if i > start:
                out.append((start, i - start))
            start = i + 1
    return out


def compare(expected: list[str], output: str, whole: bool) -> list[Window]:
    """Where each segment of ``expected`` is in ``output``, and whether it is there unchanged."""
    fresh = trim(output.splitlines())
    has_gap = any(line.strip() in GAP for line in expected)
    if whole and not has_gap:
        same = [canon(x) for x in trim(expected)] == [canon(x) for x in fresh]
        return [Window(0, len(expected), fresh, same)]
    windows, cursor = [], 0
    fresh_canon = [canon(x) for x in fresh]
    fresh_shape = [shape(x) for x in fresh]
    for first, count in segments(expected):
        want = [canon(x) for x in expected[first : first + count]]
        want_shape = [shape(x) for x in want]
        found = _find(fresh_canon, want, cursor) if want else cursor
        same = found is not None
        if found is None:
            found = _find(fresh_shape, want_shape, cursor)
        if found is None:
            found = _find(fresh_shape, want_shape[:1], cursor)
        if found is None:
            found = _most_like(fresh_shape, want_shape[0], cursor)
        if found is None:
            windows.append(Window(first, count, None, False))
            continue
        windows.append(Window(first, count, fresh[found : found + count], same))
        cursor = found + count
    return windows


def _find(haystack: list[str], needle: list[str], start: int) -> int | None:
    for i in range(start, len(haystack) - len(needle) + 1):
        if haystack[i : i + len(needle)] == needle:
            return i
    return None


def _most_like(haystack: list[str], line: str, start: int, least: float = 0.6) -> int | None:
    """The line after ``start`` most like ``line`` (a unit or a word changed too), if any is."""
    ratios = [(difflib.SequenceMatcher(None, line, h).ratio(), -i) for i, h in enumerate(haystack) if i >= start]
    best = max(ratios, default=(0.0, 0))
    return -best[1] if best[0] >= least else None


def difference(expected: list[str], fresh: list[str], limit: int = 12) -> str:
    """A short unified diff, doc (-) against the fresh output (+)."""
    diff = list(difflib.unified_diff([canon(x) for x in expected], [canon(x) for x in fresh],
                                     "doc", "fresh", n=0, lineterm=""))[2:]
    diff = [d for d in diff if not d.startswith("@@")]
    more = len(diff) - limit
    return "\n".join(diff[:limit] + ([f"... {more} more lines"] if more > 0 else []))
