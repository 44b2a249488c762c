"""Fuzzing ``--config`` files and ``sweep --grid`` files: whatever the file, ``triosim run
--config`` and ``triosim sweep --grid`` exit 0 or 2, exit 2 comes with exactly one line on
stderr, nothing raises, and nothing takes long.

Hypothesis mutates valid files (a value replaced by a hostile one — a 400-digit integer, NaN,
``.inf``, a 1,000-character name, a list, a nested mapping —, a key misspelt or respelt as
another spelling of the same flag, a line dropped or doubled, bytes inserted or overwritten)
and writes random YAML and JSON documents (nested mappings and lists, aliases, deep nesting,
alias bombs). Each example must finish within :data:`TIME_LIMIT_S` (an alarm turns a hang into
a failure). The seed is fixed; ``TRIOSIM_FUZZ_EXAMPLES`` sets the number of examples per kind
(2,000 for the evidence, a few dozen in the suite). The counts are printed, and a planted bug
(the OverflowError guard of ``FlagSpec.parse`` removed) shows the property catches tracebacks.
"""

from __future__ import annotations

import io
import json
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

from triosim.cli.console import main
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

TIME_LIMIT_S = 20.0
# Hostile values, but no valid value that makes a legitimately huge run (65,536 GPUs, 10,000
# layers, a case-1 run on 1,000 GPUs): those are the simulator's limits and costs (test_bad_input.py), not
# the file's.
HOSTILE = ["9" * 400, "-" + "9" * 400, ".nan", ".inf", "-.inf", "1e400", "-1", "0", "0.5", "1", "2", "4", "8",
           "9223372036854775808", "abc", "[]", "{}", "null", "true", "false", "[1, 2]", "{a: 1}", "''", "'8'",
           "0x10", "1_0", "2020-13-45", "!!binary x", "&a 1", "*a", "!!python/object:os.system x",
           "[" * 50 + "]" * 50, "a" * 1000, "/" + "b" * 300 + "/c", "default", "ring", "nvlink-cluster", "1f1b",
           "NaN", "'\\xff'", '"\\u0000"', "~"]
NUMERIC = ["9" * 400, "-" + "9" * 400, "1e400", ".nan", "9223372036854775808"]  # drawn more often
KEYS = ["case", "gpus", "GPUnumber", "bandwidth", "ptp_bandwidth", "ptp-bandwidth", "capacity", "interconnects",
        "numRows", "numCols", "topology", "gpus_per_node", "node_bandwidth", "link_latency_us", "network",
        "collective_algo", "collective_protocol", "micro_batch_size", "bucket_mb", "schedule", "partition",
        "reference_compat", "batch_size", "batch_size_sim", "time_column", "kernel_floor_us", "dp", "tp", "pp",
        "zero", "trace_dir", "topology_file", "gpu", "dtype", "ptp_bandwith", "cases", "fixed", "triosim_version"]
CONFIGS = [
    "case: 1\ngpus: 4\nbandwidth: 696\nptp_bandwidth: 65\ncapacity: 40\ntopology: ring\n",
    "case: 2\nGPUnumber: 2\nbucket_mb: 5\ncollective_algo: ring\nlink_latency_us: 1\nnetwork: flow\n",
    "case: 4\ngpus: 2\nmicro_batch_size: 2\nschedule: 1f1b\npartition: time\nkernel_floor_us: 2\n",
    "dp: 2\ntp: 2\nbandwidth: 300\ntopology: fully-connected\nreference_compat: false\n",
    "case: 0\nbatch_size_sim: 2\ntime_column: span\ninterconnects: 0\nnumRows: 1\n",
]
GRIDS = [
    "case: [0, 1]\ngpus: [2, 4]\nbandwidth: 100\n",
    "bandwidth: [100, 200, 300]\nfixed:\n  case: 1\n  GPUnumber: 4\n",
    "case: [1, 2]\nbucket_mb: [5, 25]\ngpus: 2\n",
    "case: 4\ngpus: [2]\nmicro_batch_size: [1, 2]\nschedule: [gpipe, 1f1b]\n",
    "dp: [1, 2]\ntp: [1, 2]\ntopology: [ring, switch]\n",
]


def _value(text: str) -> object:
    """A hostile scalar as YAML reads it (or the text itself when it does not read)."""
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError):
        return text


class Hang(BaseException):
    """Not an Exception: a sweep turns a configuration's exceptions into failed rows."""


def _alarm(signum, frame):
    raise Hang


def _random_document(draw, grid: bool) -> bytes:
    leaves = st.one_of(st.sampled_from(HOSTILE), st.integers(-10, 64).map(str), st.floats(allow_nan=True).map(repr),
                       st.text(max_size=8).map(repr))
    tree = st.recursive(leaves.map(_value),
                        lambda kids: st.one_of(st.lists(kids, max_size=3),
                                               st.dictionaries(st.sampled_from(KEYS), kids, max_size=3)),
                        max_leaves=8)
    doc = draw(st.dictionaries(st.sampled_from(KEYS), tree, max_size=4 if grid else 6))
    if draw(st.booleans()):
        try:
            return json.dumps(doc).encode()
        except (TypeError, ValueError):
            pass
    return yaml.safe_dump(doc).encode()


@st.composite
def documents(draw, bases: list[str], grid: bool) -> tuple[bytes, str]:
    """A config or grid file and its suffix: a mutated valid file, or random YAML/JSON."""
    kind = draw(st.sampled_from(["value", "value", "key", "line", "bytes", "random", "special"]))
    if kind == "random":
        data = _random_document(draw, grid)
        return data, ".json" if data.startswith(b"{") else ".yaml"
    if kind == "special":
        depth = draw(st.sampled_from([31, 33, 1000, 20_000]))
        level = draw(st.integers(2, 12))
        bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"b{i}: &b{i} [{', '.join([('*a' if i == 0 else f'*b{i - 1}')] * 9)}]\n" for i in range(level))
        doc, suffix = draw(st.sampled_from([
            ("case: " + "[" * depth + "]" * depth + "\n", ".yaml"),
            ('{"case": ' + "[" * depth + "]" * depth + "}", ".json"),
            ("case: " + "{a: " * depth + "1" + "}" * depth + "\n", ".yaml"),
            (bomb + "case: 1\n", ".yaml"),
            ("gpus: 2\nGPUnumber: 4\n", ".yaml"),
            ('{"gpus": 2, "gpus": 4}', ".json"),
            ("case: 1\ncase: 2\n", ".yaml"),
            ("case: 1\nname: \udcff\n", ".yaml"),
            ("\x00case: 1\n", ".yaml"),
            ("case: 1\n" + "#" * (2 << 20) + "\n", ".yaml"),
            ("bandwidth: " + ", ".join(["[1"] * 3) + "\n", ".yaml"),
            ("bandwidth: [" + ", ".join(str(i) for i in range(1, 20_001)) + "]\n", ".yaml"),
            ('{"bandwidth": [' + ", ".join(str(i) for i in range(1, 20_001)) + "]}", ".json"),
            ('{"bandwidth": [1, 2, 3], "ptp_bandwidth": [' + ", ".join(str(i) for i in range(1, 5001))
             + '], "gpus": [1, 2, 4, 8, 16, 32, 64, 128]}', ".json"),
            ("trace_dir: " + "a" * 1000 + "\n", ".yaml"),
            ("topology_file: " + "/x" * 3000 + "\n", ".yaml"),
        ]))
        return doc.encode("utf-8", "surrogateescape"), suffix
    text = draw(st.sampled_from(bases))
    lines = [line for line in text.split("\n")]
    values = [i for i, line in enumerate(lines) if re.match(r"^\s*[A-Za-z_-]+:\s*\S", line)]
    if kind == "value":
        i = values[draw(st.integers(0, len(values) - 1))]
        key = lines[i].split(":", 1)[0]
        lines[i] = f"{key}: {draw(st.one_of(st.sampled_from(HOSTILE), st.sampled_from(NUMERIC), st.text(max_size=10)))}"
    elif kind == "key":
        i = values[draw(st.integers(0, len(values) - 1))]
        key, rest = lines[i].split(":", 1)
        name = key.strip()
        j = draw(st.integers(0, len(name) - 1))
        typo = draw(st.sampled_from([name[:j] + name[j + 1:], name[:j] + name[j] * 2 + name[j + 1:],
                                     name + "s", name.upper(), name.replace("_", "-"), draw(st.sampled_from(KEYS))]))
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
    return raw, ".yaml"


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


def _property(tmp_path_factory, counts: Counter, examples: int, grid: bool):
    base = tmp_path_factory.mktemp("gridfuzz" if grid else "configfuzz")
    trace = write_synthetic_trace(base / "t", SyntheticModel(layers=1, batch_size=4, seed=3))
    bases = GRIDS if grid else CONFIGS

    @seed(20261225 if grid else 20261224)
    @settings(max_examples=examples, deadline=None, database=None, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(documents(bases, grid))
    def prop(case: tuple[bytes, str]) -> None:
        data, suffix = case
        path = base / f"file{suffix}"
        for old in base.glob("file.*"):
            old.unlink()
        path.write_bytes(data)
        if os.environ.get("TRIOSIM_FUZZ_KEEP"):  # every example's file, to find a slow one again
            keep = Path(os.environ["TRIOSIM_FUZZ_KEEP"])
            keep.mkdir(parents=True, exist_ok=True)
            (keep / f"{'grid' if grid else 'config'}-{counts[0] + counts[2]:05d}{suffix}").write_bytes(data)
        if grid:
            run_once(["sweep", "-trace-dir", str(trace), "--grid", str(path), "-j", "1", "-q"], counts)
        else:
            run_once(["run", "-trace-dir", str(trace), "--config", str(path), "-q"], counts)

    return prop


def _report(kind: str, counts: Counter) -> None:
    print(f"\nfuzz ({kind} files): {counts[0] + counts[2]} runs, exit 0: {counts[0]}, exit 2: {counts[2]}, "
          f"tracebacks: {counts['traceback']}, multi-line: {counts['multi-line']}, hangs: {counts['hang']}, "
          f"slowest: {counts['slowest_ms']} ms")


EXAMPLES = int(os.environ.get("TRIOSIM_FUZZ_EXAMPLES", "30"))


@pytest.mark.skipif(os.name != "posix", reason="per-example time bound uses SIGALRM")
def test_fuzzed_config_files_exit_0_or_2_with_one_line(tmp_path_factory) -> None:
    counts: Counter = Counter()
    try:
        _property(tmp_path_factory, counts, EXAMPLES, grid=False)()
    finally:
        _report("config", counts)
    assert counts[2] > 0 and counts["traceback"] == counts["multi-line"] == counts["hang"] == 0


@pytest.mark.skipif(os.name != "posix", reason="per-example time bound uses SIGALRM")
def test_fuzzed_grid_files_exit_0_or_2_with_one_line(tmp_path_factory) -> None:
    counts: Counter = Counter()
    try:
        _property(tmp_path_factory, counts, EXAMPLES, grid=True)()
    finally:
        _report("grid", counts)
    assert counts[2] > 0 and counts["traceback"] == counts["multi-line"] == counts["hang"] == 0


@pytest.mark.skipif(os.name != "posix", reason="per-example time bound uses SIGALRM")
def test_config_property_catches_an_overflow(tmp_path_factory, monkeypatch) -> None:
    """Planted bug: a float flag converted without the OverflowError guard (a 400-digit integer
    then ends in a traceback, as it did before)."""
    from triosim.config import flags

    original = flags.FlagSpec.parse

    def unguarded(self, raw):
        if self.type is float and isinstance(raw, int) and not isinstance(raw, bool):
            return float(raw)
        return original(self, raw)

    monkeypatch.setattr(flags.FlagSpec, "parse", unguarded)
    with pytest.raises(AssertionError, match="traceback"):
        _property(tmp_path_factory, Counter(), 500, grid=False)()
