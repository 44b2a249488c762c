"""DAG pictures: grouping tasks per layer / stage / collective keeps every task once and stays a DAG."""

from __future__ import annotations

import shutil
from pathlib import Path

import networkx as nx
import pytest

from triosim.config import configure
from triosim.graph import build_graph
from triosim.report import collapse as collapse_module
from triosim.report.collapse import collapse, parameter_ops
from triosim.report.dot_export import dag_picture

CONFIGS = [
    dict(case=0),
    dict(case=0, initial_placement="remote", capacity=22),
    dict(case=1, gpus=2),
    dict(case=2, gpus=4, collective_detail="expanded"),
    dict(case=3, gpus=2, collective_detail="expanded"),
    dict(case=4, gpus=2, micro_batch_size=4, schedule="1f1b"),
]


def _graph(synthetic_dir: Path, **flags):
    trace, platform, strategy = configure(trace_dir=str(synthetic_dir), **flags)
    return trace, build_graph(trace, platform, strategy)


def _is_dag(collapsed) -> bool:
    g = nx.DiGraph()
    g.add_nodes_from(range(len(collapsed.groups)))
    g.add_edges_from(collapsed.edges)
    return nx.is_directed_acyclic_graph(g)


@pytest.mark.parametrize("flags", CONFIGS, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
@pytest.mark.parametrize("mode", ["none", "layer", "stage"])
def test_every_task_in_one_group_and_the_picture_is_a_dag(synthetic_dir: Path, flags: dict, mode: str) -> None:
    trace, graph = _graph(synthetic_dir, **flags)
    c = collapse(graph, mode, param_ops=parameter_ops(trace))
    seen = sorted(t for g in c.groups for t in g.tasks)
    assert seen == list(range(len(graph)))
    assert all(c.groups[c.group_of[t]].tasks.count(t) == 1 for t in range(len(graph)))
    assert sum(g.compute_s(graph) for g in c.groups) == pytest.approx(
        sum(d for d, k in zip(graph.duration, graph.kind) if k == "compute"), rel=1e-12)
    assert _is_dag(c)
    # Only tasks of one GPU share a cluster group; collectives are one node each when collapsed.
    for g in c.groups:
        if g.device is not None:
            assert all(graph.devices[t] == (g.device,) for t in g.tasks if graph.kind[t] == "compute")
    if mode != "none":
        names = [graph.attrs[t]["collective"] for t in range(len(graph))
                 if graph.kind[t] == "transfer" and (graph.attrs[t] or {}).get("collective")]
        coll_groups = {c.group_of[t] for t in range(len(graph))
                       if graph.kind[t] == "transfer" and (graph.attrs[t] or {}).get("collective")}
        assert len(coll_groups) == len(set(names))


def test_coarser_modes_draw_fewer_nodes(synthetic_dir: Path) -> None:
    trace, graph = _graph(synthetic_dir, case=4, gpus=2, micro_batch_size=2)
    params = parameter_ops(trace)
    sizes = [len(collapse(graph, m, param_ops=params).groups) for m in ("none", "layer", "stage")]
    assert sizes[0] > sizes[1] > sizes[2]
    # stage: each group is one GPU's pass of one micro-batch
    stage = collapse(graph, "stage", param_ops=params)
    for g in stage.groups:
        if g.kind == "compute":
            assert len({(graph.devices[t], (graph.attrs[t] or {}).get("stage"),
                         (graph.attrs[t] or {}).get("microbatch")) for t in g.tasks}) == 1


def test_acyclicity_check_catches_a_planted_bug(synthetic_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted bug: never cut a run where a collective feeds it. Tensor parallelism then has a
    group that both feeds and waits for one all-gather: a cycle the test above would report."""
    monkeypatch.setattr(collapse_module, "enters_from_outside", lambda *a, **k: False)
    trace, graph = _graph(synthetic_dir, case=3, gpus=2, collective_detail="expanded")
    assert not _is_dag(collapse(graph, "stage", param_ops=parameter_ops(trace)))


def test_gpu_filter_keeps_only_what_touches_those_gpus(synthetic_dir: Path) -> None:
    _, graph = _graph(synthetic_dir, case=2, gpus=4, collective_detail="expanded")
    c = collapse(graph, "none", gpus={0, 1})
    kept = [t for g in c.groups for t in g.tasks]
    assert kept and all(set(graph.devices[t]) & {0, 1} for t in kept)
    assert all(graph.kind[t] != "compute" or graph.devices[t][0] in (0, 1) for t in kept)


def test_auto_collapses_beyond_max_nodes_and_says_so(synthetic_dir: Path) -> None:
    trace, graph = _graph(synthetic_dir, case=4, gpus=2, micro_batch_size=2)
    small = dag_picture(graph, trace, "auto", max_nodes=10_000)
    assert small.mode == "none" and small.note == "" and small.nodes == len(graph)
    picture = dag_picture(graph, trace, "auto", max_nodes=30)
    assert picture.mode in ("layer", "stage") and "more than --max-nodes 30" in picture.note
    assert 'rankdir=TB' in picture.dot.source


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_readme_example_renders_with_readable_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import struct

    from triosim.cli.console import main

    dot = tmp_path / "dag.dot"
    assert main(["dag", "-case", "4", "-GPUnumber", "2", "--export", str(dot), "--render", "png"]) == 0
    out = capsys.readouterr().out
    assert "drawn collapsed per layer" in out and "labels 13.3 px" in out
    header = (tmp_path / "dag.png").read_bytes()[:24]
    width, height = struct.unpack(">II", header[16:24])
    # Drawn at its natural size at 96 dpi (10 pt labels are 13.3 px), not squeezed to 1,600 px.
    assert f"rendered {tmp_path / 'dag.png'}: {width:,} x {height:,} px" in out
    assert width <= 16_384 and height <= 16_384
    assert main(["dag", "-case", "2", "-GPUnumber", "4", "--export", str(dot), "--show-gpus", "0,9"]) == 2
    assert "GPU 9 does not exist" in capsys.readouterr().err
