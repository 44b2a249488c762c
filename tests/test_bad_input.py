"""Every bad input a user can give: one line on stderr naming the file/row/field or the flag,
exit code 2, never a traceback, never a silent wrong answer.

One table row per case found by the robustness audit (bad trace cells, bad meta.json, NaN and
infinite flags, unusable output paths, mistyped flags, flags that do not apply, too many GPUs).
Run this file as a script to print the table with each case's exit code and message.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from triosim.cli.console import main
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace


def set_cell(path: Path, row: int, column: str, value: str) -> None:
    """Replace one cell of a CSV (``row`` 0 is the first data row, i.e. line 2)."""
    rows = list(csv.reader(io.StringIO(path.read_text())))
    rows[row + 1][rows[0].index(column)] = value
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    path.write_text(buf.getvalue())


def duplicate_row(path: Path, row: int, column: str, value: str) -> None:
    """Append a copy of data row ``row`` with ``column`` changed."""
    rows = list(csv.reader(io.StringIO(path.read_text())))
    copy = list(rows[row + 1])
    copy[rows[0].index(column)] = value
    rows.append(copy)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    path.write_text(buf.getvalue())


def write_topology(d: Path, text: str) -> None:
    """A topology file beside the trace: ``{trace}/../topo.yaml``."""
    (d.parent / "topo.yaml").write_text(text)


SUPERPOD = (Path(__file__).resolve().parents[1] / "topologies" / "dgx-h100-superpod.yaml").read_text()
TOPO = "{trace}/../topo.yaml"


def write_meta(d: Path, text: str) -> None:
    (d / "meta.json").write_text(text)


def insert_bytes(path: Path, line: int, data: bytes) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[line - 1] = lines[line - 1] + data
    path.write_bytes(b"\n".join(lines))


def swap_lines(path: Path, a: int, b: int) -> None:
    """Swap lines ``a`` and ``b`` (1-based) of a text file."""
    lines = path.read_text().split("\n")
    lines[a - 1], lines[b - 1] = lines[b - 1], lines[a - 1]
    path.write_text("\n".join(lines))


def add_input(d: Path, row: int, tensor: str, numel: int) -> None:
    """Append ``tensor`` (of ``numel`` elements) to data row ``row``'s Operator_input and InputSize."""
    rows = list(csv.reader(io.StringIO((d / "trace.csv").read_text())))
    r, head = rows[row + 1], rows[0]
    for col, value in (("Operator_input", tensor), ("InputSize", str(numel))):
        i = head.index(col)
        r[i] = r[i][:-1] + f"; {value}]"
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    (d / "trace.csv").write_text(buf.getvalue())


def scratch_file(d: Path, name: str, data: str | bytes) -> None:
    """A file in the scratch directory ``{tmp}`` (beside the trace)."""
    scratch = d.parent / "scratch"
    scratch.mkdir(exist_ok=True)
    (scratch / name).write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))


def _card_text() -> str:
    from triosim.trace.model_card import packaged_dir

    return (packaged_dir() / "megatron-22b.yaml").read_text(encoding="utf-8")


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"b{i}: &b{i} [{', '.join([('*a' if i == 0 else f'*b{i - 1}')] * 9)}]\n" for i in range(9))
NUMBERS = ",".join(str(i) for i in range(1, 1001))


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]  # {trace} and {tmp} are replaced by the trace directory and a scratch dir
    message: str  # must appear in the one line on stderr
    mutate: Callable[[Path], None] | None = None
    code: int = 2
    needs: str = ""  # an optional module the case needs (skipped without it)


T = "{trace}"
GPT = str(Path(__file__).resolve().parents[1] / "sample_trace" / "gpt-cpu-bs8")  # a trace with repeated layers
CASES = [
    # --- trace files: tracebacks before
    Case("inf tensor size", ("run", "-trace-dir", T, "-q"), "tensor.csv:2: TensorNumElement: not a whole number: 'inf'",
         lambda d: set_cell(d / "tensor.csv", 0, "TensorNumElement", "inf")),
    Case("inf inside an InputSize list", ("run", "-trace-dir", T, "-q"), "trace.csv:2: InputSize: not a whole number: 'inf'",
         lambda d: set_cell(d / "trace.csv", 0, "InputSize", "[8; inf]")),
    Case("tensor of 2^63 bytes", ("run", "-trace-dir", T, "-q"), "tensor.csv:2: TensorNumElement: too large",
         lambda d: set_cell(d / "tensor.csv", 0, "TensorNumElement", str(2**63))),
    Case("tensor of 2^62 x 4 bytes", ("run", "-trace-dir", T, "-q"), "larger than the limit of 9,007,199,254,740,992 bytes",
         lambda d: set_cell(d / "tensor.csv", 0, "TensorNumElement", str(2**61))),
    Case("size 2^63 in OutputSize", ("run", "-trace-dir", T, "-q"), "trace.csv:2: OutputSize: size",
         lambda d: set_cell(d / "trace.csv", 0, "OutputSize", f"[{2**63}]")),
    Case("meta.json batch_size \"abc\"", ("run", "-trace-dir", T, "-q"), "meta.json: batch_size: must be a whole number, got 'abc'",
         lambda d: write_meta(d, '{"batch_size": "abc"}')),
    Case("meta.json batch_size true", ("run", "-trace-dir", T, "-q"), "meta.json: batch_size: must be a whole number, got true",
         lambda d: write_meta(d, '{"batch_size": true}')),
    Case("meta.json batch_size NaN", ("run", "-trace-dir", T, "-q"), "meta.json: unreadable JSON (NaN is not a JSON number)",
         lambda d: write_meta(d, '{"batch_size": NaN}')),
    Case("meta.json batch_size 2.5", ("run", "-trace-dir", T, "-q"), "meta.json: batch_size: must be a whole number, got 2.5",
         lambda d: write_meta(d, '{"batch_size": 2.5}')),
    Case("meta.json batch_size 0", ("run", "-trace-dir", T, "-q"), "meta.json: batch_size: must be >= 1, got 0",
         lambda d: write_meta(d, '{"batch_size": 0}')),
    Case("meta.json attention_mask \"Causal\"", ("run", "-trace-dir", T, "-q"),
         'meta.json: attention_mask: must be causal, full or mixed, got "Causal"',
         lambda d: write_meta(d, '{"batch_size": 4, "attention_mask": "Causal"}')),
    Case("--link-latency-us nan", ("run", "-trace-dir", T, "-case", "1", "--link-latency-us", "nan", "-q"),
         "--link-latency-us must be a finite number, got nan"),
    # --- output paths
    Case("--json DIR", ("run", "-trace-dir", T, "--json", "{tmp}", "-q"), "--json {tmp}: is a directory"),
    Case("--timeline DIR", ("run", "-trace-dir", T, "--timeline", "{tmp}", "-q"), "--timeline {tmp}: is a directory"),
    Case("dag --export DIR", ("dag", "-trace-dir", T, "--export", "{tmp}"), "--export {tmp}: is a directory"),
    Case("sweep --out DIR.csv", ("sweep", "-trace-dir", T, "--out", "{tmp}/d.csv", "-q"), "d.csv: is a directory",
         lambda d: (d.parent / "scratch" / "d.csv").mkdir(parents=True)),
    Case("--json /proc/x.json", ("run", "-trace-dir", T, "--json", "/proc/x.json", "-q"),
         "--json /proc/x.json: cannot write"),
    Case("--timeline /proc/x.json", ("run", "-trace-dir", T, "--timeline", "/proc/x.json", "-q"),
         "--timeline /proc/x.json: cannot write"),
    Case("dag --export /proc/x.dot", ("dag", "-trace-dir", T, "--export", "/proc/x.dot"),
         "--export /proc/x.dot: cannot write"),
    Case("trace repeat --out /proc/x", ("trace", "repeat", "--layers", "2", "--in", GPT, "--out", "/proc/x/r"),
         "--out /proc/x/r: cannot create the output directory"),
    Case("--json in a missing directory", ("run", "-trace-dir", T, "--json", "{tmp}/no/x.json", "-q"),
         "output directory {tmp}/no does not exist"),
    # --- silent wrong results before
    Case("-bandwidth nan", ("run", "-trace-dir", T, "-bandwidth", "nan", "-q"), "-bandwidth must be a finite number, got nan"),
    Case("-ptp-bandwidth nan", ("run", "-trace-dir", T, "-case", "1", "-ptp-bandwidth", "nan", "-q"),
         "-ptp-bandwidth must be a finite number, got nan"),
    Case("--node-bandwidth nan", ("run", "-trace-dir", T, "-case", "1", "--topology", "nvlink-cluster",
                                  "--node-bandwidth", "nan", "-q"), "--node-bandwidth must be a finite number, got nan"),
    Case("--bucket-mb nan", ("run", "-trace-dir", T, "-case", "2", "--bucket-mb", "nan", "-q"),
         "--bucket-mb must be a finite number, got nan"),
    Case("-bandwidth inf", ("run", "-trace-dir", T, "-bandwidth", "inf", "-q"), "-bandwidth must be a finite number, got inf"),
    Case("--link-latency-us inf", ("run", "-trace-dir", T, "-case", "1", "--link-latency-us", "inf", "-q"),
         "--link-latency-us must be a finite number, got inf"),
    Case("--link-latency-us -1", ("run", "-trace-dir", T, "-case", "1", "--link-latency-us", "-1", "-q"),
         "--link-latency-us must be >= 0 µs, got -1.0"),
    Case("-capacity nan", ("run", "-trace-dir", T, "-capacity", "nan", "-q"), "-capacity must be between 10 and 60"),
    Case("sweep --dask-timeout nan", ("sweep", "-trace-dir", T, "--dask", "tcp://127.0.0.1:9", "--dask-timeout", "nan"),
         "--dask-timeout must be a finite number, got nan"),
    Case("-trace-dir \"\"", ("run", "-trace-dir", "", "-q"), "-trace-dir is empty"),
    Case("--json - and --timeline - together", ("run", "-trace-dir", T, "--json", "-", "--timeline", "-"),
         "--json - and --timeline - both write to stdout"),
    Case("--json and --timeline on one path", ("run", "-trace-dir", T, "--json", "{tmp}/r.json", "--timeline",
                                               "{tmp}/r.json", "-q"), "--json and --timeline both name"),
    Case("duplicate tensor row, other size", ("run", "-trace-dir", T, "-q"),
         "TensorNumElement: tensor 1 has 999 x 4 bytes here but",
         lambda d: duplicate_row(d / "tensor.csv", 0, "TensorNumElement", "999")),
    Case("fractional tensor size", ("run", "-trace-dir", T, "-q"), "tensor.csv:2: TensorNumElement: not a whole number: '1.5'",
         lambda d: set_cell(d / "tensor.csv", 0, "TensorNumElement", "1.5")),
    Case("fractional element size", ("run", "-trace-dir", T, "-q"), "tensor.csv:3: TensorEachByte: not a whole number: '4.5'",
         lambda d: set_cell(d / "tensor.csv", 1, "TensorEachByte", "4.5")),
    Case("fractional operator ID", ("run", "-trace-dir", T, "-q"), "trace.csv:2: OperatorID: not a whole number: '1.5'",
         lambda d: set_cell(d / "trace.csv", 0, "OperatorID", "1.5")),
    Case("fractional size in a list", ("run", "-trace-dir", T, "-q"), "trace.csv:3: InputSize: not a whole number: '2.5'",
         lambda d: set_cell(d / "trace.csv", 1, "InputSize", "[2.5]")),
    Case("NaN op time", ("run", "-trace-dir", T, "-q"), "trace.csv:2: Operator_cudatime: time must be a finite number",
         lambda d: set_cell(d / "trace.csv", 0, "Operator_cudatime", "nan")),
    # --- argparse, flags that do not apply, size limits
    Case("mistyped flag", ("-GPUNumber", "4"), "unrecognized arguments: -GPUNumber 4; did you mean -GPUnumber?"),
    Case("mistyped flag, sweep", ("sweep", "--bandwith", "1,2"), "did you mean --bandwidth?"),
    Case("not an integer", ("run", "-GPUnumber", "four"), "argument --GPUnumber/--gpus: invalid int value: 'four'"),
    Case("bad choice", ("dag", "--render", "gif"), "argument --render: invalid choice: 'gif'"),
    Case("missing required flag", ("trace", "convert"), "the following arguments are required: --graph"),
    Case("-GPUnumber 1000000", ("run", "-trace-dir", T, "-case", "1", "-GPUnumber", "1000000", "-q"),
         "-GPUnumber 1,000,000 is above the limit of 131,072 GPUs"),
    Case("graph over the task limit", ("run", "-trace-dir", T, "-case", "1", "-GPUnumber", "65536", "-q"),
         "on 65,536 GPUs would build a task graph of at least 11,927,552 tasks",  # 182 ops x 65,536 GPUs
         lambda d: write_synthetic_trace(d, SyntheticModel(layers=60, batch_size=4))),
    Case("--topology torus, case 0", ("run", "-trace-dir", T, "-case", "0", "--topology", "torus", "-q"),
         "--topology must be one of ring, fully-connected, switch, mesh, nvlink-cluster, got 'torus'"),
    Case("3x3 mesh on 8 GPUs, case 0", ("run", "-trace-dir", T, "-case", "0", "-interconnects", "1", "-numRows", "3",
                                        "-numCols", "3", "-q"), "-numRows × -numCols = 3 × 3 = 9, which is not -GPUnumber = 8"),
    Case("non-UTF-8 byte", ("run", "-trace-dir", T, "-q"), "trace.csv:4: not UTF-8 text (byte 0xff)",
         lambda d: insert_bytes(d / "trace.csv", 4, b"\xff")),
    Case("field over 128 KiB", ("run", "-trace-dir", T, "-q"), "trace.csv:3: malformed CSV (field larger than field limit",
         lambda d: set_cell(d / "trace.csv", 1, "OperatorName", "x" * (129 * 1024))),
    # --- found by bench/audit_cli.py (every option of every command, bad numbers and paths)
    Case("trace collect --lr nan", ("trace", "collect", "--model", "resnet18", "--batch-size", "2", "--out", "{tmp}/c",
                                    "--lr", "nan"), "argument --lr: expected a finite number > 0, got nan"),
    Case("trace collect --lr inf", ("trace", "collect", "--model", "resnet18", "--batch-size", "2", "--out", "{tmp}/c",
                                    "--lr", "inf"), "argument --lr: expected a finite number > 0, got inf"),
    Case("trace collect --lr 0", ("trace", "collect", "--model", "resnet18", "--batch-size", "2", "--out", "{tmp}/c",
                                  "--lr", "0"), "argument --lr: expected a finite number > 0, got 0"),
    Case("--kernel-floor-us inf", ("run", "-trace-dir", T, "--kernel-floor-us", "inf", "-q"),
         "--kernel-floor-us must be a finite number, got inf"),
    Case("trace repeat, meta.json batch_size 1e400", ("trace", "repeat", "--layers", "2", "--in", T, "--out", "{tmp}/r"),
         "meta.json: batch_size: must be a whole number, got inf", lambda d: write_meta(d, '{"batch_size": 1e400}')),
    Case("sweep --plot ''", ("sweep", "-trace-dir", T, "--plot", "", "-q"), "--plot is empty"),
    Case("sweep --dask-timeout nan without --dask", ("sweep", "-trace-dir", T, "--dask-timeout", "nan", "-q"),
         "--dask-timeout must be a finite number, got nan"),
    Case("trace repeat --out ''", ("trace", "repeat", "--layers", "2", "--in", GPT, "--out", ""),
         "argument --out: the name is empty"),
    Case("run --config ''", ("run", "-trace-dir", T, "--config", "", "-q"), "--config is empty"),
    Case("dag --topology-file ''", ("dag", "-trace-dir", T, "--topology-file", "", "--export", "{tmp}/d.dot"),
         "--topology-file is empty"),
    Case("NUL byte", ("run", "-trace-dir", T, "-q"), "tensor.csv:5: contains a NUL byte",
         lambda d: insert_bytes(d / "tensor.csv", 5, b"\x00")),
    # --- the GPU flags (issue 20)
    Case("unknown --gpu", ("run", "-trace-dir", T, "--gpu", "h100-sxn", "-q"),
         "--gpu h100-sxn: unknown GPU (known: a100-40gb, a100-80gb, b200, gb200, h100-pcie, h100-sxm, h200, l40s, mi300x, "
         "v100-32gb); did you mean h100-sxm?"),
    Case("--dtype fp8 on a V100", ("run", "-trace-dir", T, "--gpu", "v100", "--dtype", "fp8", "-q"),
         "--dtype fp8: V100-SXM2-32GB (v100-32gb) has no fp8 matrix peak (it has fp32, fp16)"),
    Case("--fp8-recipe mxfp8 on an H100", ("run", "-trace-dir", T, "--gpu", "h100-sxm", "--dtype", "fp8",
                                            "--fp8-recipe", "mxfp8", "-q"),
         "--fp8-recipe mxfp8: H100-SXM (h100-sxm) runs delayed, current, blockwise (MXFP8 needs a Blackwell GPU"),
    Case("--fp8-param-gather without ZeRO", ("run", "-trace-dir", T, "--gpu", "h100-sxm", "--dtype", "fp8", "--dp", "2",
                                             "--fp8-param-gather", "-q"),
         "--fp8-param-gather needs the distributed optimizer or FSDP (--zero 1|2|3)"),
    Case("retarget a synthetic trace", ("run", "-trace-dir", T, "--gpu", "h100-sxm", "--op-time-source", "retarget",
                                        "-q"), "--op-time-source retarget needs a GPU-timed trace"),
    Case("GPU trace of an unknown GPU", ("run", "-trace-dir", T, "--gpu", "h100-sxm", "-q"),
         "meta.json's device 'NVIDIA T4' is not in the device database; give --trace-gpu NAME (known: a100-40gb",
         lambda d: write_meta(d, '{"batch_size": 4, "device": "cuda", "device_name": "NVIDIA T4"}')),
    Case("unknown --trace-gpu", ("run", "-trace-dir", T, "--gpu", "h100-sxm", "--trace-gpu", "t4", "-q"),
         "--trace-gpu t4: unknown GPU (known: a100-40gb"),
    Case("a math-only --dtype without --gpu", ("run", "-trace-dir", T, "--dtype", "tf32", "-q"),
         "--dtype tf32 needs the GPU to time the ops on: give --gpu NAME"),
    Case("--grad-reduce-dtype without a training dtype", ("run", "-trace-dir", T, "--grad-reduce-dtype", "bf16", "-q"),
         "--grad-reduce-dtype bf16 needs a training dtype: give --dtype bf16|fp16|fp32"),
    Case("a training dtype under --reference-compat", ("run", "-trace-dir", T, "--dtype", "bf16", "--reference-compat",
                                                       "-q"),
         "--dtype bf16 cannot be combined with --reference-compat"),
    Case("--gpu-file missing", ("run", "-trace-dir", T, "--gpu-file", "{tmp}/no.yaml", "-q"),
         "--gpu-file {tmp}/no.yaml: file not found"),
    Case("--gpu-file not UTF-8", ("run", "-trace-dir", T, "--gpu-file", "{tmp}/bin.yaml", "-q"),
         "--gpu-file {tmp}/bin.yaml line 1: not UTF-8 text (byte 0xff)",
         lambda d: (d.parent / "scratch" / "bin.yaml").write_bytes(b"name:\xff\n")),
    Case("--gpu-file without a bf16 peak's number", ("gpus", "--gpu-file", "{tmp}/dev.yaml"),
         "field 'matrix_tflops.bf16' must be a positive finite number, got 0",
         lambda d: _device_file(d, "bf16: 989.4", "bf16: 0")),
    Case("--gpu-file missing hbm_gbps", ("run", "-trace-dir", T, "--gpu-file", "{tmp}/dev.yaml", "-q"),
         "missing field 'hbm_gbps'", lambda d: _device_file(d, "hbm_gbps: 3350", "")),
    Case("--gpu and --gpu-file", ("run", "-trace-dir", T, "--gpu", "h100", "--gpu-file", "{tmp}/x.yaml", "-q"),
         "--gpu and --gpu-file exclude each other"),
    # --- traces accepted silently before (issue 24)
    Case("ops out of order: a tensor read before it is written", ("run", "-trace-dir", T, "-q"),
         "trace.csv:2: Operator_input: reads tensor 4 before line 3 writes it",
         lambda d: swap_lines(d / "trace.csv", 2, 3)),
    Case("a 2-cycle between ops", ("run", "-trace-dir", T, "-q"),
         "trace.csv:2: Operator_input: reads tensor 7, which line 3 writes later, while line 3 reads tensor 4, "
         "which this op writes: the two ops form a cycle", lambda d: add_input(d, 0, "7", 168)),
    Case("duplicate OperatorID", ("run", "-trace-dir", T, "-q"), "trace.csv:3: OperatorID: 1 is also the ID of line 2",
         lambda d: set_cell(d / "trace.csv", 1, "OperatorID", "1")),
    Case("InputSize disagrees with tensor.csv", ("run", "-trace-dir", T, "-q"),
         "trace.csv:2: InputSize: 44 elements for tensor 3, but tensor.csv gives 43",
         lambda d: set_cell(d / "trace.csv", 0, "InputSize", "[156; 1677; 44]")),
    Case("InputSize one size short", ("run", "-trace-dir", T, "-q"),
         "trace.csv:2: InputSize: 2 sizes for the 3 tensors of Operator_input",
         lambda d: set_cell(d / "trace.csv", 0, "InputSize", "[156; 1677]")),
    Case("OutputSize disagrees with tensor.csv", ("run", "-trace-dir", T, "-q"),
         "trace.csv:2: OutputSize: 173 elements for tensor 4, but tensor.csv gives 172",
         lambda d: set_cell(d / "trace.csv", 0, "OutputSize", "[173]")),
    Case("busy time over the span", ("run", "-trace-dir", T, "-q"),
         "trace.csv:2: Operator_cudatimenooverlap: busy time 800 µs is more than the span Operator_cudatime 738.61 µs",
         lambda d: set_cell(d / "trace.csv", 0, "Operator_cudatimenooverlap", "800")),
    Case("misspelt parameter TensorType", ("run", "-trace-dir", T, "-q"),
         "tensor.csv:3: TensorType: unknown type 'wieght'; did you mean weight?",
         lambda d: set_cell(d / "tensor.csv", 1, "TensorType", "wieght")),
    Case("TensorType not a name", ("run", "-trace-dir", T, "-q"), "tensor.csv:3: TensorType: not an argument name: '12'",
         lambda d: set_cell(d / "tensor.csv", 1, "TensorType", "12")),
    # --- topology files (issue 24)
    *[Case(f"topology: 400-digit {key}", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO, "-q"),
           f"field '{key}' must be <= {limit}, got an integer of 400 digits",
           lambda d, old=old, key=key: write_topology(d, SUPERPOD.replace(old, f"{key}: {'9' * 400}")))
      for key, old, limit in (("bandwidth_gbps", "bandwidth_gbps: 450", "1,000,000,000"),
                              ("gpus_per_node", "gpus_per_node: 8", "131,072"),
                              ("nics_per_gpu", "nics_per_gpu: 1", "64"),
                              ("oversubscription", "oversubscription: 1", "1,024"))],
    Case("topology: 400-digit gpus", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO, "-q"),
         "field 'gpus' must be <= 131,072, got an integer of 400 digits",
         lambda d: write_topology(d, SUPERPOD + f"gpus: {'9' * 400}\n")),
    Case("topology: 400-digit ptp_bandwidth_gbps", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO,
                                                    "-q"),
         "field 'ptp_bandwidth_gbps' must be <= 1,000,000,000, got an integer of 400 digits",
         lambda d: write_topology(d, f"kind: preset\ntopology: ring\nptp_bandwidth_gbps: {'9' * 400}\n")),
    Case("topology: 400-digit interconnects", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO, "-q"),
         "field 'interconnects' must be <= 1, got an integer of 400 digits",
         lambda d: write_topology(d, f"kind: preset\ninterconnects: {'9' * 400}\n")),
    Case("topology: oversubscription 2^63", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO, "-q"),
         "spine: field 'oversubscription' must be <= 1,024, got 9223372036854775808",
         lambda d: write_topology(d, SUPERPOD.replace("oversubscription: 1", "oversubscription: 9223372036854775808"))),
    Case("topology: non-UTF-8 byte", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO, "-q"),
         "topo.yaml line 2: not UTF-8 text (byte 0xff)",
         lambda d: (d.parent / "topo.yaml").write_bytes(b"kind: preset\nname: r\xff\n")),
    Case("topology: description nested 20,000 deep", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO,
                                                      "-q"),
         "topo.yaml line 2: nested more than 32 levels deep",
         lambda d: write_topology(d, "kind: preset\ndescription: " + "[" * 20000 + "]" * 20000 + "\n")),
    Case("topology: alias bomb", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO, "-q"),
         "the document expands to more than 100,000 values (aliases included)",
         lambda d: write_topology(d, "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
             f"b{i}: &b{i} [{', '.join([('*a' if i == 0 else f'*b{i - 1}')] * 9)}]\n" for i in range(9)))),
    Case("topology: file over 1 MiB", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO, "-q"),
         "topology file larger than the limit of 1,048,576 bytes",
         lambda d: write_topology(d, "kind: preset\n" + "#" * (1 << 20) + "\n")),
    Case("topology: typo in spine", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO, "-q"),
         "spine: unknown field 'oversubscriptoin' (known: efficiency, latency_us, oversubscription); "
         "did you mean 'oversubscription'?",
         lambda d: write_topology(d, SUPERPOD.replace("oversubscription: 1", "oversubscriptoin: 8"))),
    Case("topology: typo in nvlink", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO, "-q"),
         "nvlink: unknown field 'bandwith_gbps'", lambda d: write_topology(d, SUPERPOD.replace(
             "bandwidth_gbps: 450", "bandwith_gbps: 450"))),
    Case("topology: key twice", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO, "-q"),
         "key 'gpus_per_node' given twice in one mapping", lambda d: write_topology(d, SUPERPOD + "gpus_per_node: 4\n")),
    Case("--topology-file /nonexistent/ring.yaml", ("run", "-trace-dir", T, "-case", "1", "--topology-file",
                                                    "/nonexistent/ring.yaml", "-q"),
         "--topology-file /nonexistent/ring.yaml: file not found"),
    Case("cluster file of 131,072 GPUs, one a node, one node a leaf",
         ("run", "-trace-dir", T, "-case", "1", "-GPUnumber", "131072", "--topology-file", TOPO, "-q"),
         "nodes of 1 GPU on 131,072 GPUs would build an interconnect graph of 1,048,576 links (about 2.5 GB), above "
         "the limit of 800,000 links", lambda d: write_topology(d, SUPERPOD.replace("gpus_per_node: 8",
                                                                                    "gpus_per_node: 1").replace(
                                                                    "nodes_per_leaf: 32", "nodes_per_leaf: 1"))),
    # --- trace repeat and layer counts
    Case("trace repeat --layers 1000000", ("trace", "repeat", "--layers", "1000000", "--in", GPT, "--out", "{tmp}/r"),
         "--layers 1,000,000 is above the limit of 10,000 layers"),
    Case("run --num-layers 1000000", ("run", "-trace-dir", GPT, "--num-layers", "1000000", "-q"),
         "--num-layers 1,000,000 is above the limit of 10,000 layers"),
    Case("trace repeat, non-UTF-8 trace.csv", ("trace", "repeat", "--layers", "2", "--in", T, "--out", "{tmp}/r"),
         "trace.csv:4: not UTF-8 text (byte 0xff)", lambda d: insert_bytes(d / "trace.csv", 4, b"\xff")),
    Case("trace repeat, meta.json nested 100,000 deep", ("trace", "repeat", "--layers", "2", "--in", T, "--out",
                                                        "{tmp}/r"),
         "meta.json: unreadable JSON (nested too deep)", lambda d: write_meta(d, "[" * 100000 + "]" * 100000)),
    Case("run, meta.json nested 100,000 deep", ("run", "-trace-dir", T, "-q"),
         "meta.json: unreadable JSON (nested too deep)", lambda d: write_meta(d, "[" * 100000 + "]" * 100000)),
    Case("trace repeat --out a directory of other files", ("trace", "repeat", "--layers", "2", "--in", GPT, "--out",
                                                          "{tmp}"),
         "the directory holds other files (keep.txt)", lambda d: (d.parent / "scratch" / "keep.txt").parent.mkdir(
             exist_ok=True) or (d.parent / "scratch" / "keep.txt").write_text("x")),
    # --- outputs over inputs
    Case("--json onto the trace's meta.json", ("run", "-trace-dir", T, "--json", T + "/meta.json", "-q"),
         "meta.json: refusing to overwrite an input file with an output", lambda d: write_meta(d, '{"batch_size": 4}')),
    Case("--timeline onto --topology-file", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO,
                                             "--timeline", TOPO, "-q"),
         "topo.yaml: refusing to overwrite an input file with an output", lambda d: write_topology(d, SUPERPOD)),
    Case("--json onto --config", ("run", "-trace-dir", T, "--config", "{tmp}/c.json", "--json", "{tmp}/c.json", "-q"),
         "c.json: refusing to overwrite an input file with an output", lambda d: (d.parent / "scratch").mkdir(exist_ok=True) or (
             d.parent / "scratch" / "c.json").write_text("{}")),
    # --- --config files (issue 24)
    Case("config: 400-digit float flag", ("run", "-trace-dir", T, "--config", "{tmp}/c.yaml", "-q"),
         "--config {tmp}/c.yaml: --bandwidth: an integer of 400 digits is out of range",
         lambda d: scratch_file(d, "c.yaml", f"bandwidth: {'9' * 400}\n")),
    Case("config: non-UTF-8 byte", ("run", "-trace-dir", T, "--config", "{tmp}/c.yaml", "-q"),
         "--config {tmp}/c.yaml line 2: not UTF-8 text (byte 0xff)",
         lambda d: scratch_file(d, "c.yaml", b"case: 1\ntopology: r\xffng\n")),
    Case("config: 1,000-character trace_dir", ("run", "--config", "{tmp}/c.yaml", "-q"),
         "--config {tmp}/c.yaml: --trace-dir: a name of 1,000 bytes in the path, above the limit of 255 bytes",
         lambda d: scratch_file(d, "c.yaml", f"trace_dir: {'a' * 1000}\n")),
    Case("-trace-dir of 1,000 characters", ("run", "-trace-dir", "a" * 1000, "-q"),
         "-trace-dir: a name of 1,000 bytes in the path, above the limit of 255 bytes per file or directory name"),
    Case("config: YAML syntax error", ("run", "-trace-dir", T, "--config", "{tmp}/c.yaml", "-q"),
         "--config {tmp}/c.yaml line 3: not valid YAML (",
         lambda d: scratch_file(d, "c.yaml", "case: 1\ngpus: [2, 4\n")),
    Case("config: gpus and GPUnumber", ("run", "-trace-dir", T, "--config", "{tmp}/c.yaml", "-q"),
         "--config {tmp}/c.yaml: keys 'gpus' and 'GPUnumber' both set --gpus; keep one",
         lambda d: scratch_file(d, "c.yaml", "case: 1\ngpus: 2\nGPUnumber: 4\n")),
    Case("config: misspelt key", ("run", "-trace-dir", T, "--config", "{tmp}/c.yaml", "-q"),
         "unknown flag 'ptp_bandwith' in --config {tmp}/c.yaml; did you mean 'ptp_bandwidth'?",
         lambda d: scratch_file(d, "c.yaml", "ptp_bandwith: 100\n")),
    Case("config: key given twice (JSON)", ("run", "-trace-dir", T, "--config", "{tmp}/c.json", "-q"),
         "--config {tmp}/c.json: key 'case' given twice in one mapping",
         lambda d: scratch_file(d, "c.json", '{"case": 1, "case": 2}')),
    Case("config: JSON nested 20,000 deep", ("run", "-trace-dir", T, "--config", "{tmp}/c.json", "-q"),
         "--config {tmp}/c.json: nested more than 32 levels deep, above the limit for a settings file",
         lambda d: scratch_file(d, "c.json", '{"case": ' + "[" * 20000 + "]" * 20000 + "}")),
    Case("config: alias bomb", ("run", "-trace-dir", T, "--config", "{tmp}/c.yaml", "-q"),
         "the document expands to more than 100,000 values (aliases included)",
         lambda d: scratch_file(d, "c.yaml", BOMB)),
    Case("config: file over 1 MiB", ("run", "-trace-dir", T, "--config", "{tmp}/c.yaml", "-q"),
         "--config {tmp}/c.yaml: config file larger than the limit of 1,048,576 bytes",
         lambda d: scratch_file(d, "c.yaml", "case: 1\n" + "#" * (1 << 20) + "\n")),
    # --- sweep grids and outputs (issue 24)
    Case("sweep over 10^6 points", ("sweep", "-trace-dir", T, "-case", "1", "-bandwidth", NUMBERS, "-ptp-bandwidth",
                                    NUMBERS, "-q"),
         "the sweep has 1,000,000 configurations (1,000 bandwidth × 1,000 ptp-bandwidth), above the limit of "
         "100,000: sweep fewer values"),
    Case("sweep: one flag with 20,000 values", ("sweep", "-trace-dir", T, "-bandwidth",
                                                ",".join(str(i) for i in range(1, 20_001)), "-q"),
         "--bandwidth: 20,000 values, above the limit of 10,000 values per flag"),
    Case("grid: JSON list of 10^5 values", ("sweep", "-trace-dir", T, "--grid", "{tmp}/g.json", "-q"),
         "--grid {tmp}/g.json: 'bandwidth' has 100,000 values, above the limit of 10,000 values per flag",
         lambda d: scratch_file(d, "g.json", '{"bandwidth": [' + ",".join(str(i) for i in range(1, 100_001)) + "]}")),
    Case("grid: YAML list of 10^5 values", ("sweep", "-trace-dir", T, "--grid", "{tmp}/g.yaml", "-q"),
         "--grid {tmp}/g.yaml line 1: the document expands to more than 100,000 values",
         lambda d: scratch_file(d, "g.yaml", "bandwidth: [" + ",".join(str(i) for i in range(1, 100_001)) + "]\n")),
    # a Client half-built on an unparsable address printed a traceback 40 s after the error
    Case("sweep --dask abc (no port)", ("sweep", "-trace-dir", T, "-bandwidth", "1,2", "--dask", "abc", "-q",
                                        "--out", "{tmp}/s.csv"),
         "--dask: 'abc' is neither a scheduler file nor an address HOST:PORT",
         lambda d: scratch_file(d, "s.csv.partial", ""),  # refused before the partial file is touched
         needs="distributed"),
    Case("sweep --dask tcp://host:1e400", ("sweep", "-trace-dir", T, "-bandwidth", "1,2", "--dask", "tcp://h:1e400",
                                           "-q"), "--dask: 'tcp://h:1e400' is neither a scheduler file",
         needs="distributed"),
    Case("grid: non-UTF-8 byte", ("sweep", "-trace-dir", T, "--grid", "{tmp}/g.yaml", "-q"),
         "--grid {tmp}/g.yaml line 1: not UTF-8 text (byte 0xfe)",
         lambda d: scratch_file(d, "g.yaml", b"case: [0, \xfe]\n")),
    Case("grid: gpus and fixed GPUnumber", ("sweep", "-trace-dir", T, "--grid", "{tmp}/g.yaml", "-q"),
         "--grid {tmp}/g.yaml: keys 'gpus' and 'fixed.GPUnumber' both set --gpus; keep one",
         lambda d: scratch_file(d, "g.yaml", "gpus: [2, 4]\nfixed:\n  GPUnumber: 8\n")),
    Case("grid: misspelt key", ("sweep", "-trace-dir", T, "--grid", "{tmp}/g.yaml", "-q"),
         "unknown flag 'bandwith' in --grid {tmp}/g.yaml; did you mean 'bandwidth'?",
         lambda d: scratch_file(d, "g.yaml", "bandwith: [1, 2]\n")),
    Case("grid: 400-digit bandwidth", ("sweep", "-trace-dir", T, "--grid", "{tmp}/g.yaml", "-q"),
         "--grid {tmp}/g.yaml: --bandwidth: an integer of 400 digits is out of range",
         lambda d: scratch_file(d, "g.yaml", f"bandwidth: [1, {'9' * 400}]\n")),
    Case("sweep --out onto --grid", ("sweep", "-trace-dir", T, "--grid", "{tmp}/g.json", "--out", "{tmp}/g.json",
                                     "-q"),
         "--out {tmp}/g.json: refusing to overwrite an input file with an output (this run reads {tmp}/g.json)",
         lambda d: scratch_file(d, "g.json", '{"bandwidth": [1, 2]}')),
    Case("sweep --resume without --out", ("sweep", "-trace-dir", T, "--resume", "-q"),
         "--resume needs --out FILE: it keeps the rows of FILE.partial"),
    Case("sweep --resume, partial file a symlink", ("sweep", "-trace-dir", T, "--out", "{tmp}/x.csv", "--resume",
                                                    "-q"),
         "--out {tmp}/x.csv: {tmp}/x.csv.partial is a symbolic link, not the partial file of a sweep",
         lambda d: scratch_file(d, "elsewhere.txt", "keep\n") or (d.parent / "scratch" / "x.csv.partial").symlink_to(
             d.parent / "scratch" / "elsewhere.txt")),
    Case("sweep --resume, another sweep's partial file", ("sweep", "-trace-dir", T, "--out", "{tmp}/x.csv",
                                                          "--resume", "-q"),
         "--out {tmp}/x.csv: {tmp}/x.csv.partial has other columns than this sweep",
         lambda d: scratch_file(d, "x.csv.partial", "case,gpus,status\n1,2,ok\n")),
    Case("trace convert, missing file", ("trace", "convert", "--graph", "{tmp}/g.json", "--profiler", "{tmp}/p.json",
                                         "--out", "{tmp}/o"), "g.json"),
    # --- flag combinations that dropped something silently (issue 24)
    Case("-case 3 with --dp 2", ("run", "-trace-dir", T, "-case", "3", "--dp", "2", "-q"),
         "-case 3 and --dp 2 both choose the parallelism; give one of them (-case 3 is --tp N --tp-style per-op)"),
    Case("-case 4 with --tp 2", ("run", "-trace-dir", T, "-case", "4", "--tp", "2", "-q"),
         "-case 4 and --tp 2 both choose the parallelism; give one of them (-case 4 is --pp N)"),
    Case("-case 0 typed with --dp 2", ("run", "-trace-dir", T, "-case", "0", "--dp", "2", "-q"),
         "-case 0 and --dp 2 both choose the parallelism; give one of them (-case 0 is one GPU: leave -case out)"),
    Case("dag -case 1 with --dp 2 --pp 2", ("dag", "-trace-dir", T, "-case", "1", "--dp", "2", "--pp", "2", "--export",
                                           "{tmp}/d.dot"),
         "-case 1 and --dp 2 --pp 2 both choose the parallelism"),
    Case("--pp 2 -micro-batch-size 3 at batch 8", ("run", "-trace-dir", GPT, "--pp", "2", "-micro-batch-size", "3", "-q"),
         "-micro-batch-size 3 does not divide the per-replica batch of 8: a --dp/--tp/--pp run cuts it into equal "
         "micro-batches (use 1, 2, 4, 8)"),
    Case("--dp 2 -micro-batch-size 3 -batch-size-sim 16", ("run", "-trace-dir", GPT, "--dp", "2", "-batch-size-sim",
                                                          "16", "-micro-batch-size", "3", "-q"),
         "-micro-batch-size 3 does not divide the per-replica batch of 16"),
    # --- --global-batch (samples per iteration over the data-parallel replicas)
    Case("--global-batch 32 --dp 3", ("run", "-trace-dir", GPT, "--dp", "3", "--global-batch", "32", "-q"),
         "--global-batch 32 is not a multiple of --dp 3: every data-parallel replica trains the same number of "
         "equal micro-batches (use --global-batch 30 or 33)"),
    Case("--global-batch 36 --dp 2 -micro-batch-size 8", ("run", "-trace-dir", GPT, "--dp", "2", "--global-batch",
                                                          "36", "-micro-batch-size", "8", "-q"),
         "--global-batch 36 is not a multiple of --dp 2 × -micro-batch-size 8 = 16"),
    Case("--global-batch 32 --dp 2 -batch-size-sim 8", ("run", "-trace-dir", GPT, "--dp", "2", "--global-batch", "32",
                                                        "-batch-size-sim", "8", "-q"),
         "--global-batch 32 over --dp 2 is 16 samples per replica, but -batch-size-sim is 8: give one of them"),
    Case("--global-batch with -case 2", ("run", "-trace-dir", GPT, "-case", "2", "--global-batch", "32", "-q"),
         "--global-batch needs the degrees of a hybrid run: give --dp/--tp/--pp"),
    Case("--global-batch 0", ("run", "-trace-dir", GPT, "--dp", "2", "--global-batch", "0", "-q"),
         "--global-batch must be a positive integer, got 0"),
    Case("--global-batch 2.5", ("run", "-trace-dir", GPT, "--dp", "2", "--global-batch", "2.5", "-q"),
         "--global-batch: invalid int value: '2.5'"),
    Case("bad topology file with -case 0", ("run", "-trace-dir", T, "-case", "0", "--topology-file", TOPO, "-q"),
         "spine: unknown field 'oversubscriptoin'",
         lambda d: write_topology(d, SUPERPOD.replace("oversubscription: 1", "oversubscriptoin: 8"))),
    Case("topology file of an unknown topology, -case 0", ("run", "-trace-dir", T, "--topology-file", TOPO, "-q"),
         "topo.yaml: field 'topology' must be one of ring, fully-connected, switch, mesh, nvlink-cluster, got 'torus'",
         lambda d: write_topology(d, "kind: preset\ntopology: torus\n")),
    Case("missing topology file, -case 0", ("run", "-trace-dir", T, "--topology-file", "{tmp}/none.yaml", "-q"),
         "--topology-file {tmp}/none.yaml: file not found"),
    Case("--topology torus beside a topology file", ("run", "-trace-dir", T, "-case", "1", "--topology-file", TOPO,
                                                     "--topology", "torus", "-q"),
         "--topology must be one of ring, fully-connected, switch, mesh, nvlink-cluster, got 'torus'",
         lambda d: write_topology(d, SUPERPOD)),
    # --- model cards (--model, --model-file, --seq-len)
    Case("--model without --gpu", ("run", "--model", "gpt3-175b", "-q"),
         "--model needs the GPU to time the card's ops on: give --gpu NAME"),
    Case("--model unknown name", ("run", "--model", "gpt3-17b", "--gpu", "a100-80gb", "-q"),
         "--model 'gpt3-17b': no such model card; did you mean gpt3-175b?"),
    Case("--model and --model-file", ("run", "--model", "gpt3-175b", "--model-file", "{tmp}/c.yaml", "--gpu",
                                      "a100-80gb", "-q"), "--model and --model-file exclude each other"),
    Case("--model with -trace-dir", ("run", "-trace-dir", T, "--model", "gpt3-175b", "--gpu", "a100-80gb", "-q"),
         "--model builds the trace from the card: leave out -trace-dir"),
    Case("--model with -batch-size", ("run", "--model", "gpt3-175b", "-batch-size", "8", "--gpu", "a100-80gb", "-q"),
         "-batch-size is the batch a trace was recorded at; --model builds its trace at -micro-batch-size"),
    Case("--seq-len without a card", ("run", "-trace-dir", T, "--seq-len", "128", "-q"),
         "--seq-len sets a model card's sequence: give --model NAME or --model-file FILE"),
    Case("--seq-len 0", ("run", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--seq-len", "0", "-q"),
         "--seq-len must be between 1 and 10,000,000, got 0"),
    Case("--seq-len past learned positions", ("run", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--seq-len",
                                              "4096", "-q"),
         "--seq-len 4096: gpt3-175b learns one position embedding per position, 2048 of them (use at most 2048)"),
    Case("--model with --op-time-source trace", ("run", "--model", "llama3-8b", "--gpu", "h100-sxm",
                                                 "--op-time-source", "trace", "-q"),
         "--op-time-source trace: a model card's trace holds no measured times; use roofline"),
    Case("--model-file missing", ("run", "--model-file", "{tmp}/none.yaml", "--gpu", "h100-sxm", "-q"),
         "--model-file {tmp}/none.yaml: model card not found"),
    Case("--model-file, a bad count", ("run", "--model-file", "{tmp}/card.yaml", "--gpu", "h100-sxm", "-q"),
         "--model-file {tmp}/card.yaml: layers: must be between 1 and 10,000, got a number of 400 digits",
         lambda d: scratch_file(d, "card.yaml", _card_text().replace("layers: 48", "layers: " + "9" * 400))),
    Case("--model-file, a misspelt key", ("run", "--model-file", "{tmp}/card.yaml", "--gpu", "h100-sxm", "-q"),
         "--model-file {tmp}/card.yaml: unknown key 'kv_head'; did you mean 'kv_heads'?",
         lambda d: scratch_file(d, "card.yaml", "name: x\nkv_head: 2\n")),
    # --- the first hour (issue 24)
    Case("-trace-dir a folder of trace folders", ("run", "-trace-dir", T + "/..", "-q"),
         "/..: no trace.csv here, but it holds trace folders: trace; give one of them, e.g. -trace-dir {trace}/../trace"),
    *([Case("trace collect --model mobilenetv2", ("trace", "collect", "--model", "mobilenetv2", "--batch-size", "2",
                                                 "--out", "{tmp}/c"), "; did you mean mobilenet_v2?")]
      if importlib.util.find_spec("torchvision") else []),
]


def _device_file(trace: Path, old: str, new: str) -> None:
    """A copy of the shipped h100-sxm device file with ``old`` replaced, as scratch/dev.yaml."""
    from triosim.hardware.device_db import packaged_dir

    scratch = trace.parent / "scratch"
    scratch.mkdir(exist_ok=True)
    text = (packaged_dir() / "h100-sxm.yaml").read_text(encoding="utf-8")
    assert old in text
    (scratch / "dev.yaml").write_text(text.replace(old, new, 1), encoding="utf-8")


def _subst(text: str, trace: Path, tmp: Path) -> str:
    return text.replace("{trace}", str(trace)).replace("{tmp}", str(tmp))


def run_case(case: Case, base: Path) -> tuple[int, str, str]:
    """Set up the case under ``base`` and run the CLI in this process: (exit code, stdout, stderr)."""
    trace = write_synthetic_trace(base / "trace", SyntheticModel(layers=3, batch_size=4, seed=2))
    tmp = base / "scratch"
    tmp.mkdir(exist_ok=True)
    if case.mutate is not None:
        case.mutate(trace)
    argv = [_subst(a, trace, tmp) for a in case.argv]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's errors
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_exit_2(case: Case, tmp_path: Path) -> None:
    if case.needs:  # without it the flag is refused first, by a different message
        pytest.importorskip(case.needs)
    code, _, err = run_case(case, tmp_path)
    message = _subst(case.message, tmp_path / "trace", tmp_path / "scratch")
    lines = err.splitlines()
    assert code == case.code, err
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("triosim: error: "), err
    assert message in lines[0]


def test_unwritable_directory_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root can write into a read-only directory")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        case = Case("read-only dir", ("run", "-trace-dir", T, "--json", str(ro / "x.json"), "-q"), "permission denied")
        code, _, err = run_case(case, tmp_path)
        assert code == 2 and len(err.splitlines()) == 1 and "cannot write into" in err
    finally:
        ro.chmod(0o700)


def test_unused_but_valid_flags_are_named_in_one_note(tmp_path: Path) -> None:
    case = Case("note", ("run", "-trace-dir", T, "-case", "0", "-GPUnumber", "4", "--bucket-mb", "5", "-q"), "", code=0)
    code, out, err = run_case(case, tmp_path)
    assert code == 0 and float(out) > 0
    assert err.splitlines() == [
        "triosim: note: -case 0 simulates one GPU: -GPUnumber 4 not used; "
        "buckets are DDP's (-case 2): --bucket-mb 5.0 not used"]


def test_stale_temp_files_of_the_target_are_removed(tmp_path: Path) -> None:
    from triosim.output import atomic_write_text

    target = tmp_path / "r.json"
    dead = 2**22 + 12345  # above the default pid_max of 4,194,304: no such process
    stale = tmp_path / f".r.json.{dead}.0badc0de.tmp"
    alive = tmp_path / f".r.json.{os.getppid()}.0badc0de.tmp"  # a live process
    other = tmp_path / f".s.json.{dead}.0badc0de.tmp"  # another target's: not ours to remove
    for p in (stale, alive, other):
        p.write_text("half")
    atomic_write_text(target, "{}")
    assert target.read_text() == "{}"
    assert not stale.exists() and alive.exists() and other.exists()


def print_table() -> None:  # pragma: no cover - evidence for humans
    import tempfile

    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            code, _, err = run_case(case, Path(tmp))
        line = err.strip().replace(tmp, "$TMP")
        print(f"| {case.name} | {code} | {line} |")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(print_table())
