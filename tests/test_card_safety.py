"""Model cards as untrusted input: a ``name`` that is a path never writes outside the trace
cache, and a card run's errors name the card, never the cached trace's ``tensor.csv``."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path

import pytest

from triosim.cli.console import main
from triosim.config.model_flags import cached_card_trace
from triosim.trace.model_card import get_card, packaged_dir
from triosim.trace.synthetic_card import CardTraceSpec

NEO = (packaged_dir() / "gpt-neo-1.3b.yaml").read_text()


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "a" / "b" / "cache"
    monkeypatch.setenv("TRIOSIM_CACHE_DIR", str(root))
    return root


@pytest.mark.parametrize("name", ["../../escaped", "../../../../escaped", "{tmp}/escaped", "a/b", "..", ".hidden",
                                  "x" * 101, "two\nlines", "tab\there", {"a": 1}, ["x"]])
def test_a_card_name_that_is_not_a_plain_name_is_refused(name, cache: Path, tmp_path: Path) -> None:
    if isinstance(name, str):
        name = name.replace("{tmp}", str(tmp_path))
    card = tmp_path / "card.yaml"
    card.write_text(NEO.replace("name: gpt-neo-1.3b", f"name: {json.dumps(name)}"))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, _, err = run(["run", "--model-file", str(card), "--gpu", "h100", "--num-layers", "2", "-q"])
    assert code == 2, err
    assert err.startswith(f"triosim: error: --model-file {card}: name: must be a plain name") and err.count("\n") == 1
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written anywhere


def test_the_cache_entry_stays_in_the_cache_whatever_the_name(cache: Path, tmp_path: Path) -> None:
    """Names never come unchecked from a file now, but the entry's directory is made safe by
    itself: a name that is a path still lands inside the cache."""
    for name in ("../../../escaped", str(tmp_path / "abs"), "..", ""):
        card = replace(get_card("gpt-neo-1.3b"), name=name)
        entry = cached_card_trace(CardTraceSpec(card, 1, 2, 2))
        assert entry.parent == cache / "model-traces" and entry.resolve().parent == (cache / "model-traces").resolve()
        assert json.loads((entry / "meta.json").read_text())["model_card"] == name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


@pytest.mark.parametrize("description", ["two\nlines", "a\rb", {"a": 1}, ["a"], "  "])
def test_a_card_description_is_one_line_of_text(description, tmp_path: Path) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(NEO.replace('description: "GPT-Neo 1.3B (Black et al. 2021; its local-attention layers costed '
                                'as global)"', f"description: {json.dumps(description)}"))
    code, out, err = run(["models", "--model-file", str(card), "--json"])
    assert code == 2 and out == ""
    assert err == f"triosim: error: {card}: description: must be a non-empty line of text, got {description!r}\n"
