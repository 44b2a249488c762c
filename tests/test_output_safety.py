"""Outputs never destroy inputs: symlink-safe temporary files, a trace directory written as one
step (a SIGKILL right after its first rename leaves the old or the new directory, never a mix),
and outputs naming an input of the run refused before any work."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from triosim.errors import ConfigError
from triosim.output import _open_new, atomic_write_dir, recover_dir, refuse_overwriting_inputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import sigkill_repeat  # noqa: E402


def test_temporary_files_never_follow_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    link = tmp_path / ".r.json.1.0badc0de.tmp"
    link.symlink_to(outside)
    with pytest.raises(FileExistsError):
        _open_new(link, binary=False)
    dangling = tmp_path / ".r.json.2.0badc0de.tmp"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        _open_new(dangling, binary=True)
    assert outside.read_text() == "keep" and not (tmp_path / "nowhere").exists()


def test_refuse_overwriting_inputs_by_path_and_inode(tmp_path: Path) -> None:
    a = tmp_path / "meta.json"
    a.write_text("{}")
    hard = tmp_path / "other-name.json"
    os.link(a, hard)
    with pytest.raises(ConfigError, match=r"--json .*meta.json: refusing to overwrite an input file"):
        refuse_overwriting_inputs([("--json", str(tmp_path / "x" / ".." / "meta.json"))], [a])
    with pytest.raises(ConfigError, match="--timeline .*other-name.json: refusing to overwrite an input file"):
        refuse_overwriting_inputs([("--timeline", hard)], [a])
    refuse_overwriting_inputs([("--json", "-"), ("--json", None), ("--json", tmp_path / "new.json")], [a, None])


def test_directory_write_replaces_whole_and_keeps_foreign_directories(tmp_path: Path) -> None:
    out = tmp_path / "out"

    def files(n: str):
        def write(d: Path) -> None:
            for name in ("trace.csv", "tensor.csv", "meta.json"):
                (d / name).write_text(n)
        return write

    atomic_write_dir(out, files("1"), replaceable=("trace.csv", "tensor.csv", "meta.json"))
    atomic_write_dir(out, files("2"), replaceable=("trace.csv", "tensor.csv", "meta.json"))
    assert {p.read_text() for p in out.iterdir()} == {"2"} and sorted(os.listdir(tmp_path)) == ["out"]
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds other files"):
        atomic_write_dir(out, files("3"), flag="--out", replaceable=("trace.csv", "tensor.csv", "meta.json"))
    assert (out / "notes.txt").read_text() == "mine"


def test_recovery_puts_back_the_directory_a_killed_fallback_renamed_away(tmp_path: Path) -> None:
    dead = 2**22 + 12345  # no such process
    old = tmp_path / f".out.{dead}.0badc0de.old"
    new = tmp_path / f".out.{dead}.0badc0de.tmp"
    for d, text in ((old, "old"), (new, "new")):
        d.mkdir()
        (d / "trace.csv").write_text(text)
    recover_dir(tmp_path / "out")
    assert (tmp_path / "out" / "trace.csv").read_text() == "old" and sorted(os.listdir(tmp_path)) == ["out"]


@pytest.fixture(scope="module")
def old_and_new(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("repeat")
    sigkill_repeat.make(base / "old", 2)
    sigkill_repeat.make(base / "new", 3)
    return base / "old", base / "new"


@pytest.mark.parametrize("mode", ["exchange", "fallback"])
def test_sigkill_right_after_the_first_rename_leaves_old_or_new(tmp_path: Path, mode: str, old_and_new) -> None:
    """Two SIGKILLs per mode (bench/sigkill_repeat.py runs 30 each)."""
    old_dir, new_dir = old_and_new
    work = tmp_path / "work"
    work.mkdir()
    c = sigkill_repeat.run_kills(mode, 2, work, old_dir, sigkill_repeat.digest(old_dir),
                                 sigkill_repeat.digest(new_dir))
    assert c["killed"] == 2 and c["after kill: MIXED"] == c["leftover: MIXED"] == 0
    assert c["after recovery: old"] + c["after recovery: new"] == 2 and c["leftovers after recovery"] == 0
    shutil.rmtree(work)
