"""Running the commands of the docs, without touching the repository.

``triosim ...`` commands run in a sandbox: a temporary directory holding copies of
``sample_trace/`` and ``topologies/``, so the relative paths of the docs resolve and whatever a
command writes (``--out plan.csv``, ``--json result.json``) lands in the sandbox. By default
they run in this process through ``triosim.cli.main`` (the console script's code, less its
final ``os._exit``), stdout and stderr captured in the order they were written;
``fresh_process=True`` starts ``python -m triosim.cli`` for each. ``python bench/...``
commands run as processes from the repository root (bench scripts find their data from their
own path). Each distinct command runs once per checker; ``COLUMNS`` is set for rich's tables.
``@NAME`` in a command is a trace: ``sample_trace/NAME``, else the original TrioSim's
reference trace NAME (``TRIOSIM_REFERENCE_DIR``, else ``../shared/reference`` beside the
repository) when it is there.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

TRACE_REF = re.compile(r"@([\w.-]+)")
REFERENCE_SUBDIR = Path("sample_trace") / "trace2-h100-bs128"
# Environment that would make rich draw for a terminal or colour its output.
TERMINAL_ENV = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE")


@dataclass(frozen=True)
class RunResult:
    command: str
    code: int
    stdout: str
    output: str  # stdout and stderr as a terminal shows them
    seconds: float


def default_reference(repo: Path) -> Path:
    base = os.environ.get("TRIOSIM_REFERENCE_DIR")
    return (Path(base) if base else repo.parent / "shared" / "reference") / REFERENCE_SUBDIR


class _Both(io.StringIO):
    """A stream that also copies what it is given into a shared one (the terminal's view)."""

    def __init__(self, shared: io.StringIO) -> None:
        super().__init__()
        self.shared = shared

    def write(self, text: str) -> int:
        self.shared.write(text)
        return super().write(text)


class Runner:
    def __init__(self, repo: Path, *, fresh_process: bool = False, timeout: float = 900,
                 reference: Path | None = None) -> None:
        self.repo = repo.resolve()
        self.fresh_process = fresh_process
        self.timeout = timeout
        self.reference = reference if reference is not None else default_reference(self.repo)
        self.sandbox = Path(tempfile.mkdtemp(prefix="doc-check-"))
        for folder in ("sample_trace", "topologies"):
            if (self.repo / folder).is_dir():
                shutil.copytree(self.repo / folder, self.sandbox / folder)
        self.cache: dict[tuple[str, int], RunResult] = {}

    def close(self) -> None:
        shutil.rmtree(self.sandbox, ignore_errors=True)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def resolve(self, command: str) -> tuple[str | None, str]:
        """The command with ``@NAME`` traces made paths, or None and what is missing."""
        missing: list[str] = []

        def trace(match: re.Match) -> str:
            name = match.group(1)
            if (self.repo / "sample_trace" / name / "trace.csv").is_file():
                return f"sample_trace/{name}"
            if (self.reference / name / "trace.csv").is_file():
                return str(self.reference / name)
            missing.append(name)
            return match.group(0)

        resolved = TRACE_REF.sub(trace, command)
        if missing:
            return None, f"the original TrioSim's reference trace {', '.join(missing)} (not available)"
        return resolved, ""

    def run(self, command: str, columns: int | None = None) -> RunResult:
        """The command's result; ``columns=None``: any width will do (numbers, JSON)."""
        if columns is None:
            for (done, _), result in self.cache.items():
                if done == command:
                    return result
            columns = 80
        key = (command, columns)
        if key not in self.cache:
            argv = shlex.split(command)
            if argv[0] == "triosim" and not self.fresh_process:
                self.cache[key] = self._in_process(command, argv[1:], columns)
            elif argv[0] == "triosim":
                self.cache[key] = self._process(command, [sys.executable, "-m", "triosim.cli", *argv[1:]],
                                                self.sandbox, columns)
            elif argv[0] in ("python", "python3"):
                self.cache[key] = self._process(command, [sys.executable, *argv[1:]], self.repo, columns)
            else:
                raise ValueError(f"{command!r}: a doc command starts with triosim or python")
        return self.cache[key]

    @contextlib.contextmanager
    def _environment(self, columns: int):
        saved = {k: os.environ.get(k) for k in (*TERMINAL_ENV, "COLUMNS")}
        for k in TERMINAL_ENV:
            os.environ.pop(k, None)
        os.environ["COLUMNS"] = str(columns)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def _in_process(self, command: str, argv: list[str], columns: int) -> RunResult:
        from triosim.cli import main

        shared = io.StringIO()
        out, err = _Both(shared), _Both(shared)
        here = Path.cwd()
        began = time.perf_counter()
        with self._environment(columns), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            os.chdir(self.sandbox)
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's own errors
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:  # a traceback is a finding, not a crash of the checker
                err.write(traceback.format_exc())
                code = 1
            finally:
                os.chdir(here)
        return RunResult(command, int(code), out.getvalue(), shared.getvalue(), time.perf_counter() - began)

    def _process(self, command: str, argv: list[str], cwd: Path, columns: int) -> RunResult:
        env = {k: v for k, v in os.environ.items() if k not in TERMINAL_ENV}
        env["COLUMNS"] = str(columns)
        began = time.perf_counter()
        try:
            done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            return RunResult(command, 124, "", f"(timed out after {self.timeout:.0f} s)\n",
                             time.perf_counter() - began)
        return RunResult(command, done.returncode, done.stdout, done.stdout + done.stderr,
                         time.perf_counter() - began)

    def normalise(self, text: str) -> str:
        """Absolute paths of the sandbox, the repository and the reference traces made relative."""
        for base in (self.sandbox, self.repo):
            text = text.replace(str(base) + os.sep, "").replace(str(base), ".")
        return text.replace(str(self.reference) + os.sep, "")
