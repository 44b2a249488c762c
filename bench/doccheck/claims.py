"""The kinds of claim a page makes, what each checks and how ``--update`` rewrites it.

- ``ConsoleClaim``: a ```console block; each ``$ triosim ...`` (or ``$ python bench/...``) line,
  with ``\\`` continuations, and the lines up to the next ``$`` are a command and its output
  (the whole output, or segments between ``…`` lines). A command shown without output must
  succeed; a trailing shell comment ending in ``exit N`` expects that exit status.
- ``BlockClaim``: ``<!-- doc-check: COMMAND -->`` right before a fenced block: the block is
  the command's output (a ```json block: a part of its JSON, every number compared).
- ``RegionClaim``: ``<!-- doc-check: COMMAND -->`` ... ``<!-- /doc-check -->``: the lines
  between appear, consecutively, in the command's output (a table a bench script prints).
- ``ValueClaim``: ``<!-- doc-check: COMMAND => [KEY] VALUE; ... -->``: each VALUE is written, in
  that order, in the text that follows up to the next blank line (a paragraph or a table), and
  the run gives it (``numbers.value_of``).
- ``TableClaim`` (``tables``): ``<!-- doc-table: ... -->`` before a table: cells computed per
  row from a command template over the row's cells.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from . import text
from .markdown import Comment, Fence
from .numbers import (
    ClaimError,
    DocNumber,
    number_tokens,
    split_precision,
    value_of,
)

EXIT_COMMENT = re.compile(r"#.*\bexit (\d+)\s*$")


@dataclass
class Page:
    path: Path
    name: str  # as reported: README.md, docs/models.md
    lines: list[str]


@dataclass
class Drift:
    where: str
    doc: str
    fresh: str
    command: str
    note: str = ""
    fixable: bool = False  # --update can rewrite it


@dataclass(frozen=True)
class SpanEdit:
    line: int
    start: int
    end: int
    text: str


@dataclass(frozen=True)
class LinesEdit:
    first: int
    stop: int
    lines: tuple[str, ...]


@dataclass
class Verdict:
    checked: int = 0  # values or blocks compared
    drifts: list[Drift] = field(default_factory=list)
    edits: list = field(default_factory=list)


@dataclass
class Claim:
    page: Page
    line: int  # 0-based line where the claim starts
    options: dict[str, str]

    kind = "claim"

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line + 1}"

    @property
    def slow(self) -> bool:
        return "slow" in self.options

    @property
    def needs(self) -> str:
        return self.options.get("needs", "")

    def commands(self) -> list[str]:
        raise NotImplementedError

    def columns(self) -> int | None:
        """The terminal width the output is compared at (None: the claim reads numbers only)."""
        return int(self.options["columns"]) if "columns" in self.options else None

    def judge(self, results: dict, normalise) -> Verdict:
        raise NotImplementedError


def exit_ok(command: str, result, want: int, verdict: Verdict, where: str) -> bool:
    if result.code == want:
        return True
    tail = "\n".join(result.output.strip().splitlines()[-6:])
    verdict.drifts.append(Drift(where, f"exit {want}", f"exit {result.code}", command, tail))
    return False


def _compare_block(where_line: int, page: Page, command: str, expected_first: int, expected: list[str],
                   output: str, whole: bool, verdict: Verdict, indent: str = "") -> None:
    """Compare ``expected`` (lines of the page from ``expected_first``, in a block indented by
    ``indent``) with ``output``."""
    verdict.checked += 1
    expected = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in expected]
    for w in text.compare(expected, output, whole):
        if w.same:
            continue
        doc = expected[w.first : w.first + w.count]
        where = f"{page.name}:{expected_first + w.first + 1}"
        if w.fresh is None:
            verdict.drifts.append(Drift(where, doc[0], "(not in the output)", command,
                                        "output begins:\n" + "\n".join(output.splitlines()[:8])))
            continue
        verdict.drifts.append(Drift(where, f"{len(doc)} lines", f"{len(w.fresh)} lines", command,
                                    text.difference(doc, w.fresh), fixable=True))
        kept = [] if not whole else _trailing_blanks(doc)
        verdict.edits.append(LinesEdit(expected_first + w.first, expected_first + w.first + w.count,
                                       tuple((indent + line).rstrip() for line in w.fresh + kept)))


def _trailing_blanks(lines: list[str]) -> list[str]:
    blanks = 0
    for line in reversed(lines):
        if line.strip():
            break
        blanks += 1
    return [""] * blanks


@dataclass
class ConsoleEntry:
    command: str
    exit: int
    out_first: int  # first output line (page index)
    out_stop: int


@dataclass
class ConsoleClaim(Claim):
    fence: Fence = None
    entries: list[ConsoleEntry] = field(default_factory=list)

    kind = "console"

    @classmethod
    def parse(cls, page: Page, fence: Fence, options: dict[str, str]) -> ConsoleClaim:
        lines, entries, i = page.lines, [], fence.start + 1
        while i < fence.end:
            raw = lines[i].strip()
            if not raw.startswith("$ "):
                if entries:
                    entries[-1].out_stop = i + 1
                i += 1
                continue
            typed = raw[2:]
            while typed.endswith("\\") and i + 1 < fence.end:
                i += 1
                typed = typed[:-1].rstrip() + " " + lines[i].strip()
            found = EXIT_COMMENT.search(typed)
            command = shlex.join(shlex.split(typed, comments=True))
            entries.append(ConsoleEntry(command, int(found.group(1)) if found else 0, i + 1, i + 1))
            i += 1
        return cls(page, fence.start, options, fence, entries)

    def commands(self) -> list[str]:
        return [e.command for e in self.entries]

    def columns(self) -> int | None:
        if "columns" in self.options:
            return int(self.options["columns"])
        widths = [len(self.page.lines[n].rstrip()) for e in self.entries for n in range(e.out_first, e.out_stop)]
        return max([80, *widths])

    def judge(self, results: dict, normalise) -> Verdict:
        verdict = Verdict()
        for e in self.entries:
            result = results[e.command]
            if not exit_ok(e.command, result, e.exit, verdict, f"{self.page.name}:{e.out_first}"):
                continue
            expected = self.page.lines[e.out_first : e.out_stop]
            if text.trim(expected):
                _compare_block(self.line, self.page, e.command, e.out_first, expected, normalise(result.output),
                               "excerpt" not in self.options, verdict, self.fence.indent)
            else:
                verdict.checked += 1
        return verdict


@dataclass
class BlockClaim(Claim):
    command: str = ""
    fence: Fence = None

    kind = "block"

    def commands(self) -> list[str]:
        return [self.command]

    def columns(self) -> int | None:
        if "columns" in self.options or self.fence.lang == "json":
            return super().columns()
        return max([80, *(len(self.page.lines[n].rstrip()) for n in self.fence.body)])

    def judge(self, results: dict, normalise) -> Verdict:
        verdict = Verdict()
        result = results[self.command]
        if not exit_ok(self.command, result, int(self.options.get("exit", 0)), verdict, self.where):
            return verdict
        first = self.fence.start + 1
        expected = self.page.lines[first : self.fence.end]
        if self.fence.lang == "json":
            _judge_json(self, expected, first, result.stdout, verdict)
        else:
            _compare_block(self.line, self.page, self.command, first, expected, normalise(result.output),
                           "excerpt" not in self.options, verdict, self.fence.indent)
        return verdict


@dataclass
class RegionClaim(Claim):
    command: str = ""
    first: int = 0  # the region's lines, between the two comments
    stop: int = 0

    kind = "region"

    def commands(self) -> list[str]:
        return [self.command]

    def columns(self) -> int | None:
        return int(self.options.get("columns", 80))

    def judge(self, results: dict, normalise) -> Verdict:
        verdict = Verdict()
        result = results[self.command]
        if exit_ok(self.command, result, int(self.options.get("exit", 0)), verdict, self.where):
            _compare_block(self.line, self.page, self.command, self.first, self.page.lines[self.first : self.stop],
                           normalise(result.output), False, verdict)
        return verdict


def _judge_json(claim: Claim, expected: list[str], first: int, stdout: str, verdict: Verdict) -> None:
    """Every value of the doc's JSON (a document or ``"key": {...}`` members) as the run gives it."""
    body = "\n".join(expected)
    as_text = {"parse_float": str, "parse_int": str}
    try:
        doc = json.loads(body, **as_text)
    except json.JSONDecodeError:
        doc = json.loads("{" + body + "}", **as_text)
    try:
        fresh = json.loads(stdout, **as_text)
    except json.JSONDecodeError:
        verdict.drifts.append(Drift(claim.where, "JSON", "no JSON on stdout", claim.command))
        return
    pairs: list[tuple[str, str, str]] = []
    _json_pairs(doc, fresh, "", pairs)
    verdict.checked += len(pairs)
    cursor = (0, 0)
    for path, old, new in pairs:
        key = path.rsplit(".", 1)[-1]
        found = _find_member(expected, key, old, cursor)
        if found is None:
            raise ClaimError(f"{claim.where}: cannot find \"{key}\": {old} in the block")
        cursor = (found[0], found[2])
        if old != new:
            verdict.drifts.append(Drift(f"{claim.page.name}:{first + found[0] + 1}", f"{path} {old}", new,
                                        claim.command, fixable=True))
            verdict.edits.append(SpanEdit(first + found[0], found[1], found[2], new))


def _json_pairs(doc, fresh, path: str, out: list) -> None:
    if isinstance(doc, dict):
        for key, value in doc.items():
            if not isinstance(fresh, dict) or key not in fresh:
                out.append((f"{path}{key}", json.dumps(value), "(absent)"))
            else:
                _json_pairs(value, fresh[key], f"{path}{key}.", out)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            _json_pairs(value, fresh[i] if isinstance(fresh, list) and i < len(fresh) else None, f"{path}{i}.", out)
    else:
        out.append((path.rstrip("."), _literal(doc), _literal(fresh)))


def _literal(value) -> str:
    return value if isinstance(value, str) and _looks_numeric(value) else json.dumps(value)


def _looks_numeric(value: str) -> bool:
    try:
        float(value)
        return True
    except ValueError:
        return False


def _find_member(lines: list[str], key: str, literal: str, cursor: tuple[int, int]):
    pattern = re.compile(r'"' + re.escape(key) + r'"\s*:\s*(' + re.escape(literal) + r")(?![\w.])")
    for n in range(cursor[0], len(lines)):
        found = pattern.search(lines[n], cursor[1] if n == cursor[0] else 0)
        if found:
            return n, found.start(1), found.end(1)
    return None


@dataclass
class ValueClaim(Claim):
    command: str = ""
    items: list[tuple[str, str]] = field(default_factory=list)  # (key, doc value)
    comment: Comment = None
    scope: range = range(0)

    kind = "value"

    def commands(self) -> list[str]:
        return [self.command]

    def judge(self, results: dict, normalise) -> Verdict:
        verdict = Verdict()
        result = results[self.command]
        if not exit_ok(self.command, result, int(self.options.get("exit", 0)), verdict, self.where):
            return verdict
        values = [v for _, v in self.items]
        in_text = _sequential(self.page.lines, self.scope, values, (self.scope.start, 0))
        if in_text is None:
            raise ClaimError(f"{self.where}: the values {values} are not all in the text that follows, "
                             f"in that order (lines {self.scope.start + 1}-{self.scope.stop})")
        arrow = next((n, self.page.lines[n].find("=>")) for n in range(self.comment.start, self.comment.end + 1)
                     if "=>" in self.page.lines[n])
        in_comment = _sequential(self.page.lines, range(arrow[0], self.comment.end + 1), values, arrow)
        for (key, doc), (line, start, end), spot in zip(self.items, in_text, in_comment or [None] * len(self.items)):
            verdict.checked += 1
            number, (key, cap) = DocNumber(doc), split_precision(key)
            value = value_of(key, result.stdout if not key.startswith("`") else result.output)
            if number.agrees(value, cap):
                continue
            fresh = number.format(value, cap)
            verdict.drifts.append(Drift(f"{self.page.name}:{line + 1}", doc, fresh, self.command,
                                        "" if key == "out" else f"key {key}", fixable=True))
            verdict.edits.append(SpanEdit(line, start, end, fresh))
            if spot:
                verdict.edits.append(SpanEdit(spot[0], spot[1], spot[2], fresh))
        return verdict


def _sequential(lines: list[str], scope: range, values: list[str], start: tuple[int, int]):
    """The positions (line, start, end) of ``values``, found one after another in ``scope``
    from ``start`` (line, offset) on."""
    found, k = [], 0
    for n in scope:
        for token in number_tokens(lines[n]):
            if k < len(values) and token.group(0) == values[k] and (n, token.start()) >= start:
                found.append((n, token.start(), token.end()))
                k += 1
    return found if k == len(values) else None
