"""The wheel holds every module and data file of the source tree, and the installed wheel runs.

The other tests import triosim from the source tree (an editable install), so a package missing
from the wheel goes unnoticed there: ``triosim.plan`` was once left out of pyproject.toml's package
list and ``triosim plan`` crashed with ModuleNotFoundError after ``pip install .``. Here the wheel
is built as ``pip install .`` builds it (offline, with this environment's setuptools), its files
are compared with the source tree, and it is installed, not editable, into a fresh virtual
environment that borrows this one's dependencies but cannot see the source tree; every command
then runs once from a directory outside the repository (bench/wheel_smoke.py does the same with
a full ``pip install`` from the package index).
"""

from __future__ import annotations

import site
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import wheel_smoke  # noqa: E402


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Offline, with this environment's setuptools and wheel (the test extra brings them).
    return wheel_smoke.build_wheel(tmp_path_factory.mktemp("wheel"), isolation=False)


@pytest.mark.slow  # the wheel build: ~2 s
def test_wheel_holds_every_module_and_data_file(wheel: Path) -> None:
    files = wheel_smoke.repo_files()
    expected = wheel_smoke.expected_wheel_files(files)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    shipped = {n for n in names if ".dist-info/" not in n}
    assert {"triosim/plan/__init__.py", "triosim/tracer/collect.py", "triosim/sample_trace/README.md",
            "triosim/hardware/device_data/h100-sxm.yaml"} <= expected  # the source tree was read
    missing, extra = sorted(expected - shipped), sorted(shipped - expected)
    assert not missing, f"in the source tree but not in the wheel: {missing}"
    assert not extra, f"in the wheel but not in the source tree: {extra}"
    assert "triosim = triosim.cli:console_main" in entry_points
    assert not wheel_smoke.unshipped_package_dirs(files), "a new package directory: add it to pyproject.toml"


@pytest.mark.slow  # ~10-20 s: one install, then ~20 commands of about a second each, 4 at a time
def test_installed_wheel_runs_every_command(wheel: Path, tmp_path: Path) -> None:
    start = time.monotonic()
    borrowed = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    borrowed = [d for d in borrowed if Path(d).is_dir()]
    venv = wheel_smoke.make_venv(tmp_path / "venv", with_pip=False, borrow=borrowed)
    work = tmp_path / "work"
    work.mkdir()
    # The fresh environment sees the dependencies, but not this environment's triosim (an
    # editable install's finder is a .pth file inside a borrowed directory, which is not run).
    probe = ("import importlib.util as u, numpy, pandas, networkx; s = u.find_spec('triosim'); "
             "print(s.origin if s else 'absent')")
    seen = subprocess.run([str(venv.python), "-c", probe], cwd=work, capture_output=True, text=True,
                          env=wheel_smoke.clean_env())
    assert seen.returncode == 0, seen.stderr
    origin = seen.stdout.strip()
    assert origin == "absent" or not origin.startswith(str(wheel_smoke.REPO)), origin

    installed = wheel_smoke.install(venv, wheel, deps=False)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    commands = wheel_smoke.command_names(venv, work)
    assert {"run", "dag", "trace", "sweep", "plan", "gpus", "models"} <= set(commands)
    assert commands["trace"] == ["collect", "convert", "repeat"]
    steps = wheel_smoke.steps(venv, wheel_smoke.step_pair(tmp_path / "pair"), commands)
    assert not wheel_smoke.uncovered_commands(commands, steps)
    outcomes = wheel_smoke.run_steps(venv, steps, work)
    failed = [f"{o.command}: {o.problem}\n{o.output.strip()}" for o in outcomes if o.problem]
    assert not failed, "\n\n".join(failed)
    assert len((work / "sweep.csv").read_text().splitlines()) == 1 + 4  # header, 2 cases x 2 GPU counts
    assert (work / "dag.dot").read_text().startswith("digraph")
    assert time.monotonic() - start < 120  # ~15 s on two cores; far beyond means something hangs


def test_ci_runs_the_readme_test_command() -> None:
    """CI runs the README's test command, so the checks above run on every CI run."""
    readme = (wheel_smoke.REPO / "README.md").read_text(encoding="utf-8")
    command = next(line for line in readme.splitlines()
                   if line.startswith("python3 -m venv") and "pytest" in line)
    ci = (wheel_smoke.REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert [line for line in ci if line and not line.startswith(("#", "set ", "cd "))] == [command]
