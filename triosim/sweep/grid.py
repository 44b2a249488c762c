"""The sweep grid: which run flags vary, the values each takes, and their cartesian product.

Every flag of :func:`triosim.cli.add_sim_flags` is an axis of the grid. The flag table is read
from that function itself, so a flag added there later is sweepable without touching this
module. A flag given once (``--gpus 8``) is an axis with one value; flags not given keep the
``run`` default. Points are numbered in grid order: the product of the axes in the order the
user gave them, first axis slowest.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError

DEFAULT_WORD = "default"  # a value spelling that means "the run default of this flag"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class FlagSpec:
    """One flag of ``triosim run`` as the sweep sees it."""

    dest: str
    name: str  # column name: the last (most readable) long option, e.g. ``gpus``
    options: tuple[str, ...]
    type: Callable[[str], Any] | None
    choices: tuple[Any, ...] | None
    is_bool: bool
    default: Any
    help: str
    group: str

    def parse(self, raw: Any) -> Any:
        """One value, from a command-line token or a YAML/JSON scalar, checked like ``run`` does."""
        if raw is None or (isinstance(raw, str) and raw.strip().lower() == DEFAULT_WORD):
            return self.default
        if self.is_bool:
            if isinstance(raw, bool):
                return raw
            word = str(raw).strip().lower()
            if word in _TRUE:
                return True
            if word in _FALSE:
                return False
            raise ConfigError(f"--{self.name}: {raw!r} is not a boolean (true/false)")
        if isinstance(raw, bool) or isinstance(raw, (list, dict)):
            raise ConfigError(f"--{self.name}: {raw!r} is not a valid value")
        value: Any = raw.strip() if isinstance(raw, str) else raw
        if self.type is int and isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"--{self.name}: {raw!r} is not an integer")
        if self.type is not None:
            try:
                value = self.type(int(value) if self.type is int and isinstance(value, float) else value)
            except (TypeError, ValueError):
                kind = {int: "an integer", float: "a number"}.get(self.type, "a valid value")
                raise ConfigError(f"--{self.name}: {raw!r} is not {kind}") from None
        elif not isinstance(value, str):
            value = str(value)
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"--{self.name}: {raw!r} is not one of {', '.join(map(str, self.choices))}"
            )
        return value


def _key(name: str) -> str:
    """Spelling-insensitive flag key: ``-GPUnumber``, ``gpunumber``, ``ptp_bandwidth``, …"""
    return name.strip().lstrip("-").replace("_", "-").lower()


@dataclass(frozen=True)
class FlagTable:
    """All sweepable flags, in ``add_sim_flags`` order, with a lookup by any spelling."""

    specs: tuple[FlagSpec, ...]

    @classmethod
    def from_cli(cls) -> FlagTable:
        from ..cli import add_sim_flags

        parser = argparse.ArgumentParser(add_help=False)
        add_sim_flags(parser)
        specs = []
        # argparse keeps groups and actions in private lists; they have been stable since 2.7
        # and reading them is what keeps this table in step with `triosim run`.
        for group in parser._action_groups:
            for action in group._group_actions:
                if not action.option_strings:
                    continue
                longs = [o for o in action.option_strings if o.startswith("--")]
                is_bool = action.nargs == 0 and action.const is True
                specs.append(
                    FlagSpec(
                        dest=action.dest,
                        name=(longs or action.option_strings)[-1].lstrip("-"),
                        options=tuple(action.option_strings),
                        type=action.type if callable(action.type) else None,
                        choices=tuple(action.choices) if action.choices else None,
                        is_bool=is_bool,
                        default=action.default,
                        help=action.help or "",
                        group=group.title or "",
                    )
                )
        return cls(tuple(specs))

    def lookup(self, name: str) -> FlagSpec:
        key = _key(name)
        for spec in self.specs:
            if key == _key(spec.dest) or any(key == _key(o) for o in spec.options):
                return spec
        known = ", ".join(s.name for s in self.specs)
        raise ConfigError(f"unknown flag {name!r} in the sweep grid (known: {known})")

    def by_dest(self, dest: str) -> FlagSpec:
        for spec in self.specs:
            if spec.dest == dest:
                return spec
        raise KeyError(dest)

    def defaults(self) -> dict[str, Any]:
        return {s.dest: s.default for s in self.specs}


@dataclass(frozen=True)
class Axis:
    spec: FlagSpec
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Point:
    """One configuration of the grid.

    ``values`` holds the grid's columns (axis name → value); ``config`` every run flag (dest →
    value), defaults filled in, ready to become the argparse namespace ``configure`` expects.
    """

    index: int
    values: tuple[tuple[str, Any], ...]
    config: tuple[tuple[str, Any], ...]

    def namespace(self) -> argparse.Namespace:
        return argparse.Namespace(**dict(self.config))

    def get(self, dest: str) -> Any:
        return dict(self.config)[dest]

    def label(self) -> str:
        return " ".join(f"{k}={format_value(v)}" for k, v in self.values)


@dataclass(frozen=True)
class Grid:
    axes: tuple[Axis, ...]
    table: FlagTable

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(a.spec.name for a in self.axes)

    @property
    def swept(self) -> tuple[Axis, ...]:
        """Axes with more than one value (the ones worth a column on the terminal)."""
        return tuple(a for a in self.axes if len(a.values) > 1)

    @property
    def fixed(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if len(a.values) == 1)

    def __len__(self) -> int:
        n = 1
        for a in self.axes:
            n *= len(a.values)
        return n

    def points(self) -> list[Point]:
        defaults = self.table.defaults()
        out = []
        combos = itertools.product(*(a.values for a in self.axes))
        for i, combo in enumerate(combos):
            config = dict(defaults)
            for axis, value in zip(self.axes, combo):
                config[axis.spec.dest] = value
            out.append(
                Point(
                    index=i,
                    values=tuple((a.spec.name, v) for a, v in zip(self.axes, combo)),
                    config=tuple(config.items()),
                )
            )
        return out

    def to_dict(self) -> dict[str, list[Any]]:
        return {a.spec.name: list(a.values) for a in self.axes}


def format_value(value: Any) -> str:
    """How a flag value is written in CSV cells and on the terminal (deterministic)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def split_list(raw: str) -> list[str]:
    """``"2, 4,8"`` → ``["2", "4", "8"]`` (empty items are an error, not silently dropped)."""
    items = [tok.strip() for tok in raw.split(",")]
    if any(not tok for tok in items):
        raise ConfigError(f"empty item in the comma list {raw!r}")
    return items


def _dedupe(values: Iterable[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for v in values:
        if not any(v == o and type(v) is type(o) for o in out):
            out.append(v)
    return tuple(out)


def read_grid_file(path: str | Path) -> list[tuple[str, list[Any]]]:
    """A grid file: a mapping flag → list of values (swept) or scalar (fixed).

    ``fixed:`` may hold a sub-mapping of scalars. JSON when the name ends in ``.json``, YAML
    otherwise (PyYAML is needed only then).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--grid {p}: cannot read ({exc.strerror})") from None
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--grid {p}: invalid JSON ({exc})") from None
    else:
        try:
            import yaml
        except ImportError:
            raise ConfigError(
                f"--grid {p}: reading YAML needs PyYAML (pip install 'triosim[yaml]'), or use a .json file"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--grid {p}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"--grid {p}: expected a mapping of flag names to lists of values")
    entries: list[tuple[str, list[Any]]] = []
    for name, value in data.items():
        if str(name) == "fixed":
            if not isinstance(value, dict):
                raise ConfigError(f"--grid {p}: 'fixed' must be a mapping of flag names to single values")
            for fname, fvalue in value.items():
                if isinstance(fvalue, (list, dict)):
                    raise ConfigError(f"--grid {p}: fixed value of {fname!r} must be a single value")
                entries.append((str(fname), [fvalue]))
            continue
        if isinstance(value, dict):
            raise ConfigError(f"--grid {p}: {name!r} must be a list of values or a single value")
        values = list(value) if isinstance(value, list) else [value]
        if not values:
            raise ConfigError(f"--grid {p}: {name!r} has an empty list of values")
        entries.append((str(name), values))
    return entries


def build_grid(
    table: FlagTable,
    file_entries: Sequence[tuple[str, Sequence[Any]]] = (),
    cli_entries: Sequence[tuple[str, Sequence[Any]]] = (),
) -> Grid:
    """Axes from the grid file, then the command line; a flag given again replaces its values
    but keeps its place in the order."""
    order: list[str] = []
    values: dict[str, tuple[Any, ...]] = {}
    specs: dict[str, FlagSpec] = {}
    for name, raw_values in (*file_entries, *cli_entries):
        spec = table.lookup(name)
        parsed = _dedupe(spec.parse(v) for v in raw_values)
        if spec.dest not in values:
            order.append(spec.dest)
        values[spec.dest] = parsed
        specs[spec.dest] = spec
    return Grid(tuple(Axis(specs[d], values[d]) for d in order), table)
