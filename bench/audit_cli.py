"""Audit: every option of every command given a bad number or a bad path.

    python bench/audit_cli.py              # all commands; prints the findings and a summary
    python bench/audit_cli.py --all        # print every case, not only the findings
    python bench/audit_cli.py --only run   # one command (run, dag, sweep, trace collect, ...)

The options are read from the ``triosim`` parser itself, so a new flag is audited without
editing this file. Each numeric option gets ``nan inf -inf -1 0 1e400 abc`` and an empty
string; each file or directory option gets an existing directory, ``/proc/x``, a file in a
missing directory and an empty string. Every other flag keeps a small valid value on a small
synthetic trace. A case is a finding when the command raises (what a user would see as a
traceback), exits with a code other than 0 or 2, prints more or less than one line on exit 2,
or accepts NaN, infinity or an empty value (exit 0; a sweep that records the configuration as
an "invalid" row with its reason, or the flag as "n/a" where it does not apply, is fine). Commands run in this process, each with a time limit.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

NUMBERS = ("nan", "inf", "-inf", "-1", "0", "1e400", "abc", "")
PATH_WORDS = ("out", "json", "timeline", "export", "dir", "graph", "profiler", "src", "data", "grid", "plot",
              "config", "topology_file", "raw")
SKIP = {"help", "version", "quiet"}
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    command: str
    flag: str
    value: str
    code: int | str
    stderr: str
    recorded: bool = False  # a sweep wrote the configuration as an "invalid" row with its reason

    @property
    def finding(self) -> str:
        lines = self.stderr.strip().splitlines()
        if isinstance(self.code, str):
            return self.code
        if self.code not in (0, 2):
            return f"exit {self.code}"
        if self.code == 2 and (len(lines) != 1 or not lines[0].startswith("triosim: error: ")):
            return f"{len(lines)} lines on stderr"
        if self.code == 0 and self.value.lstrip("-") in ("nan", "inf", "1e400") and not self.recorded:
            return "accepted a non-finite number"
        if self.code == 0 and self.value == "":
            return "accepted an empty value"
        return ""


class _TimeLimit(Exception):
    pass


def _alarm(signum, frame):
    raise _TimeLimit


def run(argv: list[str], limit_s: int) -> tuple[int | str, str]:
    from triosim.cli.console import main

    err = io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit_s)
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            try:
                code: int | str = main(argv)
            except SystemExit as exc:
                code = int(exc.code or 0) if not isinstance(exc.code, str) else 2
            except _TimeLimit:
                code = f"still running after {limit_s} s (accepted)"
            except Exception as exc:  # noqa: BLE001 - the finding itself
                code = f"traceback: {type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, err.getvalue()


def subparsers(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(command words, sub-parser) of every leaf command."""
    found = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = True
            for name, sub in action.choices.items():
                yield from subparsers(sub, (*prefix, name))
    if not found and prefix:
        yield prefix, parser


def base_argv(words: tuple[str, ...], trace: Path, tmp: Path) -> list[str]:
    gpt = str(REPO / "sample_trace" / "gpt-cpu-bs8")
    return {
        ("run",): ["run", "-trace-dir", str(trace), "-q"],
        ("dag",): ["dag", "-trace-dir", str(trace), "--export", str(tmp / "d.dot")],
        ("sweep",): ["sweep", "-trace-dir", str(trace), "--case", "0,1", "--jobs", "1", "--out",
                     str(tmp / "s.csv"), "-q"],
        ("trace", "collect"): ["trace", "collect", "--model", "resnet18", "--batch-size", "2", "--image-size", "32",
                               "--iterations", "1", "--device", "cpu", "--out", str(tmp / "c")],
        ("trace", "convert"): ["trace", "convert", "--graph", str(tmp / "g.json"), "--profiler", str(tmp / "p.json"),
                               "--out", str(tmp / "v")],
        ("trace", "repeat"): ["trace", "repeat", "--layers", "2", "--in", gpt, "--out", str(tmp / "r")],
    }.get(words, list(words))


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag`` set to ``value`` (replacing the base's value if it has one)."""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
        return out
    return [*out, flag, value]


def is_path(action: argparse.Action) -> bool:
    return action.type is Path or (action.metavar or "") in ("FILE", "DIR") or any(
        w == action.dest or action.dest.endswith("_" + w) or action.dest.startswith(w + "_") for w in PATH_WORDS)


def audit(only: str | None, limit_s: int) -> list[Outcome]:
    from triosim.cli.console import build_parser
    from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

    outcomes = []
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="triosim-audit-") as tmpdir:
        root = Path(tmpdir)
        os.chdir(root / ".")  # a command that takes "" as "here" writes into the scratch directory
        trace = write_synthetic_trace(root / "trace", SyntheticModel(layers=2, batch_size=4, seed=3))
        for words, sub in subparsers(build_parser()):
            command = " ".join(words)
            if only and command != only:
                continue
            for action in sub._actions:
                if not action.option_strings or action.dest in SKIP or action.nargs == 0 or action.choices:
                    continue
                flag = max(action.option_strings, key=len)
                values = (str(root / "adir"), "/proc/x", str(root / "missing" / "x"), "") if is_path(action) \
                    else NUMBERS
                if not is_path(action) and action.type not in (int, float, None) and action.default is not None \
                        and not isinstance(action.default, (int, float)):
                    continue  # a text option (a model name, a comma list of names)
                (root / "adir").mkdir(exist_ok=True)
                for value in values:
                    tmp = root / "scratch"
                    tmp.mkdir(exist_ok=True)
                    argv = with_flag(base_argv(words, trace, tmp), flag, value)
                    code, err = run(argv, limit_s)
                    results = tmp / "s.csv"
                    # "invalid" (with the reason) or "n/a" (a flag that does not apply to the row's case)
                    recorded = results.is_file() and any(w in results.read_text() for w in (",invalid,", ",n/a,"))
                    if results.is_file():
                        results.unlink()
                    outcomes.append(Outcome(command, flag, value, code, err.replace(tmpdir, "$TMP"), recorded))
        os.chdir(cwd)
    return outcomes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="one command, e.g. run or 'trace collect'")
    ap.add_argument("--all", action="store_true", help="print every case, not only the findings")
    ap.add_argument("--limit", type=int, default=60, help="seconds a case may run (60)")
    args = ap.parse_args()
    outcomes = audit(args.only, args.limit)
    findings = [o for o in outcomes if o.finding]
    for o in outcomes if args.all else findings:
        first = (o.stderr.strip().splitlines() or [""])[0]
        print(f"{o.command} {o.flag} {o.value!r}: exit {o.code}  {o.finding or first}")
    by_code: dict = {}
    for o in outcomes:
        by_code[o.code if isinstance(o.code, int) else "other"] = by_code.get(
            o.code if isinstance(o.code, int) else "other", 0) + 1
    print(f"{len(outcomes)} cases over {len({(o.command, o.flag) for o in outcomes})} options: "
          f"{', '.join(f'exit {k}: {v}' for k, v in sorted(by_code.items(), key=str))}; {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
