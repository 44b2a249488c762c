"""Model cards as untrusted input: a ``name`` that is a path never writes outside the trace
cache, and a card run's errors name the card, never the cached trace's ``tensor.csv``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from cli_capture import run

from triosim.config.model_flags import cached_card_trace
from triosim.trace.model_card import get_card, packaged_dir
from triosim.trace.synthetic_card import CardTraceSpec

NEO = (packaged_dir() / "gpt-neo-1.3b.yaml").read_text()



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


TINY = """name: tiny
layers: 2
hidden: 128
heads: 64
kv_heads: 64
ffn: 256
vocab: 128
seq_len: 10000000
activation: gelu
norm: layernorm
bias: true
tied_embeddings: true
attention: standard
position: rope
"""
TOO_LARGE = ("the training step built from the card (sequence 10,000,000, 1 sequence per op, 2 layers) is refused: "
             "tensor of 6400000000000000 x 2 bytes is larger than the limit of 9,007,199,254,740,992 bytes (a shorter "
             "--seq-len, a smaller -micro-batch-size or -batch-size-sim, or fewer --num-layers make it smaller)")


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    card = tmp_path / "tiny.yaml"
    card.write_text(TINY)
    return card


@pytest.mark.parametrize("command", [["run", "-q"], ["dag", "--export", "{tmp}/x.dot"],
                                     ["plan", "--gpus", "1", "--global-batch", "1", "--top", "0", "-q"],
                                     ["sweep", "--jobs", "1", "-q"]], ids=["run", "dag", "plan", "sweep"])
def test_a_card_run_that_a_trace_check_refuses_names_the_card(command: list[str], tiny: Path, cache: Path,
                                                              tmp_path: Path) -> None:
    argv = [command[0], "--model-file", str(tiny), "--gpu", "h100", *(a.replace("{tmp}", str(tmp_path))
                                                                      for a in command[1:])]
    code, out, err = run(argv)
    assert code == 2 and "tensor.csv" not in err and "trace.csv" not in err, err
    if command[0] == "sweep":  # one invalid configuration, its reason on the -q line
        assert err.startswith("triosim: error: no configuration of the sweep ran successfully (1 invalid); ")
        assert f"--model-file {tiny}: {TOO_LARGE}" in err
    else:
        assert err == f"triosim: error: --model-file {tiny}: {TOO_LARGE}\n"


def test_a_shipped_card_is_named_by_its_flag(cache: Path) -> None:
    code, _, err = run(["run", "--model", "gpt3-175b", "--gpu", "h100", "--num-layers", "2", "--batch-size-sim",
                        "1000000", "-q"])
    assert code == 2
    assert err == ("triosim: error: --model gpt3-175b: the training step built from the card (sequence 2,048, "
                   "1,000,000 sequences per op, 2 layers) is refused: the tensors add up to more than "
                   "9,007,199,254,740,992 bytes (a shorter --seq-len, a smaller -micro-batch-size or -batch-size-sim, "
                   "or fewer --num-layers make it smaller)\n")


def test_an_out_of_memory_op_of_a_card_run_is_named_without_the_cached_file(tiny: Path, cache: Path) -> None:
    small = tiny.with_name("small.yaml")
    small.write_text(TINY.replace("seq_len: 10000000", "seq_len: 64"))
    code, _, err = run(["run", "--model-file", str(small), "--gpu", "h100", "--capacity", "12",
                        "--memory-overflow", "spill", "-q"])
    assert code == 2 and err.startswith("triosim: error: out of memory on GPU 0: op 1 (aten::embedding) needs ")
    assert ".csv" not in err
