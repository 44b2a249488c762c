"""Fuzzing model card files (``--model-file``): whatever the YAML, ``triosim run`` exits 0 or 2,
exit 2 comes with exactly one line on stderr, nothing raises, and nothing takes long.

Hypothesis mutates the shipped cards (a value replaced by a hostile one — a 400-digit integer,
NaN, ``.inf``, a list, a nested mapping —, a key misspelt, a line dropped or doubled, bytes
inserted or overwritten) and writes random YAML documents of card keys. Every file is run as a
card on a GPU with two layers (``--num-layers 2``: the builder and the simulation see every
shape the reader lets through). Each example must finish within :data:`TIME_LIMIT_S`. The seed
is fixed; ``TRIOSIM_FUZZ_EXAMPLES`` sets the number of examples (2,000 for the evidence, a few
dozen in the suite). A planted bug (the count check converting with float() first) shows the
property catches tracebacks.
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

import triosim.trace.model_card as mc
from triosim.cli.console import main

SHIPPED = sorted(mc.packaged_dir().glob("*.yaml"))
TIME_LIMIT_S = 20.0
HOSTILE = ["9" * 400, "-" + "9" * 400, ".nan", ".inf", "-.inf", "1e400", "-1", "0", "0.5", "1", "2", "3", "8", "96",
           "65536", "9223372036854775808", "abc", "[]", "{}", "null", "true", "[1, 2]", "{a: 1}", "''", "'8'", "0x10",
           "1_000", "gelu", "swiglu", "rmsnorm", "flash", "rope", "learned", "2020-13-45", "!!binary x", "&a 1", "*a",
           "!!python/object:os.system x", "[" * 50 + "]" * 50]
KEYS = sorted(mc.KEYS)


def _value(text: str) -> object:
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError):
        return text


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang


@st.composite
def cards(draw) -> bytes:
    kind = draw(st.sampled_from(["value", "value", "value", "key", "line", "bytes", "random"]))
    if kind == "random":
        leaves = st.one_of(st.sampled_from(HOSTILE), st.integers(-10**6, 10**6).map(str), st.text(max_size=8).map(repr))
        tree = st.recursive(leaves.map(_value), lambda kids: st.one_of(
            st.lists(kids, max_size=4), st.dictionaries(st.sampled_from(KEYS), kids, max_size=5)), max_leaves=20)
        return yaml.safe_dump(draw(st.dictionaries(st.sampled_from(KEYS), tree, max_size=16))).encode()
    text = SHIPPED[draw(st.integers(0, len(SHIPPED) - 1))].read_text()
    lines = text.split("\n")
    values = [i for i, line in enumerate(lines) if re.match(r"^\s*[a-z_]+:\s*\S", line)]
    if kind == "value":
        for _ in range(draw(st.integers(1, 3))):
            i = values[draw(st.integers(0, len(values) - 1))]
            key = lines[i].split(":", 1)[0]
            lines[i] = f"{key}: {draw(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=10)))}"
    elif kind == "key":
        i = values[draw(st.integers(0, len(values) - 1))]
        key, rest = lines[i].split(":", 1)
        name = key.strip()
        j = draw(st.integers(0, len(name) - 1))
        typo = draw(st.sampled_from([name[:j] + name[j + 1:], name[:j] + name[j] * 2 + name[j + 1:], name + "s",
                                     name.upper(), draw(st.sampled_from(KEYS))]))
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
    card = Path(tmp_path_factory.mktemp("cardfuzz")) / "card.yaml"

    @seed(20261205)
    @settings(max_examples=examples, deadline=None, database=None, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(cards())
    def prop(doc: bytes) -> None:
        card.write_bytes(doc)
        run_once(["run", "--model-file", str(card), "--gpu", "h100-sxm", "--num-layers", "2", "-q"], counts)

    return prop


@pytest.mark.skipif(os.name != "posix", reason="per-example time bound uses SIGALRM")
def test_fuzzed_model_cards_exit_0_or_2_with_one_line(tmp_path_factory) -> None:
    counts: Counter = Counter()
    examples = int(os.environ.get("TRIOSIM_FUZZ_EXAMPLES", "40"))
    _property(tmp_path_factory, counts, examples)()
    print(f"\nfuzz (model cards): {counts[0] + counts[2]} runs, exit 0: {counts[0]}, exit 2: {counts[2]}, "
          f"tracebacks: {counts['traceback']}, multi-line: {counts['multi-line']}, hangs: {counts['hang']}, "
          f"slowest: {counts['slowest_ms']} ms")
    assert counts[2] > 0 and counts["traceback"] == counts["multi-line"] == counts["hang"] == 0


@pytest.mark.skipif(os.name != "posix", reason="per-example time bound uses SIGALRM")
def test_model_card_property_catches_an_overflow(tmp_path_factory, monkeypatch) -> None:
    """Planted bug: the count check converts with float() first (OverflowError on 400 digits)."""
    original = mc._count

    def float_first(where, key, value):
        if isinstance(value, int):
            float(value)
        return original(where, key, value)

    monkeypatch.setattr(mc, "_count", float_first)
    with pytest.raises(AssertionError, match="traceback"):
        _property(tmp_path_factory, Counter(), 300)()
