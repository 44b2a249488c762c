"""Fuzzing topology files (``--topology-file``) and GPU device files (``--gpu-file``): whatever
the YAML, ``triosim run`` exits 0 or 2,
exit 2 comes with exactly one line on stderr, nothing raises, and nothing takes long.

Hypothesis mutates the shipped files (a value replaced by a hostile one — a 400-digit integer,
NaN, ``.inf``, a list, a nested mapping —, a key misspelt, a line dropped or doubled, bytes
inserted or overwritten) and writes random YAML documents (nested mappings and lists, aliases,
deep nesting). Each example must finish within :data:`TIME_LIMIT_S` (checked with an alarm, so
a hang fails the test instead of stalling it). The seed is fixed; ``TRIOSIM_FUZZ_EXAMPLES``
sets the number of examples (2,000 for the evidence, a few dozen in the suite). The counts are
printed, and a planted bug (OverflowError let through) shows the property catches tracebacks.
"""

from __future__ import annotations

import io
import os
import re
import signal
import time
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import triosim.hardware.topology_file as tf
from triosim.cli.console import main
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "topologies").glob("*.yaml"))
SHIPPED_DEVICES = sorted((REPO / "triosim" / "hardware" / "device_data").glob("*.yaml"))
TIME_LIMIT_S = 20.0
HOSTILE = ["9" * 400, "-" + "9" * 400, ".nan", ".inf", "-.inf", "1e400", "-1", "0", "0.5", "2", "8", "65536",
           "9223372036854775808", "abc", "[]", "{}", "null", "true", "[1, 2]", "{a: 1}", "''", "'8'", "0x10",
           "1_000", "2020-13-45", "!!binary x", "&a 1", "*a", "!!python/object:os.system x", "[" * 50 + "]" * 50]
KEYS = ["kind", "name", "topology", "gpus", "gpus_per_node", "nvlink", "nic", "leaf", "spine", "bandwidth_gbps",
        "latency_us", "nodes_per_leaf", "oversubscription", "nics_per_gpu", "ptp_bandwidth_gbps",
        "remote_bandwidth_gbps", "link_latency_us", "interconnects", "num_rows", "num_cols", "description",
        "node_bandwidth_gbps", "sharp", "sharp_efficiency"]
DEVICE_KEYS = ["name", "display_name", "vendor", "aliases", "memory_gb", "hbm_gbps", "sm_count", "block_read_gbps",
               "launch_floor_us", "matrix_tflops", "vector_tflops", "sources", "efficiency", "compute",
               "compute_by_dtype", "memory", "bf16", "fp16", "fp32", "tf32", "fp8", "source"]


def _value(text: str) -> object:
    """A hostile scalar as YAML reads it (or the text itself when it does not read)."""
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError):
        return text


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang


@st.composite
def documents(draw, shipped: list[Path] = SHIPPED, keys: list[str] = KEYS) -> bytes:
    """A settings file: a mutated shipped file (topology or device), or random YAML."""
    kind = draw(st.sampled_from(["value", "value", "key", "line", "bytes", "random", "special"]))
    if kind == "random":
        leaves = st.one_of(st.sampled_from(HOSTILE), st.integers(-10**6, 10**6).map(str),
                           st.floats(allow_nan=True).map(repr), st.text(max_size=8).map(repr))
        tree = st.recursive(leaves.map(_value),
                            lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                   st.dictionaries(st.sampled_from(keys), kids, max_size=5)),
                            max_leaves=20)
        doc = draw(st.dictionaries(st.sampled_from(keys), tree, max_size=8))
        if keys is KEYS:
            doc.setdefault("kind", draw(st.sampled_from(["preset", "cluster", "mesh"])))
        return yaml.safe_dump(doc).encode()
    if kind == "special":
        depth = draw(st.sampled_from([31, 33, 1000, 20_000]))
        level = draw(st.integers(2, 12))
        bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"b{i}: &b{i} [{', '.join([('*a' if i == 0 else f'*b{i - 1}')] * 9)}]\n" for i in range(level))
        return draw(st.sampled_from([
            ("kind: cluster\ndescription: " + "[" * depth + "]" * depth + "\n").encode(),
            ("kind: preset\ndescription: " + "{a: " * depth + "1" + "}" * depth + "\n").encode(),
            (bomb + "kind: cluster\n").encode(),
            b"kind: preset\nkind: cluster\n",
            b"kind: preset\nname: \xff\xfe\n",
            b"\x00kind: preset\n",
            b"kind: preset\ntopology: ring\n" + b"#" * (2 << 20) + b"\n",
        ]))
    text = shipped[draw(st.integers(0, len(shipped) - 1))].read_text()
    lines = text.split("\n")
    values = [i for i, line in enumerate(lines) if re.match(r"^\s*[a-z_]+:\s*\S", line)]
    if kind == "value":
        i = values[draw(st.integers(0, len(values) - 1))]
        key = lines[i].split(":", 1)[0]
        lines[i] = f"{key}: {draw(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=10)))}"
    elif kind == "key":
        i = values[draw(st.integers(0, len(values) - 1))]
        key, rest = lines[i].split(":", 1)
        name = key.strip()
        j = draw(st.integers(0, len(name) - 1))
        typo = draw(st.sampled_from([name[:j] + name[j + 1:], name[:j] + name[j] * 2 + name[j + 1:],
                                     name + "s", name.upper(), draw(st.sampled_from(keys))]))
        lines[i] = key.replace(name, typo) + ":" + rest
    elif kind == "line":
        i = draw(st.integers(0, len(lines) - 1))
        if draw(st.booleans()):
            del lines[i]
        else:
            lines.insert(i, lines[i])
    raw = "\n".join(lines).encode()
    if kind == "bytes":
        pos = draw(st.integers(0, len(raw) - 1))
        data = draw(st.binary(min_size=1, max_size=4))
        raw = raw[:pos] + data + raw[pos + (len(data) if draw(st.booleans()) else 0):]
    return raw


def run_once(argv: list[str], counts: Counter) -> None:
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    start = time.monotonic()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = int(exc.code or 0)
    except Hang:
        counts["hang"] += 1
        raise AssertionError(f"hang: no answer in {TIME_LIMIT_S} s") from None
    except Exception as exc:  # what the user would see as a traceback
        counts["traceback"] += 1
        raise AssertionError(f"traceback: {type(exc).__name__}: {exc}") from exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    counts["slowest_ms"] = max(counts["slowest_ms"], int((time.monotonic() - start) * 1000))
    counts[code] += 1
    text = err.getvalue()
    assert code in (0, 2), text
    if code == 2:
        lines = text.splitlines()
        if len(lines) != 1 or not lines[0].startswith("triosim: error: "):
            counts["multi-line"] += 1
            raise AssertionError(f"not one line: {text!r}")


def _property(tmp_path_factory, counts: Counter, examples: int):
    base = tmp_path_factory.mktemp("topofuzz")
    trace = write_synthetic_trace(base / "t", SyntheticModel(layers=1, batch_size=4, seed=3))
    topo = base / "topo.yaml"

    @seed(20261224)
    @settings(max_examples=examples, deadline=None, database=None, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(documents())
    def prop(doc: bytes) -> None:
        topo.write_bytes(doc)
        run_once(["run", "-trace-dir", str(trace), "-case", "1", "-GPUnumber", "8", "--topology-file", str(topo),
                  "-q"], counts)

    return prop


@pytest.mark.skipif(os.name != "posix", reason="per-example time bound uses SIGALRM")
def test_fuzzed_topology_files_exit_0_or_2_with_one_line(tmp_path_factory) -> None:
    counts: Counter = Counter()
    examples = int(os.environ.get("TRIOSIM_FUZZ_EXAMPLES", "40"))
    _property(tmp_path_factory, counts, examples)()
    print(f"\nfuzz (topology files): {counts[0] + counts[2]} runs, exit 0: {counts[0]}, exit 2: {counts[2]}, "
          f"tracebacks: {counts['traceback']}, multi-line: {counts['multi-line']}, hangs: {counts['hang']}, "
          f"slowest: {counts['slowest_ms']} ms")
    assert counts[2] > 0 and counts["traceback"] == counts["multi-line"] == counts["hang"] == 0


@pytest.mark.skipif(os.name != "posix", reason="per-example time bound uses SIGALRM")
def test_topology_property_catches_an_overflow(tmp_path_factory, monkeypatch) -> None:
    """Planted bug: the number check converts with float() first (OverflowError on 400 digits)."""
    original = tf._number

    def float_first(p, data, key, *args, **kwargs):
        if key in data and isinstance(data[key], int):
            float(data[key])
        return original(p, data, key, *args, **kwargs)

    monkeypatch.setattr(tf, "_number", float_first)
    with pytest.raises(AssertionError, match="traceback"):
        _property(tmp_path_factory, Counter(), 300)()


def _device_property(tmp_path_factory, counts: Counter, examples: int):
    base = tmp_path_factory.mktemp("devicefuzz")
    trace = write_synthetic_trace(base / "t", SyntheticModel(layers=1, batch_size=4, seed=3))
    device = base / "gpu.yaml"

    @seed(20261204)
    @settings(max_examples=examples, deadline=None, database=None, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(documents(SHIPPED_DEVICES, DEVICE_KEYS))
    def prop(doc: bytes) -> None:
        device.write_bytes(doc)
        run_once(["run", "-trace-dir", str(trace), "-case", "2", "-GPUnumber", "2", "--gpu-file", str(device), "-q"],
                 counts)

    return prop


@pytest.mark.skipif(os.name != "posix", reason="per-example time bound uses SIGALRM")
def test_fuzzed_device_files_exit_0_or_2_with_one_line(tmp_path_factory) -> None:
    counts: Counter = Counter()
    examples = int(os.environ.get("TRIOSIM_FUZZ_EXAMPLES", "40"))
    _device_property(tmp_path_factory, counts, examples)()
    print(f"\nfuzz (device files): {counts[0] + counts[2]} runs, exit 0: {counts[0]}, exit 2: {counts[2]}, "
          f"tracebacks: {counts['traceback']}, multi-line: {counts['multi-line']}, hangs: {counts['hang']}, "
          f"slowest: {counts['slowest_ms']} ms")
    assert counts[0] > 0 and counts[2] > 0
    assert counts["traceback"] == counts["multi-line"] == counts["hang"] == 0
