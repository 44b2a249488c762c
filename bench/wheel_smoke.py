"""Smoke test of the wheel: build it, install it for real (not editable), run every command.

    python bench/wheel_smoke.py [--wheel FILE] [--no-build-isolation] [--keep]

builds the wheel the way ``pip install .`` does (or takes ``--wheel``), makes a brand-new virtual
environment, runs ``pip install WHEEL`` there (dependencies from the package index), and from an
empty directory outside the repository runs each ``triosim`` command once and ``--help`` of every
command, printing each command line and its exit status. Exits 1 when any step failed.

A test run imports triosim from the source tree (an editable install), so a module or data file
missing from the wheel goes unnoticed there: ``triosim.plan`` was once left out of the package
list and ``triosim plan`` crashed after ``pip install .``. tests/test_packaging.py runs the same
steps on every test run, in a fresh environment that borrows the test environment's dependencies
instead of downloading them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Source directory -> where it lands in the wheel (pyproject.toml's package-dir).
PACKAGE_ROOTS = {"triosim": "triosim", "tracer": "triosim/tracer", "sample_trace": "triosim/sample_trace",
                 "topologies": "triosim/topologies", "userbuffers": "triosim/userbuffers"}
# Python directories at the top of the repository that are not part of the package.
NOT_SHIPPED = frozenset({"tests", "bench", "docs"})
# Without git: what a clone does not hold (the .gitignore's entries).
_SCRATCH = (".git", ".venv", "venv", "build", "dist", "__pycache__", "*.egg-info", ".pytest_cache",
            ".ruff_cache", ".hypothesis", "out", "*.pyc")


# --- the source tree and the wheel --------------------------------------------------------------
def repo_files(repo: Path = REPO) -> list[str]:
    """Every file of the checkout that git does not ignore (tracked or new), as relative paths;
    without git, every file outside the usual scratch directories."""
    try:
        listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        found = []
        for root, dirs, files in os.walk(repo):
            dirs[:] = [d for d in dirs if not _scratch(d)]
            found += [os.path.relpath(os.path.join(root, f), repo) for f in files if not _scratch(f)]
        return sorted(Path(f).as_posix() for f in found)
    names = {n for n in listed.decode().split("\0") if n}
    return sorted(n for n in names if (repo / n).is_file())  # --cached lists deleted files too


def _scratch(name: str) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(name, pattern) for pattern in _SCRATCH)


def expected_wheel_files(files: Iterable[str]) -> set[str]:
    """The wheel path of every file under a package root (modules and data alike)."""
    out = set()
    for name in files:
        top, _, rest = name.partition("/")
        if top in PACKAGE_ROOTS and rest:
            out.add(f"{PACKAGE_ROOTS[top]}/{rest}")
    return out


def unshipped_package_dirs(files: Iterable[str]) -> list[str]:
    """Top-level directories holding an ``__init__.py`` that are neither shipped nor known not to
    be: a new package directory needs a package-dir line in pyproject.toml (and PACKAGE_ROOTS)."""
    tops = {name.split("/")[0] for name in files if name.count("/") == 1 and name.endswith("/__init__.py")}
    return sorted(tops - set(PACKAGE_ROOTS) - NOT_SHIPPED)


def build_wheel(out_dir: Path, isolation: bool = True, repo: Path = REPO) -> Path:
    """Build the wheel from a clean copy of the checkout (no stale build/ or *.egg-info) into
    ``out_dir``. Without isolation it uses this Python's setuptools and needs no network."""
    src = out_dir / "src"
    for name in repo_files(repo):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out_dir), str(src)]
    if not isolation:
        cmd[5:5] = ["--no-build-isolation", "--no-index"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"building the wheel failed ({' '.join(cmd)}):\n{proc.stdout}{proc.stderr}")
    wheels = sorted(out_dir.glob("triosim-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one triosim wheel in {out_dir}, found {wheels}")
    return wheels[0]


# --- the environment ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Venv:
    """A virtual environment: its python, its console scripts and its site-packages."""

    python: Path
    scripts: Path
    purelib: Path

    def script(self, name: str) -> Path:
        return self.scripts / (name + (".exe" if os.name == "nt" else ""))


def make_venv(path: Path, with_pip: bool, borrow: Sequence[str] = ()) -> Venv:
    """A brand-new virtual environment; ``borrow``: site-packages directories of another
    environment its python also searches (a ``.pth`` file naming them: the directories go on
    sys.path but the ``.pth`` files inside them are not run, so an editable install of triosim
    there stays invisible)."""
    cmd = [sys.executable, "-m", "venv", str(path)] + ([] if with_pip else ["--without-pip"])
    subprocess.run(cmd, check=True, capture_output=True)
    python = path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    paths = subprocess.run([str(python), "-c", "import sysconfig; p = sysconfig.get_paths(); "
                            "print(p['scripts']); print(p['purelib'])"],
                           capture_output=True, text=True, check=True, env=clean_env(), cwd=path).stdout.splitlines()
    venv = Venv(python=python, scripts=Path(paths[0]), purelib=Path(paths[1]))
    if borrow:
        (venv.purelib / "borrowed-site-packages.pth").write_text("".join(f"{d}\n" for d in borrow))
    return venv


def clean_env() -> dict[str, str]:
    """This environment without what would let a child python find the source tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"  # the user's site-packages may hold another triosim
    return env


def install(venv: Venv, wheel: Path, deps: bool) -> subprocess.CompletedProcess:
    """``pip install WHEEL`` into ``venv`` (``deps=False``: --no-deps, nothing downloaded)."""
    cmd = [str(venv.python), "-m", "pip", "install", "-q", str(wheel)]
    if not deps:
        cmd += ["--no-deps", "--no-index", "--ignore-installed"]
    return subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), cwd=venv.scripts)


# --- the steps ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One command and what it must leave: exit 0, each file in ``files`` written (non-empty)
    and ``shows`` in its standard output."""

    args: tuple[str, ...]  # after `triosim`; a leading "python" runs the environment's python
    files: tuple[str, ...] = ()
    shows: str = ""


@dataclass(frozen=True)
class Outcome:
    step: Step
    command: str
    returncode: int
    problem: str  # "" when the step passed
    output: str


def command_names(venv: Venv, cwd: Path) -> dict[str, list[str]]:
    """``triosim``'s commands and the sub-commands of each, from the installed parser (run from
    ``cwd``: from the repository, ``python -c`` would import the source tree's triosim)."""
    proc = subprocess.run([str(venv.python), "-c", _COMMANDS], capture_output=True, text=True, env=clean_env(),
                          cwd=cwd)
    if proc.returncode:
        raise RuntimeError(f"cannot read the installed parser's commands:\n{proc.stderr}")
    return json.loads(proc.stdout)


_COMMANDS = """\
import argparse, json
from triosim.cli.console import build_parser
def subs(parser):
    return next((dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
print(json.dumps({name: sorted(subs(p)) for name, p in subs(build_parser()).items()}))
"""

# Imports every module of the installed package and checks each comes from the environment's
# site-packages, not from a source tree.
IMPORT_ALL = """\
import importlib, pkgutil, sys, sysconfig
from pathlib import Path
import triosim
lib = Path(sysconfig.get_paths()["purelib"]).resolve()
names = ["triosim"] + [m.name for m in pkgutil.walk_packages(triosim.__path__, "triosim.")
                       if not m.name.endswith("__main__")]
outside = [f"{n}: {f}" for n in names
           if lib not in (f := Path(importlib.import_module(n).__file__).resolve()).parents]
if outside:
    sys.exit(f"imported from outside {lib}: " + "; ".join(outside))
print(len(names), "modules imported from", lib)
"""


def steps(venv: Venv, pair: tuple[Path, Path], commands: dict[str, list[str]]) -> list[Step]:
    """Every command once (on small inputs, a few seconds each) and --help of every command;
    ``pair``: an execution-trace + profiler JSON pair for ``trace convert``; ``commands``: see
    :func:`command_names`."""
    sample = venv.purelib / "triosim" / "sample_trace" / "gpt-h16-cpu-bs8"
    runs = [
        Step(("python", "-c", IMPORT_ALL), shows="modules imported from"),
        Step(("run", "-q")),
        Step(("dag", "--export", "dag.dot", "--case", "2", "--gpus", "4", "--topology-file", "ring"),
             files=("dag.dot",)),
        Step(("sweep", "--case", "1,2", "--gpus", "2,4", "--out", "sweep.csv", "-q"), files=("sweep.csv",)),
        Step(("plan", "--model", "gpt-neo-1.3b", "--gpu", "h100", "--gpus", "2", "--global-batch", "4",
              "--top", "1", "--out", "plan.csv", "-q"), files=("plan.csv",)),
        Step(("trace", "repeat", "--layers", "3", "--in", str(sample), "--out", "repeated", "-q"),
             files=("repeated/trace.csv", "repeated/tensor.csv")),
        Step(("trace", "convert", "--graph", str(pair[0]), "--profiler", str(pair[1]), "--out", "converted",
              "--batch-size", "2", "-q"), files=("converted/trace.csv", "converted/tensor.csv")),
        Step(("gpus",), shows="h100"),
        Step(("models",), shows="llama"),
    ]
    helps = [Step(("--help",), shows="usage: triosim")]
    for name, subs in commands.items():
        helps.append(Step((name, "--help"), shows=f"usage: triosim {name}"))
        helps += [Step((name, sub, "--help"), shows=f"usage: triosim {name} {sub}") for sub in subs]
    return runs + helps


def uncovered_commands(commands: Iterable[str], step_list: Sequence[Step]) -> list[str]:
    """Commands that no step runs other than for --help (each command must run once)."""
    ran = {s.args[0] for s in step_list if "--help" not in s.args}
    return sorted(set(commands) - ran)


def run_step(venv: Venv, step: Step, cwd: Path, timeout: float = 120) -> Outcome:
    exe = [str(venv.python)] if step.args[0] == "python" else [str(venv.script("triosim"))]
    argv = exe + list(step.args[1:] if step.args[0] == "python" else step.args)
    shown = " ".join(["python" if step.args[0] == "python" else "triosim",
                      *(a if "\n" not in a else "'<import every module>'" for a in argv[1:])])
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=clean_env())
    except subprocess.TimeoutExpired:
        return Outcome(step, shown, -1, f"timed out after {timeout:.0f} s", "")
    output = proc.stdout + proc.stderr
    problem = ""
    if proc.returncode:
        problem = f"exit status {proc.returncode}"
    elif step.shows and step.shows not in proc.stdout:
        problem = f"output lacks {step.shows!r}"
    else:
        empty = [f for f in step.files if not (cwd / f).is_file() or (cwd / f).stat().st_size == 0]
        problem = f"did not write {', '.join(empty)}" if empty else ""
    return Outcome(step, shown, proc.returncode, problem, output)


def run_steps(venv: Venv, step_list: Sequence[Step], cwd: Path, jobs: int | None = None) -> list[Outcome]:
    """Run the steps from ``cwd``, a few at a time (each writes its own files); results in order."""
    jobs = jobs or min(4, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(lambda s: run_step(venv, s, cwd), step_list))


def step_pair(where: Path) -> tuple[Path, Path]:
    """A small execution-trace + profiler JSON pair (the tracer tests' hand-made step)."""
    sys.path.insert(0, str(REPO / "tests" / "tracer"))
    try:
        from tracer_fixtures import build_step, write_pair
    finally:
        sys.path.pop(0)
    where.mkdir(parents=True, exist_ok=True)
    return write_pair(where, build_step())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="a built wheel (default: build one from this checkout)")
    parser.add_argument("--no-build-isolation", dest="isolation", action="store_false",
                        help="build with this Python's setuptools (offline)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="triosim-wheel-smoke-"))
    try:
        wheel = args.wheel.resolve() if args.wheel else build_wheel(scratch / "wheel", args.isolation)
        print(f"wheel: {wheel}")
        venv = make_venv(scratch / "venv", with_pip=True)
        proc = install(venv, wheel, deps=True)
        print(f"$ {venv.python} -m pip install {wheel.name}\n  exit status {proc.returncode}")
        if proc.returncode:
            print(proc.stdout + proc.stderr)
            return 1
        work = scratch / "work"
        work.mkdir()
        commands = command_names(venv, work)
        step_list = steps(venv, step_pair(scratch / "pair"), commands)
        outcomes = run_steps(venv, step_list, work)
        for o in outcomes:
            print(f"$ {o.command}\n  exit status {o.returncode}" + (f": FAILED, {o.problem}" if o.problem else ""))
            if o.problem:
                print("    " + o.output.strip().replace("\n", "\n    "))
        failed = [o for o in outcomes if o.problem]
        missing = uncovered_commands(commands, step_list)
        if missing:
            print(f"commands never run: {', '.join(missing)}")
        print(f"{len(outcomes) - len(failed)} of {len(outcomes)} steps passed (from {work})")
        return 1 if failed or missing else 0
    finally:
        if args.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
