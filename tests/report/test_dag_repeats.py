"""DAG pictures at LLM scale: repeated layers and micro-batches collapse to a few hundred nodes
that still hold every task once, every GPU and stage, and say how many repeats each node is."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from triosim.cli.console import main
from triosim.config import configure
from triosim.graph import build_graph
from triosim.report.collapse import parameter_ops
from triosim.report.repeats import DETAIL_LEVELS, MIN_REPEATS, collapse_repeats, find_runs
from triosim.schedule.tasks import KINDS

# A Llama-2 card cut to 16 layers on dp 2 x tp 2 x pp 2 with 16 micro-batches, built as the
# 70B run is (one GPU per role, macro collectives): 4,181 tasks, the structure of 68,000.
LLM_LIKE = ["--model", "llama2-7b", "--num-layers", "16", "--gpu", "h100-sxm", "--tp", "2", "--dp", "2",
            "--pp", "2", "--global-batch", "32", "-micro-batch-size", "1", "--schedule", "1f1b",
            "--representatives", "--overlap-grad-reduce"]
_NODE = re.compile(r'^\s*(g\d+) \[label="((?:[^"\\]|\\.)*)"', re.M)
_COUNT = re.compile(r"([\d,]+) (" + "|".join(KINDS) + r")\b")


def node_labels(dot: str) -> dict[str, str]:
    return {name: label for name, label in _NODE.findall(dot)}


def label_counts(dot: str) -> Counter:
    """Tasks per kind as the node labels say (``tasks: 36 compute · 36 collective``)."""
    total: Counter = Counter()
    for label in node_labels(dot).values():
        line = next(part for part in label.split("\\n") if part.startswith("tasks: "))
        for n, kind in _COUNT.findall(line):
            total[kind] += int(n.replace(",", ""))
    return total


def _graph(argv: list[str]):
    from triosim.cli.console import build_parser, normalize_argv

    args = build_parser().parse_args(["dag", *normalize_argv(argv)])
    trace, platform, strategy = configure(args)
    return trace, build_graph(trace, platform, strategy)


def test_llm_like_dag_collapses_under_500_nodes_and_keeps_what_matters(tmp_path: Path, capsys) -> None:
    out = tmp_path / "dag.dot"
    assert main(["dag", *LLM_LIKE, "--export", str(out)]) == 0
    printed = capsys.readouterr().out
    dot = out.read_text()
    labels = node_labels(dot)
    trace, graph = _graph(LLM_LIKE)
    assert len(graph) > 4_000 and len(labels) <= 150  # the default --max-nodes, far under 500
    assert f"wrote {out}: {len(labels):,} nodes" in printed and f"from {len(graph):,} tasks" in printed
    assert "drawn collapsed by repeats" in printed
    # Every task once: the labels' counts add up to the DAG's tasks of each kind.
    assert label_counts(dot) == Counter(k for k in graph.kind)
    # Every GPU and pipeline stage the DAG builds has its cluster.
    built = {graph.devices[t][0] for t in range(len(graph)) if graph.kind[t] == "compute"}
    assert set(map(int, re.findall(r"subgraph cluster_gpu(\d+)", dot))) == built
    for dev in built:
        assert graph.meta["cluster_names"][dev] in dot
    # Repeats are named with their count; the first and last layer and micro-batch stay.
    texts = list(labels.values())
    assert any("forward mb 0 · repeats 2–6 of 7 (×5)" in t for t in texts)  # 8 layers a stage
    assert any(re.search(r"forward mb \d+–\d+, backward mb \d+–\d+ \(×1[34]\)", t) for t in texts)  # 1F1B
    assert any(t.startswith("forward mb 15") for t in texts) and any("backward mb 15" in t for t in texts)
    assert any(t.startswith("collectives · repeats 2–") for t in texts)  # gradient buckets


@pytest.mark.parametrize("detail", DETAIL_LEVELS)
def test_every_task_in_one_node_and_counts_add_up(detail) -> None:
    trace, graph = _graph(LLM_LIKE)
    c = collapse_repeats(graph, param_ops=parameter_ops(trace), detail=detail)
    assert sorted(t for g in c.groups for t in g.tasks) == list(range(len(graph)))
    assert all(c.group_of[t] is not None and t in c.groups[c.group_of[t]].tasks for t in range(len(graph)))
    assert all(u != v for u, v in c.edges)
    sizes = [len(collapse_repeats(graph, param_ops=parameter_ops(trace), detail=d).groups) for d in DETAIL_LEVELS]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0]


@pytest.mark.parametrize("flags", [
    dict(case=2, gpus=4, collective_detail="expanded"),
    dict(case=3, gpus=2),
    dict(case=4, gpus=2, micro_batch_size=1, schedule="1f1b"),
    dict(dp=2, pp=2, micro_batch_size=1, schedule="1f1b"),
], ids=["ddp", "tensor", "pipeline", "hybrid"])
def test_repeats_hold_every_task_once_on_other_builds(synthetic_dir: Path, flags: dict) -> None:
    trace, platform, strategy = configure(trace_dir=str(synthetic_dir), **flags)
    graph = build_graph(trace, platform, strategy)
    c = collapse_repeats(graph, param_ops=parameter_ops(trace))
    assert sorted(t for g in c.groups for t in g.tasks) == list(range(len(graph)))
    for g in c.groups:  # a node in a GPU's cluster holds that GPU's work only
        if g.device is not None:
            assert all(g.device in graph.devices[t] for t in g.tasks)


def test_find_runs_keeps_first_and_last_and_prefers_a_layer_start() -> None:
    # E, A, (C1 A C2 A) x 5, H: the unit starts at its compute, not at the collective before it.
    sigs = ["E", "A", *["C1", "A", "C2", "A"] * 5, "H"]
    runs = find_runs(sigs, prefer_start=lambda i: sigs[i].startswith("C"))
    assert runs == [(0, 1, 1), (1, 1, 1), (2, 4, 5), (22, 1, 1)]
    assert find_runs(list("ab" * (MIN_REPEATS - 1))) == [(i, 1, 1) for i in range(2 * (MIN_REPEATS - 1))]
    assert find_runs(list("xaaaaay")) == [(0, 1, 1), (1, 1, 5), (6, 1, 1)]


def test_expand_draws_every_task_as_collapse_none_did(tmp_path: Path, capsys, synthetic_dir: Path) -> None:
    argv = ["dag", "-trace-dir", str(synthetic_dir), "-case", "4", "-GPUnumber", "2", "-micro-batch-size", "2"]
    assert main([*argv, "--expand", "--export", str(tmp_path / "a.dot")]) == 0
    assert main([*argv, "--collapse", "none", "--export", str(tmp_path / "b.dot")]) == 0
    printed = capsys.readouterr().out
    expanded = (tmp_path / "a.dot").read_text()
    assert expanded == (tmp_path / "b.dot").read_text()
    trace, platform, strategy = configure(trace_dir=str(synthetic_dir), case=4, gpus=2, micro_batch_size=2)
    graph = build_graph(trace, platform, strategy)
    assert len(node_labels(expanded)) == len(graph) and "(one node per task)" in printed
    assert main([*argv, "--expand", "--collapse", "stage", "--export", str(tmp_path / "c.dot")]) == 2
    assert "--expand draws every task; --collapse stage groups them" in capsys.readouterr().err


def test_max_tasks_limits_what_is_drawn(tmp_path: Path, capsys) -> None:
    out = tmp_path / "big.dot"
    _, graph = _graph(LLM_LIKE)
    assert main(["dag", *LLM_LIKE, "--export", str(out), "--max-tasks", "1000", "--expand"]) == 2
    err = capsys.readouterr().err
    assert f"the task graph has {len(graph):,} tasks, more than --max-tasks 1,000" in err and not out.exists()
    assert main(["dag", *LLM_LIKE, "--export", str(out), "--max-tasks", "1000"]) == 0  # collapsed: 100 nodes
    assert main(["dag", *LLM_LIKE, "--export", str(out), "--max-tasks", "20"]) == 2
    assert "the picture has" in capsys.readouterr().err
