"""``<!-- doc-table: ... -->``: the cells of a table, each from a command made from its row.

Each entry of the comment names columns (and rows) and a template: ``col 3: triosim run
-trace-dir @{1} {2} --json - => makespan_ms``. For every row the template is filled from the
row's cells (``_fill``: ``{N}``, ``{h}``, ``{N#K}``, ``{N:code}``, ``{N:bare}``, ``{N:re}``) and
the checked cell's number is compared with the key's value. ``let NAME = TEXT`` names a piece,
in the comment or for the rest of the page (``<!-- doc-let: ... -->``, ``parse_lets``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .claims import Claim, Drift, Page, SpanEdit, Verdict, exit_ok
from .markdown import Cell, Comment, Table
from .numbers import ClaimError, DocNumber, number_tokens, split_precision, value_of

TABLE_ENTRY = re.compile(r"^(?:rows? (\d+)(?:-(\d+))? )?cols? (\d+)(?:-(\d+))?(?:\.(\d+))?\s*:\s*(.+?)\s*=>\s*(.+)$")
LET = re.compile(r"^let (\w+) = (.+)$")
PLACEHOLDER = re.compile(r"\{(\w+)(?:#(\d+))?(?::(re|code|bare))?\}")


@dataclass
class TableCheck:
    cell: Cell
    command: str
    key: str
    index: int  # which number of the cell (0-based)


@dataclass
class TableClaim(Claim):
    table: Table = None
    checks: list[TableCheck] = field(default_factory=list)

    kind = "table"

    @classmethod
    def parse(cls, page: Page, comment: Comment, table: Table, page_lets: dict[str, str]) -> TableClaim:
        lets: dict[str, str] = dict(page_lets)
        checks: list[TableCheck] = []
        entries: list[str] = []
        for raw in comment.body.splitlines():
            if raw[:1].isspace() and raw.strip() and entries:  # an indented line continues the entry above
                entries[-1] += " " + raw.strip()
            elif raw.strip():
                entries.append(raw.strip())
        for line in entries:
            let = LET.match(line)
            if let:
                lets[let.group(1)] = let.group(2)
                continue
            entry = TABLE_ENTRY.match(line)
            if not entry:
                raise ClaimError(f"{page.name}:{comment.start + 1}: not a table entry: {line!r} "
                                 "(want 'col C: COMMAND => KEY', 'row R col C: ...' or 'let NAME = TEXT')")
            r0, r1, c0, c1, k, template, key = entry.groups()
            rows = range(int(r0) - 1, int(r1 or r0)) if r0 else range(len(table.rows))
            columns = range(int(c0) - 1, int(c1 or c0))
            keys = [part.strip() for part in _expand_lets(key, lets).split(" | ")]
            if len(keys) not in (1, len(columns)):
                raise ClaimError(f"{page.name}:{comment.start + 1}: {len(keys)} keys for {len(columns)} columns")
            for r in rows:
                for n, c in enumerate(columns):
                    checks += _cell_checks(table, r, c, template, keys[n if len(keys) > 1 else 0], lets,
                                           int(k) - 1 if k else None)
        return cls(page, comment.start, comment.options, table, checks)

    def commands(self) -> list[str]:
        return list(dict.fromkeys(c.command for c in self.checks))

    def judge(self, results: dict, normalise) -> Verdict:
        verdict = Verdict()
        for check in self.checks:
            result = results[check.command]
            if not exit_ok(check.command, result, int(self.options.get("exit", 0)), verdict,
                            f"{self.page.name}:{check.cell.line + 1}"):
                continue
            tokens = number_tokens(check.cell.text)
            if check.index >= len(tokens):
                raise ClaimError(f"{self.page.name}:{check.cell.line + 1}: cell {check.cell.text!r} has no "
                                 f"number {check.index + 1}")
            token = tokens[check.index]
            verdict.checked += 1
            number, (key, cap) = DocNumber(token.group(0)), split_precision(check.key)
            value = value_of(key, result.stdout if not key.startswith("`") else result.output)
            if not number.agrees(value, cap):
                fresh = number.format(value, cap)
                verdict.drifts.append(Drift(f"{self.page.name}:{check.cell.line + 1}", token.group(0), fresh,
                                            check.command, "" if check.key == "out" else f"key {check.key}", fixable=True))
                start = check.cell.start + token.start()
                verdict.edits.append(SpanEdit(check.cell.line, start, start + len(token.group(0)), fresh))
        return verdict


EMPTY_CELLS = {"", "—", "-", "n/a", "the same"}


def _cell_checks(table: Table, r: int, c: int, template: str, key: str, lets: dict, index: int | None):
    row = table.rows[r]
    if c >= len(row) or row[c].text.replace("*", "").strip() in EMPTY_CELLS:
        return []
    template, key = _expand_lets(template, lets), _expand_lets(key, lets)
    cells = {str(n + 1): cell for n, cell in enumerate(row)}
    if c < len(table.header):
        cells["h"] = table.header[c]
    texts = {name: cell.plain for name, cell in cells.items()}
    used = [m.group(1) for m in PLACEHOLDER.finditer(template) if " / " in texts.get(m.group(1), "")]
    if index is not None or not used:
        return [TableCheck(row[c], _fill(template, cells, texts), _fill(key, cells, texts), index or 0)]
    items = {name: texts[name].split(" / ") for name in used}
    count = len(next(iter(items.values())))
    if any(len(v) != count for v in items.values()) or len(number_tokens(row[c].text)) < count:
        raise ClaimError(f"row {r + 1}: the ' / ' lists of {used} and the numbers of column {c + 1} differ in length")
    checks = []
    for i in range(count):
        one = {**texts, **{n: v[i].strip() for n, v in items.items()}}
        checks.append(TableCheck(row[c], _fill(template, cells, one), _fill(key, cells, one), i))
    return checks


def parse_lets(page: Page, comment: Comment, lets: dict[str, str]) -> None:
    """``<!-- doc-let: NAME = TEXT -->`` (several lines, indented lines continuing one): names for
    the rest of the page."""
    entries: list[str] = []
    for raw in comment.body.splitlines():
        if raw[:1].isspace() and raw.strip() and entries:
            entries[-1] += " " + raw.strip()
        elif raw.strip():
            entries.append(raw.strip())
    for entry in entries:
        found = re.match(r"^(?:let )?(\w+) = (.+)$", entry)
        if not found:
            raise ClaimError(f"{page.name}:{comment.start + 1}: not 'NAME = TEXT': {entry!r}")
        lets[found.group(1)] = found.group(2)


def expand_lets(template: str, lets: dict) -> str:
    return _expand_lets(template, lets)


def _expand_lets(template: str, lets: dict) -> str:
    def one(m: re.Match) -> str:
        return lets[m.group(1)] if m.group(1) in lets and not (m.group(2) or m.group(3)) else m.group(0)

    for _ in range(10):  # lets may use lets
        expanded = PLACEHOLDER.sub(one, template)
        if expanded == template:
            return expanded
        template = expanded
    raise ClaimError(f"lets that refer to each other in a circle: {template!r}")


def _fill(template: str, cells: dict[str, Cell], texts: dict[str, str]) -> str:
    """A row's command or key: ``{N}`` is cell N (its code spans, else its text; an item of its
    `` / `` list), ``{h}`` the column's header, ``{N#K}`` the K-th number in cell N,
    ``{N:code}`` its code spans or nothing, ``{N:bare}`` without thousands separators, ``{N:re}`` a
    regular expression matching ``{N}``."""
    def one(match: re.Match) -> str:
        name, nth, form = match.groups()
        if name not in texts:
            raise ClaimError(f"unknown placeholder {match.group(0)} in {template!r}")
        value = texts[name]
        if nth:
            tokens = number_tokens(cells[name].text)
            if int(nth) > len(tokens):
                raise ClaimError(f"{match.group(0)}: {cells[name].text!r} has {len(tokens)} numbers")
            value = tokens[int(nth) - 1].group(0)
        elif form == "code":
            value = value if "`" in cells[name].text else ""
        if form == "bare":  # 1,024 -> 1024, as a program prints it
            value = value.replace(",", "")
        return re.escape(value) if form == "re" else value

    filled = PLACEHOLDER.sub(one, template)
    return filled if "`" in filled else re.sub(r"\s+", " ", filled).strip()
