"""Notes printed before a run builds: the single ring of a run with no topology, a large whole build."""

from __future__ import annotations

from pathlib import Path

import triosim.graph.build_size as build_size
from triosim.cli.console import main, normalize_argv
from triosim.graph.build_size import unalike_build_note
from triosim.graph.strategy import Strategy
from triosim.hardware.presets import build_platform
from triosim.trace import load_trace

GPT = Path(__file__).resolve().parents[1] / "sample_trace" / "gpt-h16-cpu-bs8"
RING = "no topology given"


def _stderr(capsys, *argv: str) -> str:
    assert main(normalize_argv(["run", "-trace-dir", str(GPT), "-q", *argv])) == 0
    return capsys.readouterr().err


def test_more_than_8_gpus_on_the_default_ring_are_told(capsys):
    err = _stderr(capsys, "--dp", "2", "--tp", "8")
    assert RING in err and "16 GPUs" in err and len(err.strip().splitlines()) == 1


def test_no_ring_note_when_chosen_or_small(capsys):
    assert RING not in _stderr(capsys, "--dp", "2", "--tp", "8", "--topology", "ring")
    assert RING not in _stderr(capsys, "--dp", "2", "--tp", "8", "--topology", "nvlink-cluster")
    assert RING not in _stderr(capsys, "--dp", "2", "--tp", "4")


KW = dict(dp=2, tp=1, pp=3, micro_batch_size=2, schedule="1f1b")


def test_unalike_whole_build_is_told_with_its_task_count(monkeypatch):
    """dp 2 × pp 3 on nodes of 4 GPUs: replica 1 crosses a node that replica 0 does not."""
    trace = load_trace(GPT, batch_size=8)
    cluster = build_platform(num_gpus=6, topology="nvlink-cluster", gpus_per_node=4)
    monkeypatch.setattr(build_size, "NOTE_TASKS", 0)
    monkeypatch.setattr(build_size, "AUTO_EXACT_TASKS", 0)
    note = unalike_build_note(trace, cluster, Strategy(**KW))
    tasks = 2 * len(trace.ops) * 4  # dp·tp replicas × ops × 4 micro-batches
    assert note is not None and f"about {tasks:,} tasks" in note and "--gpus-per-node" in note
    assert unalike_build_note(trace, cluster, Strategy(exact=True, **KW)) is None
    alike = build_platform(num_gpus=6, topology="nvlink-cluster", gpus_per_node=3)
    assert unalike_build_note(trace, alike, Strategy(**KW)) is None


def test_small_whole_builds_are_not_told():
    trace = load_trace(GPT, batch_size=8)
    cluster = build_platform(num_gpus=6, topology="nvlink-cluster", gpus_per_node=4)
    assert unalike_build_note(trace, cluster, Strategy(**KW)) is None
