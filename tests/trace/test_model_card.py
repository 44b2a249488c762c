"""Model card files: the shipped ones cite a source for every number, and a bad card is one line
naming the file and the key (a misspelt key with a "did you mean")."""

from __future__ import annotations

from pathlib import Path

import pytest

from triosim.errors import ConfigError
from triosim.trace.model_card import (
    COUNT_FIELDS,
    get_card,
    packaged_dir,
    read_card_file,
    shipped_cards,
)

GOOD = (packaged_dir() / "megatron-22b.yaml").read_text(encoding="utf-8")
NAMES = {"megatron-22b", "gpt3-175b", "turing-530b", "megatron-1t", "llama2-7b", "llama2-70b", "llama3-8b",
         "llama3-70b", "llama3-405b", "gpt-neo-1.3b"}


def test_the_issue_cards_are_shipped_with_a_source_for_every_number() -> None:
    cards = shipped_cards()
    assert NAMES <= set(cards)
    for card in cards.values():
        missing = [k for k in (*COUNT_FIELDS, "dropout", "published_params") if k not in card.sources]
        assert not missing, (card.name, missing)


def test_unknown_model_name_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match=r"no such model card; did you mean gpt3-175b\?"):
        get_card("gpt3-175")


def _with(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, 1)


BAD = [
    ("missing key", _with("hidden: 6144\n", ""), "missing key 'hidden'"),
    ("misspelt key", _with("hidden: 6144", "hiden: 6144"), "unknown key 'hiden'; did you mean 'hidden'?"),
    ("heads do not divide hidden", _with("heads: 64", "heads: 7"), "heads: 7 does not divide hidden 6144"),
    ("kv heads do not divide heads", _with("kv_heads: 64", "kv_heads: 48"), "kv_heads: must divide heads 64"),
    ("unknown activation", _with("activation: gelu", "activation: relu"),
     "activation: must be one of gelu, swiglu, got 'relu'"),
    ("layers text", _with("layers: 48", "layers: abc"), "layers: must be a whole number, got 'abc'"),
    ("layers zero", _with("layers: 48", "layers: 0"), "layers: must be between 1 and 10,000, got 0"),
    ("layers 400 digits", _with("layers: 48", "layers: " + "9" * 400),
     "layers: must be between 1 and 10,000, got a number of 400 digits"),
    ("layers 1.5", _with("layers: 48", "layers: 1.5"), "layers: must be a whole number, got 1.5"),
    ("layers true", _with("layers: 48", "layers: true"), "layers: must be a whole number, got True"),
    ("dropout 1.5", _with("dropout: 0.1", "dropout: 1.5"), "dropout: must be a number from 0 to 0.99, got 1.5"),
    ("dropout nan", _with("dropout: 0.1", "dropout: .nan"), "dropout: must be a number from 0 to 0.99, got nan"),
    ("dropout 1e400", _with("dropout: 0.1", "dropout: " + "9" * 400), "dropout: must be a number from 0 to 0.99"),
    ("tied yes-string", _with("tied_embeddings: true", "tied_embeddings: 'yes'"),
     "tied_embeddings: must be true or false, got 'yes'"),
    ("a list", "- layers: 2\n", "expected a mapping of model fields"),
    ("sources misspelt", _with("sources:\n", "sources:\n  hiddn: x\n"), "sources: unknown key 'hiddn'; did you mean 'hidden'?"),
    ("empty file", "", "expected a mapping of model fields"),
    ("not YAML", "layers: [1, 2\n", "not valid YAML"),
    ("duplicate key", GOOD + "layers: 4\n", "key 'layers' given twice"),
]


@pytest.mark.parametrize("text,message", [(t, m) for _, t, m in BAD], ids=[n for n, _, _ in BAD])
def test_bad_card_is_one_line_naming_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "card.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        read_card_file(path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(str(path)) and message in line, line


def test_not_utf8_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "card.yaml"
    path.write_bytes(b"layers: 2\nname: \xff\n")
    with pytest.raises(ConfigError, match="line 2: not UTF-8"):
        read_card_file(path)
    with pytest.raises(ConfigError, match="model card not found"):
        read_card_file(tmp_path / "none.yaml")


def test_name_defaults_to_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "My-Model.yaml"
    path.write_text(GOOD.replace("name: megatron-22b\n", ""), encoding="utf-8")
    card = read_card_file(path)
    assert card.name == "my-model" and card.parameter_count() == get_card("megatron-22b").parameter_count()
