"""Check that the docs show what triosim prints: every claim of README.md and docs/*.md re-run.

    python bench/check_docs.py                       # check every claim; exit 1 on any drift
    python bench/check_docs.py --fast                # only the claims not marked [slow]
    python bench/check_docs.py docs/models.md        # the claims of one page
    python bench/check_docs.py docs/models.md:118    # the claim at (or around) one line
    python bench/check_docs.py --list                # the claims, their commands and options
    python bench/check_docs.py --update [PAGE[:LINE] ...]   # rewrite drifted values and blocks

A claim is a ```console block or a ``<!-- doc-check ... -->`` / ``<!-- doc-table ... -->``
comment (docs/writing-docs.md). Each drift is printed as ``page:line: doc value -> fresh
value`` with the command that gives it. ``--update`` writes the fresh values and blocks into
the pages (atomically); values it cannot place (an exit status, a block no longer in the
output) are left for a person and make it exit 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from doccheck.checker import Outcome, Report, check, doc_pages, find_claims, update  # noqa: E402
from doccheck.claims import BlockClaim, Claim, ConsoleClaim, RegionClaim, ValueClaim  # noqa: E402
from doccheck.numbers import ClaimError  # noqa: E402
from doccheck.runner import Runner  # noqa: E402
from doccheck.tables import TableClaim  # noqa: E402

CHEAP_SECONDS = 3.0  # a claim not marked [slow] should cost less (tests/test_docs_check.py runs them)


def extent(claim: Claim) -> tuple[int, int]:
    """First and last line (0-based) of a claim: its comment, block, region or table."""
    if isinstance(claim, ConsoleClaim):
        return claim.fence.start, claim.fence.end
    if isinstance(claim, BlockClaim):
        return claim.line, claim.fence.end
    if isinstance(claim, RegionClaim):
        return claim.line, claim.stop
    if isinstance(claim, ValueClaim):
        return claim.line, max(claim.scope.stop - 1, claim.line)
    if isinstance(claim, TableClaim):
        return claim.line, claim.table.end - 1
    return claim.line, claim.line


def selected(claims: list[Claim], patterns: list[str]) -> list[Claim]:
    if not patterns:
        return claims
    keep = []
    for claim in claims:
        first, last = extent(claim)
        for pattern in patterns:
            page, _, line = pattern.partition(":")
            if claim.page.name == page and (not line or first <= int(line) - 1 <= last):
                keep.append(claim)
                break
    return keep


def describe(claim: Claim) -> str:
    commands = claim.commands()
    tags = ",".join(k + (f"={v}" if v else "") for k, v in claim.options.items())
    more = f" (+{len(commands) - 1} more)" if len(commands) > 1 else ""
    return f"{claim.where}: {claim.kind}{f' [{tags}]' if tags else ''}: {commands[0] if commands else ''}{more}"


def print_outcome(o: Outcome) -> None:
    if o.error:
        print(f"{o.claim.where}: error: {o.error}", flush=True)
    for d in o.drifts:
        note = f" ({d.note})" if d.note and "\n" not in d.note else ""
        print(f"{d.where}: {d.doc} -> {d.fresh}{note}\n    $ {d.command}", flush=True)
        if "\n" in d.note:
            print("    " + d.note.replace("\n", "\n    "), flush=True)


def is_block(claim: Claim) -> bool:
    """Whether a claim compares output lines (else numbers: values, cells, a JSON block's fields)."""
    return isinstance(claim, (ConsoleClaim, RegionClaim)) or (isinstance(claim, BlockClaim)
                                                                and claim.fence.lang != "json")


def summary(report: Report, pages: int) -> str:
    done = [o for o in report.outcomes if not o.skipped]
    skipped: dict[str, int] = {}
    for o in report.outcomes:
        if o.skipped:
            skipped[o.skipped] = skipped.get(o.skipped, 0) + 1
    drifted = [o for o in done if o.drifts]
    blocks = sum(o.checked for o in done if is_block(o.claim))
    lines = [f"{len(report.outcomes)} claims on {pages} pages: {len(done)} checked "
             f"({blocks} output blocks and {sum(o.checked for o in done) - blocks} numbers compared), "
             f"{len(report.drifts)} drifts in {len(drifted)} claims, {len(report.errors)} errors; "
             f"{report.seconds:.1f} s"]
    for reason, n in sorted(skipped.items()):
        lines.append(f"  skipped {n}: {reason}")
    heavy = [o for o in done if not o.claim.slow and o.seconds > CHEAP_SECONDS]
    for o in heavy:
        lines.append(f"  {o.claim.where}: took {o.seconds:.1f} s but is not marked [slow]")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("claims", nargs="*", metavar="PAGE[:LINE]", help="only these pages or claims")
    ap.add_argument("--list", action="store_true", help="list the claims and exit")
    ap.add_argument("--update", action="store_true", help="rewrite drifted values and blocks in place")
    ap.add_argument("--fast", action="store_true", help="skip the claims marked [slow]")
    ap.add_argument("--fresh-process", action="store_true", help="run each triosim command as its own process")
    ap.add_argument("--root", type=Path, default=HERE.parent, help="the repository whose docs to check")
    ap.add_argument("--reference", type=Path, help="the original TrioSim's reference traces (trace2-h100-bs128)")
    ap.add_argument("--times", action="store_true", help="print what each claim's commands took")
    args = ap.parse_args(argv)
    pages = doc_pages(args.root)
    try:
        claims = selected([c for p in pages for c in find_claims(p)], args.claims)
    except (ClaimError, ValueError) as exc:
        print(f"check_docs: error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for claim in claims:
            print(describe(claim))
        print(f"{len(claims)} claims ({sum(c.slow for c in claims)} slow)")
        return 0
    with Runner(args.root, fresh_process=args.fresh_process, reference=args.reference) as runner:
        def progress(o: Outcome) -> None:
            print_outcome(o)
            if args.times:
                print(f"  [{o.seconds:6.1f} s] {describe(o.claim)}", flush=True)

        began = time.perf_counter()
        report = check(claims, runner, fast=args.fast, progress=progress)
        report.seconds = time.perf_counter() - began
    print(summary(report, len(pages)))
    if args.update:
        written = update(report)
        for path in written:
            print(f"updated {path}")
        left = [d for d in report.drifts if not d.fixable]
        return 1 if left or report.errors else 0
    return 1 if report.drifts or report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
