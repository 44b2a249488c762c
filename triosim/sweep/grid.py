"""The sweep grid: which run flags vary, the values each takes, and their cartesian product.

Every flag of :func:`triosim.config.add_sim_flags` is an axis of the grid. The flag table is
read from that function itself, so a flag added there later is sweepable without touching this
module. A flag given once (``--gpus 8``) is an axis with one value; flags not given keep the
``run`` default. Points are numbered in grid order: the product of the axes in the order the
user gave them, first axis slowest.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import DEFAULT_WORD, FlagSpec, FlagTable, parse_mapping_text
from ..errors import ConfigError

__all__ = ["DEFAULT_WORD", "Axis", "FlagSpec", "FlagTable", "Grid", "Point", "build_grid", "format_value",
           "read_grid_file", "split_list"]

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
    data = parse_mapping_text(text, p, "--grid")
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
