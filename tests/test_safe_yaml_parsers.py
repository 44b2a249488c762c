"""Settings files are read with libyaml's C parser where PyYAML has it: the same values as
PyYAML's pure-Python parser for every file the package ships, and the same one-line errors
(PyYAML's own words) for malformed text."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from triosim import safe_yaml
from triosim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted([*ROOT.glob("triosim/**/*.yaml"), *ROOT.glob("topologies/*.yaml")])
MALFORMED = ["a: [1, 2", "a: b: c", "- a\nb: 1", "a: 1\na: 2", '"unterminated', "a:\n  - b\n - c", "x: *nope",
             "{a: 1", "a: !!python/object:os.system 1", "a: 2024-13-45", "a: &x [*x]"]


def _read(text: str, loader) -> object:
    safe_yaml_loader = safe_yaml._safe_loader
    try:
        safe_yaml._safe_loader = lambda _yaml: loader
        return safe_yaml.parse_yaml_text(text, "f.yaml")
    except ConfigError as exc:
        return ("error", str(exc))
    finally:
        safe_yaml._safe_loader = safe_yaml_loader


@pytest.mark.skipif(not hasattr(yaml, "CSafeLoader"), reason="PyYAML built without libyaml")
def test_the_c_parser_reads_what_the_python_parser_reads() -> None:
    assert len(SHIPPED) > 20
    for path in SHIPPED:
        text = path.read_text()
        assert _read(text, yaml.CSafeLoader) == _read(text, yaml.SafeLoader), path
    for text in MALFORMED:
        got = _read(text, yaml.CSafeLoader)
        assert got == _read(text, yaml.SafeLoader) and got[0] == "error", text
