"""A folded ``-case`` build (GPU 0's program, every collective exactly over all GPUs, the other
GPUs its mirrors) against the every-GPU build: the same result to the bit, every figure of the
JSON but the task and edge counts, or the every-GPU build where a member of a collective ends
apart from GPU 0 (the tree all-reduce's root and leaves)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_capture import run

from triosim.config import configure
from triosim.errors import ConfigError
from triosim.graph import build_graph, builder
from triosim.graph.composition import MIRRORS_META
from triosim.report.result import Result, summarize
from triosim.schedule.list_scheduler import schedule

ROOT = Path(__file__).resolve().parents[2]
R18 = str(ROOT / "sample_trace" / "resnet18-cpu-bs16")
GPT = str(ROOT / "sample_trace" / "gpt-cpu-bs8")


def _result(fold: bool, **flags) -> tuple[dict, int, bool]:
    """The JSON result without its counts, the task count, and whether the graph was folded."""
    trace, platform, strategy = configure(**flags)
    graph = build_graph(trace, platform, strategy, fold=fold)
    sched = schedule(graph)
    per_gpu, per_link = summarize(graph, sched, platform)
    out = Result(sched.makespan, strategy, platform, graph, sched, per_gpu, per_link).to_dict()
    for key in ("tasks", "edges"):
        out.pop(key)
    return out, len(graph), bool(graph.meta.get(MIRRORS_META))


CASES = [
    dict(trace_dir=R18, case=1, gpus=8),
    dict(trace_dir=R18, case=2, gpus=8, reference_compat=True),
    dict(trace_dir=R18, case=2, gpus=16),
    dict(trace_dir=R18, case=2, gpus=8, topology="nvlink-cluster", gpus_per_node=4),
    dict(trace_dir=R18, case=3, gpus=4),
    dict(trace_dir=GPT, case=2, gpus=8, topology="switch"),
    dict(trace_dir=GPT, case=3, gpus=4, network="exclusive"),
]


@pytest.mark.parametrize("flags", CASES, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items() if k != "trace_dir"))
def test_folded_equals_every_gpu(flags) -> None:
    every, n_every, folded_every = _result(False, **flags)
    folded, n_folded, was_folded = _result(True, **flags)
    assert not folded_every
    assert was_folded and n_folded < n_every
    assert folded == every
    assert len(folded["per_gpu"]) == flags["gpus"]


def test_asymmetric_collective_builds_every_gpu(monkeypatch) -> None:
    """The double binary tree's members finish apart (its root and its leaves): the folded graph
    fails the check and every GPU is built. Kept folded (the planted bug: no check), the other
    GPUs took GPU 0's times and the per-GPU and per-link figures moved."""
    flags = dict(trace_dir=GPT, case=3, gpus=8, collective_algo="tree")
    every, n_every, _ = _result(False, **flags)
    result, n, was_folded = _result(True, **flags)
    assert not was_folded and n == n_every and result == every
    monkeypatch.setattr(builder, "mirrors_hold", lambda graph: graph.meta.pop("fold_checks") is not None)
    unchecked, _, was_folded = _result(True, **flags)
    assert was_folded and unchecked["makespan_ms"] == every["makespan_ms"]
    assert unchecked["per_gpu"] != every["per_gpu"] and unchecked["per_link"] != every["per_link"]


def test_exact_builds_every_gpu() -> None:
    _, n_every, _ = _result(False, trace_dir=R18, case=2, gpus=8)
    _, n, was_folded = _result(True, trace_dir=R18, case=2, gpus=8, exact=True)
    assert not was_folded and n == n_every


@pytest.mark.parametrize("case", [0, 4])
def test_representatives_refused_without_replicas(case) -> None:
    """--representatives was accepted on every -case and did nothing; cases 1-3 now fold (it
    asks for the default), case 0 and 4 have nothing to fold and say so."""
    with pytest.raises(ConfigError, match=rf"^--representatives: -case {case} has no replicas"):
        configure(trace_dir=R18, case=case, gpus=2, representatives=True)
    _, _, was_folded = _result(True, trace_dir=R18, case=2, gpus=4, representatives=True)
    assert was_folded


def test_run_folds_unless_a_timeline_needs_every_gpu(tmp_path) -> None:
    """`triosim run` folds a -case 2 run; with --timeline (every GPU's tracks) it builds them all."""
    out = {}
    for name, extra in (("plain", []), ("timeline", ["--timeline", str(tmp_path / "t.json")])):
        code, _, err = run(["run", "-trace-dir", R18, "-case", "2", "-GPUnumber", "4", "-q",
                            "--json", str(tmp_path / f"{name}.json"), *extra])
        assert code == 0, err
        out[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert out["plain"]["tasks"] < out["timeline"]["tasks"]
    for key in ("makespan_ms", "per_gpu", "per_link", "breakdown"):
        assert out["plain"][key] == out["timeline"][key]
