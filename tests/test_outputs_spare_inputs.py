"""No output of any command replaces a file the command reads: every output flag (``run --json``,
``run --timeline``, ``dag --export``, ``plan --out``, ``plan --plot``, ``sweep --out``,
``sweep --plot``) against every kind of input (the trace's three files, ``--config``, ``--grid``,
``--topology-file``, ``--gpu-file``, ``--model-file``), named directly, through a symlink or
through a hard link: one line on stderr, exit code 2, the input unchanged."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from triosim.sample_trace import trace_dir

from triosim.cli.console import main
from triosim.hardware.device_db import packaged_dir as device_dir
from triosim.hardware.topology_file import packaged_dir as topology_dir

SAMPLE = trace_dir().parent / "gpt-cpu-bs8"
CARD = """name: tiny
layers: 2
hidden: 64
heads: 2
kv_heads: 2
ffn: 256
vocab: 128
seq_len: 32
activation: gelu
norm: layernorm
bias: true
tied_embeddings: true
attention: standard
position: learned
"""

# name -> (command, output flag, file suffix the command accepts for that output)
OUTPUTS = {
    "run --json": ("run", "--json", ".json"),
    "run --timeline": ("run", "--timeline", ".json"),
    "dag --export": ("dag", "--export", ".dot"),
    "plan --out": ("plan", "--out", ".csv"),
    "plan --plot": ("plan", "--plot", ".png"),
    "sweep --out": ("sweep", "--out", ".csv"),
    "sweep --plot": ("sweep", "--plot", ".png"),
}
TRACE_KINDS = ("trace.csv", "tensor.csv", "meta.json")
FILE_KINDS = ("--config", "--grid", "--topology-file", "--gpu-file", "--model-file")
HOW = ("path", "symlink", "hardlink")


def applies(output: str, kind: str, how: str) -> bool:
    command, _, suffix = OUTPUTS[output]
    if kind == "--config" and command not in ("run", "dag"):
        return False  # only run and dag read --config
    if kind == "--grid" and command != "sweep":
        return False
    if how == "path" and kind in TRACE_KINDS and command in ("plan", "sweep"):
        return Path(kind).suffix == suffix  # plan and sweep check the output's suffix first
    return True


CASES = [pytest.param(o, k, h, id=f"{o}-{k}-{h}") for o in OUTPUTS for k in (*TRACE_KINDS, *FILE_KINDS)
         for h in HOW if applies(o, k, h)]


def write_input(tmp: Path, kind: str, suffix: str) -> tuple[Path, list[str]]:
    """The input file of ``kind`` (named with ``suffix`` where the name is free) and the flags
    that make the command read it."""
    trace = tmp / "trace"
    shutil.copytree(SAMPLE, trace)
    if kind in TRACE_KINDS:
        return trace / kind, ["--trace-dir", str(trace)]
    f = tmp / f"input{suffix}"
    if kind == "--config":
        f.write_text('{"gpus": 1}\n')  # JSON: also YAML, whatever the suffix
    elif kind == "--grid":
        f.write_text('{"case": [0]}\n')
    elif kind == "--topology-file":
        shutil.copy(topology_dir() / "ring.yaml", f)
    elif kind == "--gpu-file":
        shutil.copy(device_dir() / "h100-sxm.yaml", f)
    else:
        f.write_text(CARD)
        return f, ["--model-file", str(f), "--gpu", "h100"]
    return f, [kind, str(f), "--trace-dir", str(trace)]


def command_line(output: str, reads: list[str], out: Path) -> list[str]:
    command, flag, _ = OUTPUTS[output]
    extra = {"run": ["-q"], "dag": [], "plan": ["--gpus", "2", "--global-batch", "8", "--top", "0", "-q"],
             "sweep": ["--case", "0", "-q", "--jobs", "1"]}[command]
    return [command, *reads, *extra, flag, str(out)]


@pytest.mark.parametrize(("output", "kind", "how"), CASES)
def test_no_output_replaces_an_input(output: str, kind: str, how: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    _, flag, suffix = OUTPUTS[output]
    if flag == "--plot":
        pytest.importorskip("matplotlib")
    src, reads = write_input(tmp_path, kind, suffix)
    out = src if how == "path" else tmp_path / f"other-name{suffix}"
    if how == "symlink":
        out.symlink_to(src)
    elif how == "hardlink":
        os.link(src, out)
    before = src.read_bytes()
    code = main(command_line(output, reads, out))
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{flag} {out}: refusing to overwrite an input file with an output" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert src.read_bytes() == before
    assert out.exists() and (out.is_symlink() or out.read_bytes() == before)
