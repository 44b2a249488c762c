"""Run a ``triosim`` command line in this process and capture what it prints (the tests' CLI
driver: exit code, stdout, stderr)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

from triosim.cli.console import main


def run(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``triosim ARGV``; argparse's exits count as exit codes."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()
