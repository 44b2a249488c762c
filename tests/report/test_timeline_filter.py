"""--timeline-gpus and --timeline-micro-batches: the timeline keeps exactly the chosen GPUs' tracks
and the first micro-batches, says on stderr what it wrote and left out, and cuts a large run by
default."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from triosim.cli.console import main
from triosim.report import timeline_filter
from triosim.report.timeline import LINKS_PID, link_gpus

from ..test_timeline import chrome_trace_errors

# dp 2 x pp 2 on the synthetic trace, 4 micro-batches: every GPU built, ring transfers between them.
HYBRID = ["--dp", "2", "--pp", "2", "-micro-batch-size", "2", "--schedule", "1f1b", "--collective-detail",
          "expanded"]


def timeline(capsys, tmp_path: Path, synthetic_dir: Path, *flags: str, name: str = "t.json") -> tuple[dict, str]:
    path = tmp_path / name
    assert main(["run", "-trace-dir", str(synthetic_dir), *HYBRID, "-q", "--timeline", str(path), *flags]) == 0
    err = capsys.readouterr().err
    doc = json.loads(path.read_text())
    assert chrome_trace_errors(doc) == []
    return doc, err


def thread_names(doc: dict) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == LINKS_PID}


def slices(doc: dict) -> set[tuple]:
    """(track, task) of every slice; a link track by its link's name (lane numbers differ when
    fewer links are drawn)."""
    names = thread_names(doc)
    return {(("gpu", e["pid"]) if e["pid"] != LINKS_PID else ("link", names[e["tid"]].split(" (")[0]),
             e["args"]["task"]) for e in doc["traceEvents"] if e["ph"] == "X"}


def test_timeline_gpus_keep_exactly_those_gpus_tracks(capsys, tmp_path: Path, synthetic_dir: Path) -> None:
    full, err = timeline(capsys, tmp_path, synthetic_dir, name="full.json")
    assert "every GPU and micro-batch" in err  # a small run keeps everything by default
    cut, err = timeline(capsys, tmp_path, synthetic_dir, "--timeline-gpus", "0,3")

    def on_0_or_3(track: tuple) -> bool:
        return track[1] in (0, 3) if track[0] == "gpu" else bool(link_gpus(track[1]) & {0, 3})

    assert slices(cut) == {s for s in slices(full) if on_0_or_3(s[0])}
    assert {e["pid"] for e in cut["traceEvents"] if e["ph"] == "X" and e["pid"] != LINKS_PID} == {0, 3}
    assert {e["pid"] for e in cut["traceEvents"] if e["ph"] == "C"} == {0, 3}
    assert all(link_gpus(n.split(" (")[0]) & {0, 3} for n in thread_names(cut).values())
    size = (tmp_path / "t.json").stat().st_size
    said = f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"
    assert f"timeline: wrote {tmp_path / 't.json'}: {said}, {len(cut['traceEvents']):,} events" in err
    assert "kept GPUs 0, 3 (of 4) and their links" in err and "--timeline-gpus all keeps them" in err


def test_timeline_micro_batches_keep_the_first_n_and_the_rest_of_the_step(capsys, tmp_path: Path,
                                                                           synthetic_dir: Path) -> None:
    full, _ = timeline(capsys, tmp_path, synthetic_dir, name="full.json")
    cut, err = timeline(capsys, tmp_path, synthetic_dir, "--timeline-micro-batches", "2")
    mb = {e["args"]["task"]: e["args"].get("microbatch") for e in full["traceEvents"] if e["ph"] == "X"}
    assert set(mb.values()) >= {0, 1, 2, 3, None}  # the optimizer and gradient all-reduce have none
    assert slices(cut) == {s for s in slices(full) if mb[s[1]] is None or mb[s[1]] < 2}
    assert "micro-batches 0–1 of 4" in err and "left out micro-batches 2–3" in err
    # Arrows join kept slices only.
    kept = {e["args"]["task"] for e in cut["traceEvents"] if e["ph"] == "X"}
    assert kept and all(mb[t] is None or mb[t] < 2 for t in kept)
    again, _ = timeline(capsys, tmp_path, synthetic_dir, "--timeline-micro-batches", "2", name="again.json")
    assert (tmp_path / "t.json").read_bytes() == (tmp_path / "again.json").read_bytes()


def test_a_large_run_is_cut_by_default_and_says_so(capsys, tmp_path: Path, synthetic_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline_filter, "LARGE_SLICES", 10)
    monkeypatch.setattr(timeline_filter, "MIN_DEFAULT_MICRO_BATCHES", 2)
    cut, err = timeline(capsys, tmp_path, synthetic_dir)
    # The first pipeline: dp 0's stages (GPUs 0 and 1 in the tp,pp,dp rank order), micro-batches 0-3 of 4.
    assert {e["pid"] for e in cut["traceEvents"] if e["ph"] == "X" and e["pid"] != LINKS_PID} == {0, 1}
    assert re.search(r"by default: the full timeline would have [\d,]+ slices", err)
    assert "--timeline-gpus all keeps them" in err
    full, err = timeline(capsys, tmp_path, synthetic_dir, "--timeline-gpus", "all", "--timeline-micro-batches", "all")
    assert "every GPU and micro-batch" in err and {e["pid"] for e in full["traceEvents"] if e["ph"] == "C"} == {0, 1, 2, 3}


@pytest.mark.parametrize("flags, message", [
    (["--timeline-gpus", "0,9"], "--timeline-gpus: GPU 9 does not exist (the platform has GPUs 0..3)"),
    (["--timeline-gpus", "-1"], "--timeline-gpus: GPU -1 does not exist"),
    (["--timeline-gpus", "gpu0"], "--timeline-gpus must be 'all' or a comma list of GPU indices (e.g. 0,1,8), "
                                  "got 'gpu0'"),
    (["--timeline-gpus", ""], "--timeline-gpus must be 'all' or a comma list"),
    (["--timeline-micro-batches", "0"], "--timeline-micro-batches must be 'all' or a whole number >= 1, got '0'"),
    (["--timeline-micro-batches", "2.5"], "--timeline-micro-batches must be 'all' or a whole number >= 1"),
    (["--timeline-micro-batches", "many"], "--timeline-micro-batches must be 'all' or a whole number >= 1"),
], ids=["out-of-range", "negative", "garbage", "empty", "zero", "fraction", "word"])
def test_bad_timeline_filters_are_one_line_exit_2(capsys, tmp_path: Path, synthetic_dir: Path, flags: list,
                                                  message: str) -> None:
    path = tmp_path / "t.json"
    code = main(["run", "-trace-dir", str(synthetic_dir), *HYBRID, "-q", "--timeline", str(path), *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("triosim: error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and not path.exists()


def test_timeline_filters_need_a_timeline(capsys, synthetic_dir: Path) -> None:
    assert main(["run", "-trace-dir", str(synthetic_dir), "-q", "--timeline-gpus", "0"]) == 2
    assert "--timeline-gpus chooses what the --timeline file keeps" in capsys.readouterr().err


def test_timeline_gpus_keep_their_host_link_copies(capsys, tmp_path: Path) -> None:
    """Activation offload's copies run on each GPU's host link (host<g>:d2h, host<g>:h2d): a GPU's
    own link, kept with the GPU as its NVLink and NIC links are."""
    assert link_gpus("host1:d2h") == link_gpus("host1:h2d") == frozenset({1})
    path = tmp_path / "t.json"
    assert main(["run", "--model", "llama3-8b", "--num-layers", "4", "--seq-len", "512", "--gpu", "h100-sxm",
                 "--pp", "2", "--global-batch", "4", "--offload-activations", "1", "-q", "--timeline", str(path),
                 "--timeline-gpus", "1"]) == 0
    capsys.readouterr()
    names = {n.split(" (")[0] for n in thread_names(json.loads(path.read_text())).values()}
    assert {"host1:d2h", "host1:h2d"} <= names and not {"host0:d2h", "host0:h2d"} & names
