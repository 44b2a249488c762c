"""The command line: seed flags, outputs, determinism and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from triosim.cli.console import main, normalize_argv
from triosim.config import default_trace_dir


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_single_dash_flags_are_normalized():
    assert normalize_argv(["-trace-dir", "x", "-batch-size-sim", "-1", "-h"]) == [
        "--trace-dir", "x", "--batch-size-sim", "-1", "-h"]


def test_quiet_prints_the_reference_case0_time(capsys, vgg13_dir):
    code, out, err = run_cli(capsys, "-trace-dir", str(vgg13_dir), "-case", "0", "-batch-size", "128", "--quiet")
    assert code == 0 and out == "94.0380\n" and err == ""
    # Seed form without the sub-command, double dashes, same answer.
    code, out, _ = run_cli(capsys, "run", "--trace-dir", str(vgg13_dir), "--quiet")
    assert out == "94.0380\n"


def test_json_is_complete_and_byte_identical(capsys, tmp_path, synthetic_dir):
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for p in paths:
        code, _, _ = run_cli(capsys, "run", "-trace-dir", str(synthetic_dir), "--initial-placement", "remote",
                             "-bandwidth", "1", "--json", str(p), "--quiet")
        assert code == 0
    assert paths[0].read_bytes() == paths[1].read_bytes()
    data = json.loads(paths[0].read_text())
    for key in ("makespan_ms", "case", "gpus", "per_gpu", "per_link"):
        assert key in data
    assert set(data["per_gpu"][0]) >= {"gpu", "compute_ms", "comm_ms", "exposed_comm_ms", "idle_ms",
                                       "peak_memory_bytes"}
    assert data["per_link"][0]["link"] == "remote->gpu0"
    assert set(data["per_link"][0]) >= {"link", "bytes", "busy_ms", "utilization"}


def test_a_long_output_path_is_named_on_one_line(capsys, tmp_path, synthetic_dir):
    # a console 80 columns wide (no terminal) must not break the path it names
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "run.json"
    code, out, _ = run_cli(capsys, "run", "-trace-dir", str(synthetic_dir), "--json", str(path))
    assert code == 0 and f"JSON written to {path}" in out.splitlines()


def test_json_to_stdout_and_summary(capsys, synthetic_dir):
    code, out, _ = run_cli(capsys, "run", "-trace-dir", str(synthetic_dir), "--json", "-")
    assert code == 0 and json.loads(out)["case"] == 0
    code, out, _ = run_cli(capsys, "run", "-trace-dir", str(synthetic_dir))
    assert code == 0 and "Iteration time" in out and "Per GPU" in out


def test_timeline_to_stdout_is_the_only_output(capsys, tmp_path, synthetic_dir, monkeypatch):
    """``--timeline -`` prints the Chrome trace and nothing else (not the time, even with -q),
    and writes no file named ``-``."""
    monkeypatch.chdir(tmp_path)
    for extra in ((), ("--quiet",)):
        code, out, _ = run_cli(capsys, "run", "-trace-dir", str(synthetic_dir), "--timeline", "-", *extra)
        assert code == 0 and json.loads(out)["traceEvents"]
    assert not (tmp_path / "-").exists()


def test_timeline_is_chrome_trace(capsys, tmp_path, synthetic_dir):
    path = tmp_path / "tl.json"
    code, _, _ = run_cli(capsys, "run", "-trace-dir", str(synthetic_dir), "--initial-placement", "remote",
                         "--timeline", str(path), "--quiet")
    assert code == 0
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert any(e["cat"] == "compute" for e in spans) and any(e["cat"] == "memcpy" for e in spans)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "remote->gpu0"} <= names


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-trace-dir", "/nonexistent/trace"], "/nonexistent/trace: trace directory does not exist"),
        (["-GPUnumber", "0", "-case", "1"], "-GPUnumber must be >= 1"),
        (["-batch-size-sim", "0"], "-batch-size-sim must be a positive integer"),
        (["-batch-size", "-3"], "-batch-size must be a positive integer"),
        (["-micro-batch-size", "100000", "-case", "4"], "is larger than the simulated batch"),
        (["-micro-batch-size", "0", "-case", "4"], "-micro-batch-size must be a positive integer"),
        (["-capacity", "5"], "-capacity must be between 10 and 60"),
        (["-bandwidth", "0"], "-bandwidth must be > 0"),
        (["-ptp-bandwidth", "-1"], "-ptp-bandwidth must be > 0"),
        (["-case", "9"], "-case must be one of 0..4"),
        (["--schedule", "zigzag", "-case", "4"], "--schedule must be gpipe, 1f1b or interleaved"),
        (["-interconnects", "1", "-numRows", "3", "-numCols", "2", "-GPUnumber", "4", "-case", "1"],
         "optical mesh: -numRows × -numCols = 3 × 2 = 6, which is not -GPUnumber = 4"),
    ],
)
def test_bad_flags_exit_2_with_one_line(capsys, synthetic_dir, argv, message):
    if "-trace-dir" not in argv:
        argv = ["-trace-dir", str(synthetic_dir), *argv]
    code, out, err = run_cli(capsys, "run", *argv)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_trace_file_exit_2(capsys, tmp_path, synthetic_dir):
    bad = tmp_path / "bad"
    shutil.copytree(synthetic_dir, bad)
    text = (bad / "trace.csv").read_text().replace("[1; 2; 3]", "[1; 2; 977]", 1)
    (bad / "trace.csv").write_text(text)
    code, _, err = run_cli(capsys, "run", "-trace-dir", str(bad))
    assert code == 2
    assert err == ("triosim: error: trace.csv:2: Operator_input: references tensor 977, "
                   "which tensor.csv does not define\n")


def test_out_of_memory_exit_2(capsys, vgg13_dir):
    code, _, err = run_cli(capsys, "run", "-trace-dir", str(vgg13_dir), "-capacity", "31")
    assert code == 2 and "out of memory on GPU 0: op 3 (aten::conv2d, trace.csv:4)" in err


def test_outputs_never_replace_the_trace(capsys, tmp_path, synthetic_dir):
    before = (synthetic_dir / "trace.csv").read_bytes()
    code, _, err = run_cli(capsys, "run", "-trace-dir", str(synthetic_dir), "--json",
                           str(synthetic_dir / "trace.csv"))
    assert code == 2 and "refusing to overwrite an input file" in err
    assert (synthetic_dir / "trace.csv").read_bytes() == before


def test_dag_export_is_valid_dot(capsys, tmp_path, synthetic_dir):
    out = tmp_path / "dag.dot"
    code, stdout, _ = run_cli(capsys, "dag", "--case", "0", "-trace-dir", str(synthetic_dir),
                              "--initial-placement", "remote", "--export", str(out))
    assert code == 0 and out.read_text().startswith("digraph")
    assert "cluster_gpu0" in out.read_text()
    if shutil.which("dot"):
        proc = subprocess.run(["dot", "-Tsvg", str(out)], capture_output=True, text=True)
        assert proc.returncode == 0 and "<svg" in proc.stdout


def test_default_trace_is_embedded_and_runs_from_anywhere(tmp_path):
    assert (default_trace_dir() / "trace.csv").is_file()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "triosim.cli", "run", "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) > 0


def test_dag_refuses_huge_graphs(capsys, tmp_path, synthetic_dir):
    out = tmp_path / "big.dot"
    code, _, err = run_cli(capsys, "dag", "-case", "1", "-GPUnumber", "64", "-trace-dir", str(synthetic_dir),
                           "--export", str(out), "--max-tasks", "100", "--expand")
    assert code == 2 and "more than --max-tasks 100" in err and not out.exists()


def test_config_file_sets_flags_and_the_command_line_wins(tmp_path, capsys) -> None:
    cfg = tmp_path / "run.json"
    cfg.write_text('{"case": 2, "GPUnumber": 4, "bucket-mb": 5}')
    assert main(["run", "--config", str(cfg), "-q"]) == 0
    from_file = capsys.readouterr().out
    assert main(["run", "--case", "2", "--gpus", "4", "--bucket-mb", "5", "-q"]) == 0
    assert capsys.readouterr().out == from_file
    assert main(["run", f"--config={cfg}", "--case", "0", "-q"]) == 0
    assert main(["run", "--case", "0", "-q"]) == 0
    single, again = capsys.readouterr().out.split()
    assert single == again


def test_bad_config_file_is_one_line_exit_2(tmp_path, capsys) -> None:
    cfg = tmp_path / "run.json"
    cfg.write_text('{"gpus": "many"}')
    assert main(["run", "-config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(cfg) in err and "not an integer" in err


def test_json_config_block_round_trips_through_config(tmp_path, synthetic_dir) -> None:
    """run → JSON → --config (its config block, JSON or YAML) → the identical JSON."""
    first = tmp_path / "first.json"
    assert main(["run", "--trace-dir", str(synthetic_dir), "--case", "4", "--gpus", "2",
                 "--micro-batch-size", "4", "--ptp-bandwidth", "100", "--json", str(first), "-q"]) == 0
    doc = json.loads(first.read_text())
    block = doc["config"]
    assert block["case"] == 4 and block["micro-batch-size"] == 4 and block["ptp-bandwidth"] == 100.0
    assert block["trace-dir"] == str(synthetic_dir.resolve()) and len(block["trace_sha256"]) == 64
    assert block["triosim_version"] and doc["batch_source"] == "meta.json"
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(block))
    again = tmp_path / "again.json"
    assert main(["run", "--config", str(cfg), "--json", str(again), "-q"]) == 0
    assert again.read_bytes() == first.read_bytes()
    whole = tmp_path / "whole.json"  # the whole result is accepted too
    assert main(["run", "--config", str(first), "--json", str(whole), "-q"]) == 0
    assert whole.read_bytes() == first.read_bytes()
    yaml = pytest.importorskip("yaml")
    ycfg = tmp_path / "config.yaml"
    ycfg.write_text(yaml.safe_dump(block))
    via_yaml = tmp_path / "yaml.json"
    assert main(["run", "--config", str(ycfg), "--json", str(via_yaml), "-q"]) == 0
    assert via_yaml.read_bytes() == first.read_bytes()


def test_summary_says_when_op_times_are_cpu_times(capsys) -> None:
    assert main(["run", "--case", "0"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "op times measured on CPU" in out
    assert main(["run", "--case", "0", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["time_source"] == "cpu"


def test_config_from_a_result_warns_when_the_trace_changed(tmp_path, synthetic_dir, capsys) -> None:
    first = tmp_path / "first.json"
    assert main(["run", "--trace-dir", str(synthetic_dir), "--json", str(first), "-q"]) == 0
    capsys.readouterr()
    assert main(["run", "--config", str(first), "-q"]) == 0
    assert "warning" not in capsys.readouterr().err
    with open(synthetic_dir / "trace.csv", "a") as fh:
        fh.write("\n")  # same rows, different bytes
    assert main(["run", "--config", str(first), "-q"]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "trace.csv differs from the one the configuration was recorded with" in err


def test_summary_says_when_the_trace_batch_was_assumed(synthetic_dir, capsys) -> None:
    (synthetic_dir / "meta.json").unlink()
    assert main(["run", "--trace-dir", str(synthetic_dir)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "trace batch 128 assumed: no meta.json and no --batch-size" in out
    assert main(["run", "--trace-dir", str(synthetic_dir), "--batch-size", "8", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["batch_source"] == "flag"


def _console(*argv: str, cwd) -> subprocess.CompletedProcess:
    """The installed command's entry point, in a fresh interpreter."""
    code = "import sys; from triosim.cli.console import console_main; sys.argv[0] = 'triosim'; console_main()"
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_console_entry_exits_at_once_after_a_run_with_its_outputs_complete(tmp_path):
    """After `run` the command ends with os._exit: stdout and the JSON must be complete, the
    exit code kept; other commands and bad input exit the usual way."""
    out = tmp_path / "r.json"
    done = _console("run", "-q", "--json", str(out), cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.strip() == f"{json.loads(out.read_text())['makespan_ms']:.4f}"
    piped = _console("-case", "1", "-GPUnumber", "2", "--json", "-", cwd=tmp_path)  # `run` by default
    assert piped.returncode == 0 and json.loads(piped.stdout)["gpus"] == 2
    bad = _console("run", "-GPUnumber", "nan", cwd=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
    assert _console("--version", cwd=tmp_path).returncode == 0
