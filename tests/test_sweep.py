"""``triosim sweep``: grid expansion, validation, result files, backends (incl. a real Dask cluster)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from triosim.cli.console import main
from triosim.errors import ConfigError
from triosim.sweep import FlagTable, build_grid, read_grid_file, run_sweep
from triosim.sweep import execute as sweep_execute
from triosim.sweep.results import METRIC_COLUMNS, ResultFiles, Row, partial_path

# ----------------------------------------------------------------------------- a tiny trace

_SHAPES = {1: [8, 64], 2: [64, 64], 3: [8, 64], 4: [8, 64], 5: [64, 16], 6: [8, 16],
           7: [], 8: [8, 16], 9: [8, 64], 10: [64, 16], 11: [8, 64], 12: [64, 64]}
# name, stage, inputs, outputs, µs, tpflag, category of each input
_OPS = [
    ("aten::linear", "forward", [1, 2], [3], 120, 1, ["input", "weight"]),
    ("aten::relu", "forward", [3], [4], 20, 0, ["self"]),
    ("aten::linear", "forward", [4, 5], [6], 80, 1, ["input", "weight"]),
    ("aten::mse_loss", "forward", [6], [7], 10, 0, ["self"]),
    ("MseLossBackward0", "backward", [7, 6], [8], 10, 0, ["grad_output", "self"]),
    ("MmBackward0", "backward", [8, 4, 5], [9, 10], 150, 1, ["grad_output", "self", "weight"]),
    ("ReluBackward0", "backward", [9, 3], [11], 20, 0, ["grad_output", "self"]),
    ("MmBackward0", "backward", [11, 1, 2], [12], 200, 1, ["grad_output", "self", "weight"]),
    ("aten::_foreach_add_", "optimizer", [2, 5, 12, 10], [], 30, 0, ["self", "self", "other", "other"]),
]


def _numel(t: int) -> int:
    n = 1
    for d in _SHAPES[t]:
        n *= d
    return n


def _lst(xs: list[int]) -> str:
    return "[" + "; ".join(map(str, xs)) + "]"


def write_tiny_trace(root: Path) -> Path:
    """A two-layer MLP at batch 8: four forward ops, four backward ops, one optimizer op."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "trace.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["OperatorID", "OperatorName", "Operator_input", "Operator_output", "Operator_cudatime",
                    "Operator_cudatimenooverlap", "InputSize", "OutputSize", "gpuid", "stage", "tpflag"])
        for i, (name, stage, ins, outs, us, tp, _) in enumerate(_OPS, start=1):
            w.writerow([i, name, _lst(ins), _lst(outs), us + 2, us, _lst([_numel(t) for t in ins]),
                        _lst([_numel(t) for t in outs]), 0, stage, tp])
    with open(root / "tensor.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Index", "TensorID", "TensorShape", "TensorNumElement", "TensorEachByte", "TensorType",
                    "TensorStorgeid", "gpuid"])
        idx = 0
        for _, _, ins, outs, _, _, cats in _OPS:
            for t, cat in [*zip(ins, cats), *((t, "output") for t in outs)]:
                w.writerow([idx, t, str(_SHAPES[t]), _numel(t), 4, cat, 100 + t, 0])
                idx += 1
    return root


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_trace(tmp_path / "tiny")


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _sweep(tiny: Path, *flags: str) -> int:
    return main(["sweep", "--trace-dir", str(tiny), "--batch-size", "8", "-q", *flags])


# ----------------------------------------------------------------------------- the grid


def test_comma_lists_and_spellings_expand_in_given_order() -> None:
    table = FlagTable.from_cli()
    grid = build_grid(table, cli_entries=[("GPUnumber", ["2", "4"]), ("-case", ["0", "1"]),
                                          ("ptp_bandwidth", ["65", "300.5"])])
    assert grid.columns == ("gpus", "case", "ptp-bandwidth")
    pts = grid.points()
    # Case 0 runs on one GPU: its GPU count and GPU-to-GPU bandwidth do not apply, so the
    # eight combinations hold one case-0 configuration and four case-1 ones.
    assert len(grid) == 8 and len(pts) == 5
    assert [dict(p.values)["gpus"] for p in pts[:3]] == ["n/a", 2, 2]  # first axis slowest
    assert dict(pts[0].values) == {"gpus": "n/a", "case": 0, "ptp-bandwidth": "n/a"}
    assert dict(pts[-1].values) == {"gpus": 4, "case": 1, "ptp-bandwidth": 300.5}
    ns = pts[1].namespace()
    assert ns.gpus == 2 and ns.bandwidth == 696.0 and ns.micro_batch_size == -1  # run defaults
    every = build_grid(table, cli_entries=[("GPUnumber", ["2", "4"]), ("-case", ["0", "1"]),
                                           ("ptp_bandwidth", ["65", "300.5"])], every_combination=True)
    assert len(every.points()) == 8 and dict(every.points()[0].values)["gpus"] == 2


def test_flags_that_do_not_apply_collapse_per_case() -> None:
    """--micro-batch-size only shapes pipelines, --bucket-mb only DDP: 2 cases × 2 values → 3."""
    grid = build_grid(FlagTable.from_cli(), cli_entries=[("case", ["1", "2", "4"]), ("gpus", ["4"]),
                                                         ("micro-batch-size", ["default", "16"]),
                                                         ("bucket-mb", ["5", "25"])])
    shown = [(dict(p.values)["case"], dict(p.values)["micro-batch-size"], dict(p.values)["bucket-mb"])
             for p in grid.points()]
    assert shown == [(1, "n/a", "n/a"), (2, "n/a", 5.0), (2, "n/a", 25.0), (4, "default", "n/a"), (4, 16, "n/a")]
    configs = [dict(p.config) for p in grid.points()]
    assert all(c["micro_batch_size"] == -1 for c in configs if c["case"] != 4)  # run's default, not 16


def test_every_run_flag_is_sweepable() -> None:
    from argparse import ArgumentParser

    from triosim.config import add_sim_flags

    p = ArgumentParser()
    add_sim_flags(p)
    run_dests = {a.dest for a in p._actions if a.option_strings and a.dest != "help"}
    assert run_dests == {s.dest for s in FlagTable.from_cli().specs}


@pytest.mark.parametrize(
    "name, values, message",
    [
        ("gpus", ["2", "x"], "not an integer"),
        ("time-column", ["span", "median"], "not one of"),
        ("reference-compat", ["maybe"], "not a boolean"),
        ("no-such-flag", ["1"], "unknown flag"),
    ],
)
def test_bad_values_are_config_errors(name: str, values: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_grid(FlagTable.from_cli(), cli_entries=[(name, values)])


def test_default_word_and_duplicates() -> None:
    grid = build_grid(FlagTable.from_cli(), cli_entries=[("micro-batch-size", ["default", "4", "4"])])
    assert grid.axes[0].values == (-1, 4)


def test_grid_file_yaml_and_json_with_fixed_values_and_cli_override(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    y = tmp_path / "grid.yaml"
    y.write_text("case: [0, 1]\nGPUnumber: [2, 4, 8]\nbandwidth: 100\nfixed:\n  reference-compat: true\n")
    entries = read_grid_file(y)
    grid = build_grid(FlagTable.from_cli(), entries, cli_entries=[("gpus", ["16"])])
    assert grid.to_dict() == {"case": [0, 1], "gpus": [16], "bandwidth": [100.0], "reference-compat": [True]}
    j = tmp_path / "grid.json"
    j.write_text(json.dumps({"case": [0, 1], "gpus": [2, 4], "numRows": None}))
    grid = build_grid(FlagTable.from_cli(), read_grid_file(j))
    assert len(grid) == 4 and grid.to_dict()["numRows"] == [1]
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="mapping"):
        read_grid_file(bad)


# ----------------------------------------------------------------------------- runs and files


def test_grid_file_on_the_command_line(tiny: Path, tmp_path: Path) -> None:
    g = tmp_path / "grid.json"
    g.write_text(json.dumps({"case": [0, 1], "gpus": [2, 4], "fixed": {"bandwidth": 50}}))
    out = tmp_path / "r.csv"
    assert _sweep(tiny, "--grid", str(g), "--gpus", "8", "-j", "1", "--out", str(out)) == 0
    rows = _read_csv(out)
    assert [(r["case"], r["gpus"], r["bandwidth"]) for r in rows] == [("0", "n/a", "50.0"), ("1", "8", "50.0")]


def test_invalid_combination_is_recorded_not_fatal(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.csv"
    rc = _sweep(tiny, "--case", "0,4", "--interconnects", "1", "--numRows", "2", "--numCols", "2",
                "--gpus", "4,8", "--micro-batch-size=-1,16", "-j", "1", "--out", str(out))
    assert rc == 0
    rows = _read_csv(out)
    assert len(rows) == 5  # case 0 once (no mesh, no micro-batches on one GPU), case 4 four times
    assert list(rows[0]) == ["trace-dir", "batch-size", "case", "interconnects", "numRows", "numCols", "gpus", "micro-batch-size",
                             *METRIC_COLUMNS]
    by = {(r["case"], r["gpus"], r["micro-batch-size"]): r for r in rows}
    mesh = by[("4", "8", "default")]
    assert mesh["status"] == "invalid" and "numRows × -numCols = 2 × 2 = 4" in mesh["reason"]
    assert by[("4", "4", "16")]["status"] == "invalid" and "larger than the simulated batch" in by[("4", "4", "16")]["reason"]
    assert by[("0", "n/a", "n/a")]["status"] == "ok"  # case 0 ignores the mesh, as `triosim run` does
    assert by[("4", "4", "default")]["status"] == "ok"


def test_not_implemented_case_is_a_failed_row(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep_execute, "_builder_missing", lambda case: case == 3)
    out = tmp_path / "r.json"
    assert _sweep(tiny, "--case", "0,3", "--gpus", "2", "-j", "1", "--out", str(out)) == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] is True
    assert [(r["case"], r["status"]) for r in doc["rows"]] == [(0, "ok"), (3, "failed")]
    assert doc["rows"][1]["reason"] == "-case 3 (tensor parallel) is not implemented yet"


def test_sweep_matches_run_and_files_are_deterministic(tiny: Path, tmp_path: Path) -> None:
    flags = ["--case", "0,1,2", "--gpus", "2,4", "--bandwidth", "0.05,5", "--initial-placement", "gpu,remote"]
    a, b, j = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "a.json"
    assert _sweep(tiny, *flags, "-j", "1", "--out", str(a), "--out", str(j)) == 0
    assert _sweep(tiny, *flags, "-j", "2", "--out", str(b)) == 0  # a process pool
    assert a.read_bytes() == b.read_bytes()
    rows = _read_csv(a)
    assert [(r["case"], r["gpus"]) for r in rows[:5]] == [("0", "n/a")] * 4 + [("1", "2")]  # grid order
    assert len(rows) == 4 + 16
    doc = json.loads(j.read_text())
    assert [r["makespan_ms"] for r in doc["rows"]] == [float(r["makespan_ms"]) if r["makespan_ms"] else None
                                                       for r in rows]
    # One configuration through `triosim run --json` gives the same iteration time.
    rj = tmp_path / "run.json"
    assert main(["run", "--trace-dir", str(tiny), "--batch-size", "8", "--bandwidth", "0.05",
                 "--initial-placement", "remote", "--json", str(rj), "-q"]) == 0
    row = next(r for r in rows if r["case"] == "0" and r["bandwidth"] == "0.05" and r["initial-placement"] == "remote")
    assert float(row["makespan_ms"]) == json.loads(rj.read_text())["makespan_ms"]
    # One baseline shared by every row: the fastest case-0 configuration.
    base = min((x for x in rows if x["case"] == "0"), key=lambda x: float(x["makespan_ms"]))
    assert base["speedup"] == "1.0" and {r["speedup_vs"] for r in rows} == {"case 0"}
    for r in rows:
        if r["status"] == "ok":
            replicas = int(r["gpus"]) if r["case"] in ("1", "2") else 1  # data parallel: a batch per GPU
            expected = replicas * float(base["makespan_ms"]) / float(r["makespan_ms"])
            assert float(r["speedup"]) == pytest.approx(expected, rel=1e-6)


def test_speedup_without_case_0_is_against_the_fastest_on_fewest_gpus(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.csv"
    assert _sweep(tiny, "--case", "1,2", "--gpus", "2,4", "-j", "1", "--out", str(out)) == 0
    rows = _read_csv(out)
    two = [r for r in rows if r["gpus"] == "2"]
    best = max(two, key=lambda r: float(r["samples_per_s"]))
    label = f"case {best['case']}, 2 GPUs"
    assert {r["speedup_vs"] for r in rows} == {label} and best["speedup"] == "1.0"  # shared by both cases
    for r in rows:
        assert float(r["speedup"]) == pytest.approx(float(r["samples_per_s"]) / float(best["samples_per_s"]),
                                                    rel=1e-5)


def test_table_ranks_by_throughput_not_iteration_time(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """DDP on 4 GPUs trains 4 batches per iteration: it outranks case 0 though its iteration is longer."""
    assert main(["sweep", "--trace-dir", str(tiny), "--batch-size", "8", "--case", "0,2", "--gpus", "4",
                 "-j", "1"]) == 0
    out = capsys.readouterr().out
    first = next(line for line in out.splitlines() if "★" in line)
    assert first.split("│")[1].strip() == "2"
    assert main(["sweep", "--trace-dir", str(tiny), "--batch-size", "8", "--case", "0,2", "--gpus", "4",
                 "-j", "1", "--rank-by", "makespan_ms"]) == 0
    first = next(line for line in capsys.readouterr().out.splitlines() if "★" in line)
    assert first.split("│")[1].strip() == "0"


def test_progress_lines_when_stderr_is_not_a_terminal(tiny: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import triosim.sweep as sweep_pkg

    monkeypatch.setattr(sweep_pkg, "PROGRESS_EVERY_S", 0.0)
    assert main(["sweep", "--trace-dir", str(tiny), "--batch-size", "8", "--bandwidth", "1,2,3", "-j", "1"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if " simulated, " in ln]
    assert [ln.split()[1] for ln in lines][:3] == ["1/3", "2/3", "3/3"]


def test_csv_is_appended_while_running(tmp_path: Path, tiny: Path) -> None:
    grid = build_grid(FlagTable.from_cli(), cli_entries=[("trace-dir", [str(tiny)]), ("batch-size", ["8"]),
                                                         ("bandwidth", ["1", "2", "3"])])
    path = tmp_path / "live.csv"
    seen: list[int] = []
    with ResultFiles([str(path)], grid.columns, {}) as files:
        def on_row(row: Row) -> None:
            files.add(row)
            seen.append(len(_read_csv(partial_path(path))))  # another reader sees the rows so far

        result = run_sweep(grid, jobs=1, on_row=on_row)
        files.finish(result.rows, result.complete)
    assert seen == [1, 2, 3]
    assert [r["bandwidth"] for r in _read_csv(path)] == ["1.0", "2.0", "3.0"]
    assert not partial_path(path).exists()  # a complete sweep leaves only the target


def test_interrupt_keeps_finished_rows(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = sweep_execute.run_task
    calls = {"n": 0}

    def flaky(traces, task):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # what Ctrl-C does in the middle of the fourth configuration
        return real(traces, task)

    monkeypatch.setattr(sweep_execute, "run_task", flaky)
    c, j = tmp_path / "r.csv", tmp_path / "r.json"
    c.write_text("an earlier sweep's results\n")
    rc = _sweep(tiny, "--bandwidth", "1,2,3,4,5,6", "-j", "1", "--out", str(c), "--out", str(j))
    assert rc == 130
    # The finished rows are kept beside the targets; the earlier results file is untouched.
    rows = _read_csv(partial_path(c))
    assert [r["bandwidth"] for r in rows] == ["1.0", "2.0", "3.0"] and {r["status"] for r in rows} == {"ok"}
    doc = json.loads(partial_path(j).read_text())
    assert doc["complete"] is False and len(doc["rows"]) == 3
    assert c.read_text() == "an earlier sweep's results\n" and not j.exists()


def test_plot_lines_follow_plot_x_and_share_one_baseline(tiny: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from triosim.sweep.plot import plot_lines

    png = tmp_path / "scaling.png"
    assert _sweep(tiny, "--case", "0,1", "--gpus", "2,4,8", "-j", "1", "--plot", str(png)) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    grid = build_grid(FlagTable.from_cli(), cli_entries=[("trace-dir", [str(tiny)]), ("batch-size", ["8"]),
                                                         ("case", ["0", "1"]), ("gpus", ["2", "4"]),
                                                         ("ptp-bandwidth", ["1", "100"])])
    rows = run_sweep(grid, jobs=1).rows
    swept = [a.spec.name for a in grid.swept]
    # x = GPUs: one line per (case, bandwidth) of case 1, and case 0 as one reference line.
    lines = plot_lines(rows, "gpus", "speedup", swept)
    assert [ln.reference for ln in lines] == [True, False, False]
    assert lines[0].points == (("n/a", 1.0),)  # case 0 is the shared baseline
    assert [x for x, _ in lines[1].points] == [2, 4]
    # x = bandwidth: one line per GPU count, not one dot per case.
    lines = plot_lines(rows, "ptp-bandwidth", "samples_per_s", swept)
    by_label = {ln.label: [x for x, _ in ln.points] for ln in lines if not ln.reference}
    assert by_label == {"case 1: data parallel, gpus=2": [1.0, 100.0], "case 1: data parallel, gpus=4": [1.0, 100.0]}
    svg = tmp_path / "bw.svg"
    assert _sweep(tiny, "--case", "1", "--gpus", "2,4", "--ptp-bandwidth", "1,100", "-j", "1", "--plot", str(svg),
                  "--plot-x", "ptp_bandwidth", "--plot-y", "makespan_ms") == 0
    assert b"ptp-bandwidth" in svg.read_bytes()


@pytest.mark.parametrize("flags, message", [
    (["--plot-x", "capacity"], "--plot-x capacity: not a swept flag"),
    (["--plot-y", "speed"], "--plot-y speed: each column must be one of"),
])
def test_bad_plot_axes_fail_before_running(tiny: Path, tmp_path: Path, flags: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert _sweep(tiny, "--case", "1", "--gpus", "2,4", "--plot", str(tmp_path / "p.png"), *flags) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "p.png").exists()


def test_plot_without_matplotlib_is_a_clear_error(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert _sweep(tiny, "--case", "1", "--gpus", "2,4", "--plot", str(tmp_path / "p.png")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["triosim: error: --plot needs matplotlib: pip install 'triosim[plot]'"]
    assert not (tmp_path / "p.png").exists()


def test_bad_output_name_fails_before_running(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _sweep(tiny, "--gpus", "2,4", "--out", str(tmp_path / "r.txt")) == 2
    assert "must end in .csv or .json" in capsys.readouterr().err


def test_single_dash_seed_spellings(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.csv"
    assert main(["sweep", "-trace-dir", str(tiny), "-batch-size", "8", "-GPUnumber", "2,4", "-case", "1",
                 "-q", "-j", "1", "--out", str(out)]) == 0
    assert [r["gpus"] for r in _read_csv(out)] == ["2", "4"]


def test_core_import_stays_light() -> None:
    code = ("import sys, triosim.cli.console, triosim.sweep; triosim.cli.console.build_parser(); "
            "bad = [m for m in ('dask', 'distributed', 'matplotlib', 'yaml') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ----------------------------------------------------------------------------- a real Dask cluster


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def dask_cluster(tmp_path: Path):
    """A `dask scheduler` and two `dask worker` processes on 127.0.0.1, killed at teardown."""
    pytest.importorskip("distributed")
    from distributed import Client

    sched_file = tmp_path / "scheduler.json"
    log = open(tmp_path / "dask.log", "w")
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> None:
        # Own session, so teardown can stop the process and its nanny's children together.
        procs.append(subprocess.Popen([sys.executable, "-m", *args], cwd=tmp_path, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))

    client = None
    try:
        start("distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
              "--scheduler-file", str(sched_file))

        def ready() -> bool:
            try:
                return "address" in json.loads(sched_file.read_text())
            except (OSError, ValueError):
                return False

        _wait_for(ready, 30, "the Dask scheduler")
        for _ in range(2):
            start("distributed.cli.dask_worker", "--scheduler-file", str(sched_file), "--host", "127.0.0.1",
                  "--nworkers", "1", "--nthreads", "1", "--no-dashboard")
        client = Client(scheduler_file=str(sched_file), timeout=20, set_as_default=False)
        client.wait_for_workers(2, timeout=30)
        yield sched_file, json.loads(sched_file.read_text())["address"], client
    finally:
        if client is not None:
            client.close()
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        log.close()


def test_dask_cluster_gives_the_pool_numbers(dask_cluster, tiny: Path, tmp_path: Path) -> None:
    sched_file, address, client = dask_cluster
    client.get_task_stream()  # registers the scheduler's task-stream plugin before the sweep runs
    t0 = time.time()
    flags = ["--case", "0,1,2", "--gpus", "2,4", "--bandwidth", "0.05,5,500", "--initial-placement", "gpu,remote"]
    d, dj, p = tmp_path / "dask.csv", tmp_path / "dask.json", tmp_path / "pool.csv"
    assert _sweep(tiny, *flags, "--dask", address, "--out", str(d), "--out", str(dj)) == 0
    assert _sweep(tiny, *flags, "-j", "2", "--out", str(p)) == 0
    assert d.read_bytes() == p.read_bytes()
    rows = _read_csv(d)
    assert len(rows) == 6 + 24 and sum(r["status"] == "ok" for r in rows) >= 12  # case 0 once per bandwidth×placement
    assert json.loads(dj.read_text())["complete"] is True
    # The configurations really ran on the cluster, spread over both workers.
    stream = [t for t in client.get_task_stream(start=t0) if str(t["key"]).startswith("triosim-sweep-")]
    assert len(stream) >= sum(r["status"] == "ok" for r in rows)
    assert len({t["worker"] for t in stream}) == 2
    # The scheduler file works as the address too.
    s = tmp_path / "s.csv"
    assert _sweep(tiny, "--case", "1", "--gpus", "2,4,8", "--dask", str(sched_file), "--out", str(s)) == 0
    assert len(_read_csv(s)) == 3


def test_unreachable_dask_scheduler_is_a_clear_error(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("distributed")
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rc = main(["sweep", "--trace-dir", str(tiny), "--batch-size", "8", "--gpus", "2,4,8", "-q",
               "--dask", f"tcp://127.0.0.1:{port}", "--dask-timeout", "2"])
    assert rc == 2
    assert "cannot reach the Dask scheduler" in capsys.readouterr().err


# ----------------------------------------------------------------------------- reference trace


@pytest.mark.reference
def test_reference_vgg13_sweep_matches_run(vgg13_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "v.csv"
    assert main(["sweep", "--trace-dir", str(vgg13_dir), "--case", "0,1", "--gpus", "2,4",
                 "--ptp-bandwidth", "65,300", "-q", "--out", str(out)]) == 0
    rows = _read_csv(out)
    assert [float(r["makespan_ms"]) for r in rows if r["case"] == "0"] == [94.038]  # one GPU: simulated once
    for r in rows:
        if r["case"] == "1" and r["status"] == "ok":
            rj = tmp_path / "run.json"
            assert main(["run", "--trace-dir", str(vgg13_dir), "--case", "1", "--gpus", r["gpus"],
                         "--ptp-bandwidth", r["ptp-bandwidth"], "--json", str(rj), "-q"]) == 0
            assert float(r["makespan_ms"]) == json.loads(rj.read_text())["makespan_ms"]


def test_num_layers_is_a_sweep_axis_matching_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from triosim.config import default_trace_dir

    gpt = default_trace_dir().parent / "gpt-cpu-bs8"
    out = tmp_path / "r.csv"
    assert main(["sweep", "--trace-dir", str(gpt), "--num-layers", "2,4", "-j", "1", "-q", "--out", str(out)]) == 0
    rows = _read_csv(out)
    capsys.readouterr()
    for row in rows:
        assert main(["run", "--trace-dir", str(gpt), "--num-layers", row["num-layers"], "-q"]) == 0
        assert float(capsys.readouterr().out) == pytest.approx(float(row["makespan_ms"]), abs=1e-4)
    assert rows[0]["makespan_ms"] != rows[1]["makespan_ms"]


def test_hybrid_degrees_rank_by_samples_of_the_data_parallel_replicas(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "h.csv"
    assert _sweep(tiny, "--dp", "1,2", "--tp", "1,2", "-j", "1", "--out", str(out)) == 0
    rows = {(r["dp"], r["tp"]): r for r in _read_csv(out)}
    assert set(rows) == {("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")}
    for (dp, _), r in rows.items():
        assert float(r["samples_per_s"]) == pytest.approx(8 * int(dp) / (float(r["makespan_ms"]) / 1e3), rel=1e-6)
    assert {r["speedup_vs"] for r in rows.values()} == {"dp1 × tp1, 1 GPU"}


def test_sweep_title_says_when_op_times_are_cpu_times(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--case", "1", "--gpus", "2,4", "-j", "1"]) == 0  # the embedded CPU sample
    assert "op times measured on CPU" in capsys.readouterr().out


def test_plot_lines_of_one_case_share_a_colour() -> None:
    from triosim.sweep.plot import Line, line_styles

    lines = [Line("a", (), key=(("case", 1), ("ptp-bandwidth", 65.0))),
             Line("b", (), key=(("case", 1), ("ptp-bandwidth", 300.0))),
             Line("c", (), key=(("case", 2), ("ptp-bandwidth", 65.0)))]
    assert [(c, style) for c, style, _ in line_styles(lines)] == [(0, "-"), (0, "--"), (1, "-")]


def test_fp8_and_optimizer_dtype_flags_apply_only_where_their_switch_is_on() -> None:
    """`run` refuses --fp8-recipe without --dtype fp8 and an optimizer dtype without
    --use-precision-aware-optimizer: a sweep over the switch keeps its off point as the baseline."""
    grid = build_grid(FlagTable.from_cli(), cli_entries=[("dtype", ["bf16", "fp8"]), ("fp8-recipe", ["delayed", "current"]),
                                                         ("fp8-param-gather", ["false", "true"])])
    shown = [(v["dtype"], v["fp8-recipe"], v["fp8-param-gather"]) for v in (dict(p.values) for p in grid.points())]
    assert shown == [("bf16", "n/a", "n/a"), ("fp8", "delayed", False), ("fp8", "delayed", True),
                     ("fp8", "current", False), ("fp8", "current", True)]
    grid = build_grid(FlagTable.from_cli(), cli_entries=[("use-precision-aware-optimizer", ["false", "true"]),
                                                         ("exp-avg-dtype", ["bf16"]), ("main-grads-dtype", ["bf16"])])
    configs = [dict(p.config) for p in grid.points()]
    assert [(c["use_precision_aware_optimizer"], c["exp_avg_dtype"], c["main_grads_dtype"]) for c in configs] == \
        [(False, "fp32", "fp32"), (True, "bf16", "bf16")]  # run's defaults where the switch is off


def test_progress_lines_count_invalid_points_as_invalid(tiny: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A point `run` refuses is invalid in the progress lines as in the closing count, not failed."""
    import triosim.sweep as sweep_pkg

    monkeypatch.setattr(sweep_pkg, "PROGRESS_EVERY_S", 0.0)
    assert main(["sweep", "--trace-dir", str(tiny), "--batch-size", "8", "--dtype", "bf16,fp32",
                 "--use-precision-aware-optimizer", "-j", "1"]) == 0
    captured = capsys.readouterr()
    assert "1 ok, 1 invalid, 0 failed" in captured.out
    lines = [ln for ln in captured.err.splitlines() if " simulated, " in ln]
    assert lines and lines[-1].startswith("sweep: 2/2 simulated, 1 invalid, "), lines


def test_gpus_with_degrees_derives_dp_as_run_does(tiny: Path, tmp_path: Path) -> None:
    """`run -GPUnumber 4 --tp 2` is dp 2 (Megatron derives it); the sweep's speed-ups counted the
    GPUs without that and refused every such sweep after simulating it."""
    out = tmp_path / "g.csv"
    assert _sweep(tiny, "--gpus", "4", "--tp", "1,2", "-j", "1", "--out", str(out)) == 0
    rows = {r["tp"]: r for r in _read_csv(out)}
    assert [rows[t]["status"] for t in ("1", "2")] == ["ok", "ok"]
    assert rows["1"]["speedup_vs"] in ("dp4 × tp1, 4 GPUs", "dp2 × tp2, 4 GPUs")
    for tp, dp in (("1", 4), ("2", 2)):  # dp replicas of batch 8 each
        assert float(rows[tp]["samples_per_s"]) == pytest.approx(8 * dp / (float(rows[tp]["makespan_ms"]) / 1e3),
                                                                 rel=1e-6)


def test_recompute_details_follow_a_swept_granularity() -> None:
    """`--recompute none,full --recompute-num-layers 2`: the none point recomputes nothing (the
    layer count belongs to full); given alone, the count still implies full recomputation."""
    grid = build_grid(FlagTable.from_cli(), cli_entries=[("pp", ["2"]), ("recompute", ["none", "selective", "full"]),
                                                         ("recompute-num-layers", ["2"]),
                                                         ("recompute-modules", ["mlp"])])
    configs = [dict(p.config) for p in grid.points()]
    assert [(c["recompute"], c["recompute_num_layers"], c["recompute_modules"]) for c in configs] == \
        [("none", None, None), ("selective", None, "mlp"), ("full", 2, None)]
    grid = build_grid(FlagTable.from_cli(), cli_entries=[("pp", ["2"]), ("recompute-num-layers", ["1", "2"])])
    assert [dict(p.config)["recompute_num_layers"] for p in grid.points()] == [1, 2]


def test_a_layout_of_virtual_stages_runs_in_a_sweep_and_a_config_file_as_in_run(tmp_path: Path,
                                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`run --pp 2 --pipeline-model-parallel-layout 'Et|t|t|tL'` is interleaved over V = 2, as
    Megatron derives it; a sweep's point and a --config file were refused (the schedule missing)."""
    card = ["--model", "llama3-8b", "--num-layers", "4", "--seq-len", "1024", "--gpu", "h100-sxm", "--global-batch", "4"]
    layout = "Et|t|t|tL"
    assert main(["run", *card, "--pp", "2", "--pipeline-model-parallel-layout", layout, "-q"]) == 0
    expected = float(capsys.readouterr().out)
    out = tmp_path / "l.csv"
    assert main(["sweep", *card, "--pp", "2", "--pipeline-model-parallel-layout", layout, "-j", "1", "-q",
                 "--out", str(out)]) == 0
    (row,) = _read_csv(out)
    assert row["status"] == "ok" and float(row["makespan_ms"]) == pytest.approx(expected, abs=1e-4)
    config = tmp_path / "c.yaml"
    config.write_text(f'pp: 2\npipeline-model-parallel-layout: "{layout}"\n')
    capsys.readouterr()
    assert main(["run", *card, "--config", str(config), "-q"]) == 0
    assert float(capsys.readouterr().out) == expected
