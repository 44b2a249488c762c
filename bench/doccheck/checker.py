"""Finding the claims of README.md and docs/*.md, checking them, and rewriting the docs.

``find_claims(page)`` reads one page; ``check(claims, runner)`` runs every claim's commands
(each distinct command once) and returns a ``Report``: what was compared, each drift, the
claims skipped and why (``slow`` under ``fast``, a missing reference trace, Graphviz), and
the time each claim cost. ``update(report)`` writes the fresh values and blocks back into the
pages, each page atomically.
"""

from __future__ import annotations

import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from .claims import (
    BlockClaim,
    Claim,
    ConsoleClaim,
    Drift,
    LinesEdit,
    Page,
    RegionClaim,
    SpanEdit,
    ValueClaim,
)
from .markdown import comments, fenced_lines, fences, table_after
from .numbers import ClaimError, split_items, split_key_value
from .runner import Runner
from .tables import TableClaim, expand_lets, parse_lets

RUNNABLE = ("$ triosim ", "$ python ")


def doc_pages(root: Path) -> list[Page]:
    files = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [Page(f, str(f.relative_to(root)), f.read_text(encoding="utf-8").splitlines()) for f in files if f.is_file()]


def find_claims(page: Page) -> list[Claim]:
    lines = page.lines
    blocks = fences(lines)
    starts = {b.start: b for b in blocks}
    notes = comments(lines, fenced_lines(blocks))
    in_comment = {n: c for c in notes for n in range(c.start, c.end + 1)}
    console_options: dict[int, dict[str, str]] = {}
    claims: list[Claim] = []
    closing = [c for c in notes if c.tag == "/doc-check"]
    lets: dict[str, str] = {}
    for c in notes:
        where = f"{page.name}:{c.start + 1}"
        if c.tag == "/doc-check":
            continue
        if c.tag == "doc-let":
            parse_lets(page, c, lets)
            continue
        if c.tag == "doc-table":
            table = table_after(lines, _after_comments(c.end + 1, in_comment))
            claims.append(TableClaim.parse(page, c, table, lets))
            continue
        c = replace(c, body=expand_lets(c.body, lets))
        after = _next_text_line(lines, c.end + 1)
        if not c.body:
            if after not in starts or starts[after].lang != "console":
                raise ClaimError(f"{where}: an empty doc-check comment gives options to the ```console block after it")
            console_options[after] = c.options
        elif "=>" in c.body:
            command, _, values = c.body.partition("=>")
            items = [split_key_value(i.replace("\n", " ")) for i in split_items(values)]
            start = _after_comments(c.end + 1, in_comment)
            stop = start
            while stop < len(lines) and lines[stop].strip():
                stop += 1
            claims.append(ValueClaim(page, c.start, c.options, _one_line(command), items, c, range(start, stop)))
        elif after in starts:
            claims.append(BlockClaim(page, c.start, c.options, _one_line(c.body), starts[after]))
        else:
            end = next((e for e in closing if e.start > c.end), None)
            if end is None:
                raise ClaimError(f"{where}: a doc-check region needs a closing <!-- /doc-check --> comment "
                                 "(or '=> VALUE' for numbers, or a fenced block right after it)")
            claims.append(RegionClaim(page, c.start, c.options, _one_line(c.body), c.end + 1, end.start))
    for b in blocks:
        if b.lang == "console" and any(lines[n].strip().startswith(RUNNABLE) for n in b.body):
            claims.append(ConsoleClaim.parse(page, b, console_options.get(b.start, {})))
    return sorted(claims, key=lambda claim: claim.line)


def _after_comments(i: int, in_comment: dict) -> int:
    """The first line at or after ``i`` that is not in a (stacked) doc-check comment."""
    while i in in_comment:
        i = in_comment[i].end + 1
    return i


def _next_text_line(lines: list[str], i: int) -> int:
    while i < len(lines) and not lines[i].strip():
        i += 1
    return i


def _one_line(command: str) -> str:
    return " ".join(command.split())


@dataclass
class Outcome:
    claim: Claim
    checked: int = 0
    drifts: list[Drift] = field(default_factory=list)
    edits: list = field(default_factory=list)
    skipped: str = ""
    error: str = ""
    seconds: float = 0.0  # of the commands this claim ran first


@dataclass
class Report:
    outcomes: list[Outcome]
    seconds: float

    @property
    def drifts(self) -> list[Drift]:
        return [d for o in self.outcomes for d in o.drifts]

    @property
    def errors(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error]


def skip_reason(claim: Claim, runner: Runner, fast: bool) -> str:
    if fast and claim.slow:
        return "slow"
    needs = {n.strip() for n in claim.needs.split("+") if n.strip()}
    if "dot" in needs and shutil.which("dot") is None:
        return "needs Graphviz's dot"
    if "reference" in needs and not runner.reference.is_dir():
        return "needs the original TrioSim's reference traces"
    for command in claim.commands():
        resolved, missing = runner.resolve(command)
        if resolved is None:
            return "needs " + missing
    return ""


def check(claims: list[Claim], runner: Runner, fast: bool = False, progress=None) -> Report:
    began = time.perf_counter()
    outcomes = []
    for claim in claims:
        outcome = Outcome(claim, skipped=skip_reason(claim, runner, fast))
        outcomes.append(outcome)
        if outcome.skipped:
            continue
        results = {}
        for command in claim.commands():
            resolved, _ = runner.resolve(command)
            before = len(runner.cache)
            results[command] = runner.run(resolved, claim.columns())
            outcome.seconds += results[command].seconds if len(runner.cache) > before else 0.0
        try:
            verdict = claim.judge(results, runner.normalise)
        except ClaimError as exc:
            outcome.error = str(exc)
        else:
            outcome.checked, outcome.drifts, outcome.edits = verdict.checked, verdict.drifts, verdict.edits
        if progress:
            progress(outcome)
    return Report(outcomes, time.perf_counter() - began)


def apply_edits(lines: list[str], edits: list) -> list[str]:
    """``lines`` with the span edits (within a line) and then the line-range edits applied."""
    lines = list(lines)
    by_line: dict[int, list[SpanEdit]] = defaultdict(list)
    for e in dict.fromkeys(e for e in edits if isinstance(e, SpanEdit)):
        by_line[e.line].append(e)
    for n, spans in by_line.items():
        spans.sort(key=lambda e: e.start, reverse=True)
        for a, b in zip(spans, spans[1:]):
            if b.end > a.start:
                raise ClaimError(f"line {n + 1}: two claims rewrite the same characters")
        for e in spans:
            lines[n] = lines[n][: e.start] + e.text + lines[n][e.end :]
    ranges = sorted(dict.fromkeys(e for e in edits if isinstance(e, LinesEdit)), key=lambda e: e.first, reverse=True)
    for a, b in zip(ranges, ranges[1:]):
        if b.stop > a.first:
            raise ClaimError(f"lines {a.first + 1}-{b.stop}: two claims rewrite the same lines")
    for e in ranges:
        lines[e.first : e.stop] = list(e.lines)
    return lines


def update(report: Report) -> list[Path]:
    """Write every drifted page back with its fresh values, atomically; the pages written."""
    from triosim.output import atomic_write_text

    by_page: dict[Path, tuple[Page, list]] = {}
    for o in report.outcomes:
        if o.edits:
            by_page.setdefault(o.claim.page.path, (o.claim.page, []))[1].extend(o.edits)
    written = []
    for path, (page, edits) in by_page.items():
        new = apply_edits(page.lines, edits)
        if new != page.lines:
            atomic_write_text(path, "\n".join(new) + "\n")
            written.append(path)
    return written
