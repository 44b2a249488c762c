"""Reading a small YAML (or JSON) settings file safely: topology files, device files, config and
grid files all go through :func:`load_yaml_file` (or :func:`parse_yaml_text` for text already read).

A settings file is a few hundred bytes of plain mappings, so anything far beyond that is refused
with one line naming the file, the line and the limit, before PyYAML builds a single object:

* the file is at most :data:`MAX_YAML_BYTES` (1 MiB) of UTF-8 text (an undecodable byte or a
  NUL byte is reported with its line);
* mappings and lists nest at most :data:`MAX_YAML_DEPTH` (32) deep: PyYAML's composer recurses
  once per level, so a ``description`` nested 20,000 deep used to end in a RecursionError;
* the document holds at most :data:`MAX_YAML_NODES` (100,000) values *with every alias
  expanded*: an "alias bomb" (nine anchors each listing the previous one nine times) is a few
  hundred bytes that expand to 10^9 values; PyYAML shares them, but every walk over the result
  (a check, an error message quoting it) does not;
* a key given twice in one mapping is an error (PyYAML keeps the last one silently).

The limits are checked on PyYAML's event stream (no recursion, no object built), then the
document is loaded with ``yaml.safe_load``. Every problem is a :class:`ConfigError` of one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import ConfigError

MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 100_000


def read_text_file(path: str | os.PathLike, what: str = "file", limit: int = MAX_YAML_BYTES) -> str:
    """The UTF-8 text of a small settings file; one-line ConfigErrors for a missing, unreadable,
    oversized or undecodable file (the line of the bad byte named)."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            data = fh.read(limit + 1)
    except FileNotFoundError:
        raise ConfigError(f"{p}: {what} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, not a {what}") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise ConfigError(f"{p}: {what} larger than the limit of {limit:,} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{p} line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x})") from None
    if "\x00" in text:
        raise ConfigError(f"{p} line {text.count(chr(10), 0, text.index(chr(0))) + 1}: contains a NUL byte")
    return text


def _one_line(text: object) -> str:
    return " ".join(str(text).split())[:200]


def _yaml_module(where: str):
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        raise ConfigError(f"{where}: reading YAML needs pyyaml (pip install pyyaml)") from None
    return yaml


def _safe_loader(yaml):
    """PyYAML's safe loader on libyaml's C parser where PyYAML was built with it (ten times the
    pure-Python parser's speed: a run reads every device and model card file), else its own."""
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _own_words(yaml, text: str, exc: Exception) -> Exception:
    """The error pure-Python PyYAML gives loading ``text`` (it names more: an undefined alias's
    name), else ``exc``."""
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as own:
        return own
    return exc


def check_yaml_events(text: str, where: str, *, max_depth: int = MAX_YAML_DEPTH,
                      max_nodes: int = MAX_YAML_NODES, loader=None) -> None:
    """Refuse a document nested deeper than ``max_depth``, expanding (aliases included) to more
    than ``max_nodes`` values, or repeating a key within a mapping; walks PyYAML's events only."""
    yaml = _yaml_module(where)
    ev = yaml.events
    total = 0  # values so far, every alias counted as the whole of what it names
    sizes: dict[str, tuple[int, int]] = {}  # anchor -> (values, depth below it)
    # Per open collection: [is mapping, anchor, total at its start, deepest below, next is a key, keys seen]
    stack: list[list[Any]] = []

    def line_of(event) -> int:
        return event.start_mark.line + 1 if event.start_mark is not None else 0

    def value(event, count: int, depth: int, key: object = None) -> None:
        nonlocal total
        total += count
        if total > max_nodes:
            raise ConfigError(f"{where} line {line_of(event)}: the document expands to more than {max_nodes:,} "
                              f"values (aliases included), above the limit for a settings file")
        if len(stack) + depth > max_depth:
            raise ConfigError(f"{where} line {line_of(event)}: nested more than {max_depth} levels deep, "
                              "above the limit for a settings file")
        for i, frame in enumerate(stack):
            frame[3] = max(frame[3], len(stack) - i - 1 + depth)
        if stack and stack[-1][0]:
            top = stack[-1]
            if top[4]:
                if key is not None:
                    if key in top[5]:
                        raise ConfigError(f"{where} line {line_of(event)}: key {_one_line(key)!r} given twice "
                                          "in one mapping")
                    top[5].add(key)
            top[4] = not top[4]

    try:
        for event in yaml.parse(text, Loader=loader or _safe_loader(yaml)):
            if isinstance(event, ev.ScalarEvent):
                value(event, 1, 0, event.value if event.tag in (None, "tag:yaml.org,2002:str") else None)
                if event.anchor is not None:
                    sizes[event.anchor] = (1, 0)
            elif isinstance(event, ev.AliasEvent):
                if any(frame[1] == event.anchor for frame in stack):  # a value containing itself
                    raise ConfigError(f"{where} line {line_of(event)}: alias *{_one_line(event.anchor)} is "
                                      "inside the value it names (a value cannot contain itself)")
                count, depth = sizes.get(event.anchor, (1, 0))
                value(event, count, depth)
            elif isinstance(event, (ev.MappingStartEvent, ev.SequenceStartEvent)):
                value(event, 1, 1)
                stack.append([isinstance(event, ev.MappingStartEvent), event.anchor, total, 1, True, set()])
            elif isinstance(event, (ev.MappingEndEvent, ev.SequenceEndEvent)):
                frame = stack.pop()
                if frame[1] is not None:
                    sizes[frame[1]] = (total - frame[2] + 1, frame[3])
    except yaml.YAMLError as exc:
        if (loader or _safe_loader(yaml)) is not yaml.SafeLoader:  # PyYAML's own words (they name more)
            check_yaml_events(text, where, max_depth=max_depth, max_nodes=max_nodes, loader=yaml.SafeLoader)
        raise ConfigError(_yaml_error(exc, where)) from None


def _yaml_error(exc: Exception, where: str) -> str:
    mark = getattr(exc, "problem_mark", None)
    at = f" line {mark.line + 1}" if mark is not None else ""
    return f"{where}{at}: not valid YAML ({_one_line(getattr(exc, 'problem', None) or exc)})"


def parse_yaml_text(text: str, where: str) -> Any:
    """``yaml.safe_load(text)`` within the limits above; ``where`` (a path, or ``--config PATH``)
    starts every error message. JSON is YAML, so a ``.json`` settings file reads the same."""
    yaml = _yaml_module(where)
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{where}: larger than the limit of {MAX_YAML_BYTES:,} bytes for a settings file")
    check_yaml_events(text, where)
    try:
        return yaml.load(text, Loader=_safe_loader(yaml))  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(_own_words(yaml, text, exc), where)) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # A constructor's own complaint (a date of month 13, an integer of 5,000 digits).
        raise ConfigError(f"{where}: not valid YAML ({_one_line(exc)})") from None


def load_yaml_file(path: str | os.PathLike, what: str = "file") -> Any:
    """The YAML document in ``path`` (see the module docstring for the limits)."""
    return parse_yaml_text(read_text_file(path, what), str(path))


__all__ = ["MAX_YAML_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_NODES", "check_yaml_events", "load_yaml_file",
           "parse_yaml_text", "read_text_file"]
