"""The sweep grid: which run flags vary, the values each takes, and their cartesian product.

Every flag of :func:`triosim.config.add_sim_flags` is an axis of the grid. The flag table is
read from that function itself, so a flag added there later is sweepable without touching this
module. A flag given once (``--gpus 8``) is an axis with one value; flags not given keep the
``run`` default. Points are numbered in grid order: the product of the axes in the order the
user gave them, first axis slowest. A flag that does not apply to a configuration (the
micro-batch of a data-parallel run, the GPU count of case 0) is collapsed: shown as ``n/a`` and
simulated once, not once per value (``APPLIES`` says which flag applies where).
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import DEFAULT_WORD, FlagSpec, FlagTable
from ..config.files import read_settings_mapping
from ..config.layout_flags import DESTS as LAYOUT_DESTS
from ..errors import ConfigError

__all__ = ["DEFAULT_WORD", "MAX_AXIS_VALUES", "MAX_SWEEP_POINTS", "NOT_APPLICABLE", "Axis", "FlagSpec", "FlagTable", "Grid", "Point", "build_grid",
           "display_value", "format_value", "inapplicable", "read_grid_file", "split_list"]

# Each point is validated, then simulated (tens of ms to seconds): 100,000 points is hours of
# work already, and checking them all before the first simulation takes about a minute. A grid
# asking for more is refused at once, from the axes' lengths, before any point is built.
MAX_SWEEP_POINTS = 100_000
MAX_AXIS_VALUES = 10_000  # values of one flag (before duplicates are dropped)


@dataclass(frozen=True)
class Axis:
    spec: FlagSpec
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Point:
    """One configuration of the grid.

    ``values`` holds the grid's columns as tables and files show them (axis name → value;
    ``default`` for a "use the default" sentinel such as ``-1``, ``n/a`` for a flag that does not
    apply to this configuration); ``config`` every run flag (dest → value), defaults filled in,
    ready to become the argparse namespace ``configure`` expects.
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
    every_combination: bool = False  # keep flags that do not apply (the sweep's --every-combination)

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
        """Points of the full product (before configurations a flag does not apply to coincide)."""
        n = 1
        for a in self.axes:
            n *= len(a.values)
        return n

    def points(self) -> list[Point]:
        """The product of the axes, in grid order. Unless ``every_combination``, a flag that does
        not apply to a configuration (``--micro-batch-size`` for data parallelism, ``--gpus`` for
        case 0, …) is set to its default and shown as ``n/a``, and configurations that then
        coincide are simulated once."""
        defaults = self.table.defaults()
        out: list[Point] = []
        seen: set[tuple] = set()
        swept = {a.spec.dest for a in self.axes}
        for combo in itertools.product(*(a.values for a in self.axes)):
            config = dict(defaults)
            for axis, value in zip(self.axes, combo):
                config[axis.spec.dest] = value
            shown = [display_value(a.spec, v) for a, v in zip(self.axes, combo)]
            if not self.every_combination:
                idle = inapplicable(config, swept)
                for i, axis in enumerate(self.axes):
                    if axis.spec.dest in idle:
                        config[axis.spec.dest] = axis.spec.default
                        shown[i] = NOT_APPLICABLE
                key = tuple(sorted(config.items(), key=lambda kv: kv[0]))
                if key in seen:
                    continue
                seen.add(key)
            out.append(Point(index=len(out), values=tuple(zip(self.columns, shown)),
                             config=tuple(config.items())))
        return out

    def to_dict(self) -> dict[str, list[Any]]:
        return {a.spec.name: list(a.values) for a in self.axes}


NOT_APPLICABLE = "n/a"  # shown for a flag that does not apply to a configuration


def _degree(config: Mapping[str, Any], dest: str) -> int:
    """A parallel degree flag (dp, tp, pp, cp, when the build has them); 1 when absent or unset."""
    value = config.get(dest)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


def _data_parallel(c: Mapping[str, Any]) -> int:
    """The data-parallel degree a point runs at: ``--dp``, or for degrees without it what ``run``
    derives from ``-GPUnumber`` (N / (tp · pp · cp), as Megatron does)."""
    if c.get("dp") is not None or not _hybrid(c):
        return _degree(c, "dp")
    gpus = c.get("gpus")
    model_parallel = _degree(c, "tp") * _degree(c, "pp") * _degree(c, "cp")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus % model_parallel:
        return 1  # run refuses the point; its row says why
    return max(1, gpus // model_parallel)


def _multi_gpu(c: Mapping[str, Any]) -> bool:
    return (c.get("case") != 0 or any(_degree(c, d) > 1 for d in ("tp", "pp", "cp"))
            or _data_parallel(c) > 1)


def _pipelined(c: Mapping[str, Any]) -> bool:
    return c.get("case") == 4 or _degree(c, "pp") > 1


def _hybrid(c: Mapping[str, Any]) -> bool:
    return any(c.get(d) is not None for d in ("dp", "tp", "pp", "cp"))


def _has_collectives(c: Mapping[str, Any]) -> bool:
    return c.get("case") in (1, 2, 3) or any(_degree(c, d) > 1 for d in ("tp", "cp")) or _data_parallel(c) > 1


# Which flags matter to which configurations (flag dest -> test on the run's config). A flag not
# listed applies to every configuration. Case 0 runs on one GPU whatever --gpus says.
APPLIES: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    # A point with degrees is a hybrid run: -case does not apply (results label it by its
    # composition), and a grid of cases × degrees simulates each composition once.
    "case": lambda c: all(c.get(d) is None for d in ("dp", "tp", "pp", "cp")),
    "gpus": _multi_gpu,
    "ptp_bandwidth": _multi_gpu,
    "interconnects": _multi_gpu,
    "topology": _multi_gpu,
    "topology_file": _multi_gpu,
    "link_latency_us": _multi_gpu,
    "num_rows": lambda c: _multi_gpu(c) and (c.get("interconnects") == 1 or c.get("topology") == "mesh"),
    "num_cols": lambda c: _multi_gpu(c) and (c.get("interconnects") == 1 or c.get("topology") == "mesh"),
    "gpus_per_node": lambda c: _multi_gpu(c) and c.get("topology") == "nvlink-cluster",
    "node_bandwidth": lambda c: _multi_gpu(c) and c.get("topology") == "nvlink-cluster",
    "collective_detail": _has_collectives,
    "collective_algo": _has_collectives,
    "collective_latency_us": _has_collectives,
    "collective_protocol": _has_collectives,
    "bucket_mb": lambda c: c.get("case") == 2 or _data_parallel(c) > 1 or _degree(c, "cp") > 1,
    "cp_comm_type": lambda c: _degree(c, "cp") > 1,
    # expert parallelism is folded over the data ranks: its options apply where it splits experts
    "moe_token_dispatcher": lambda c: _degree(c, "ep") > 1,
    "moe_imbalance": lambda c: _degree(c, "ep") > 1,
    "moe_shared_expert_overlap": lambda c: _degree(c, "ep") > 1,
    "moe_a2a_overlap": lambda c: _degree(c, "ep") > 1,
    "delay_wgrad_compute": lambda c: _degree(c, "ep") > 1,
    # recomputation's details belong to one granularity each (alone they imply it)
    "recompute_method": lambda c: _hybrid(c) and c.get("recompute") != "selective",
    "recompute_num_layers": lambda c: _hybrid(c) and c.get("recompute") != "selective",
    "recompute_modules": lambda c: _hybrid(c) and c.get("recompute") != "full",
    "offload_activations": _hybrid,
    # FP8 training's details need --dtype fp8, the optimizer-state dtypes the precision-aware
    # optimizer (`run` refuses them otherwise)
    "fp8_recipe": lambda c: c.get("dtype") == "fp8",
    "fp8_param_gather": lambda c: c.get("dtype") == "fp8",
    **dict.fromkeys(("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"),
                    lambda c: bool(c.get("use_precision_aware_optimizer"))),
    # A hybrid run cuts each replica's batch into micro-batches whatever its pp (gradient
    # accumulation): the micro-batch applies to every point given as degrees.
    "micro_batch_size": lambda c: _pipelined(c) or _hybrid(c),
    "schedule": _pipelined,
    "partition": _pipelined,
    "virtual_stages": _pipelined,
    **dict.fromkeys(LAYOUT_DESTS, _pipelined),  # the layer cuts of a pipeline
}


# Recomputation's details alone imply their granularity (``run --recompute-num-layers 2`` is full
# recomputation), but next to a swept ``--recompute`` they belong to its points of that granularity
# only: ``--recompute none,full --recompute-num-layers 2`` must not recompute the ``none`` point.
GRANULARITY_OF = {"recompute_method": "full", "recompute_num_layers": "full", "recompute_modules": "selective"}


def inapplicable(config: Mapping[str, Any], swept: Collection[str] = ()) -> set[str]:
    """The flag dests that do not change the simulation of ``config`` (``swept``: the dests the
    grid gives values, so a granularity given as ``none`` is told from one left at its default)."""
    idle = {dest for dest, applies in APPLIES.items() if dest in config and not applies(config)}
    if "recompute" in swept:
        idle |= {dest for dest, mode in GRANULARITY_OF.items() if dest in config and config.get("recompute") != mode}
    return idle


def display_value(spec: FlagSpec, value: Any) -> Any:
    """A value as tables and result files show it: a flag's "use the default" sentinel (``-1``
    or none) as ``default``, everything else as parsed."""
    if value == spec.default and (spec.default is None or spec.default == -1) and not isinstance(value, bool):
        return DEFAULT_WORD
    return value


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
    """Values in first-seen order, each once (``4`` and ``4.0`` or ``True`` stay apart)."""
    out: list[Any] = []
    seen: set[tuple[type, Any]] = set()
    for v in values:
        try:
            key: tuple[type, Any] = (type(v), v)
            if key in seen:
                continue
            seen.add(key)
        except TypeError:  # unhashable: compare by hand (never produced by FlagSpec.parse)
            if any(v == o and type(v) is type(o) for o in out):
                continue
        out.append(v)
    return tuple(out)


def read_grid_file(path: str | Path) -> list[tuple[str, list[Any]]]:
    """A grid file: a mapping flag → list of values (swept) or scalar (fixed).

    ``fixed:`` may hold a sub-mapping of scalars. JSON when the name ends in ``.json``, YAML
    otherwise, read within the limits of :mod:`triosim.safe_yaml` (1 MiB, 32 levels, 100,000
    values). One flag set twice in the file (``gpus`` and ``GPUnumber``, or a key of ``fixed:``
    given at the top as well) is an error naming both keys.
    """
    p = Path(path)
    data = read_settings_mapping(p, "--grid", "grid file")
    table = FlagTable.from_cli()
    keys: dict[str, str] = {}  # flag dest -> the key that set it

    def entry(name: object, where: str, values: list[Any]) -> str:
        spec = table.lookup(str(name), f"--grid {p}")
        label = f"{where}{name}"
        if spec.dest in keys:
            raise ConfigError(f"--grid {p}: keys {keys[spec.dest]!r} and {label!r} both set --{spec.name}; keep one")
        keys[spec.dest] = label
        for v in values:  # checked here too, so that a bad value's message names the file
            try:
                spec.parse(v)
            except ConfigError as exc:
                raise ConfigError(f"--grid {p}: {exc}") from None
        return str(name)

    entries: list[tuple[str, list[Any]]] = []
    for name, value in data.items():
        if str(name) == "fixed":
            if not isinstance(value, dict):
                raise ConfigError(f"--grid {p}: 'fixed' must be a mapping of flag names to single values")
            for fname, fvalue in value.items():
                if isinstance(fvalue, (list, dict)):
                    raise ConfigError(f"--grid {p}: fixed value of {fname!r} must be a single value")
                entries.append((entry(fname, "fixed.", [fvalue]), [fvalue]))
            continue
        if isinstance(value, dict):
            raise ConfigError(f"--grid {p}: {name!r} must be a list of values or a single value")
        values = list(value) if isinstance(value, list) else [value]
        if not values:
            raise ConfigError(f"--grid {p}: {name!r} has an empty list of values")
        if len(values) > MAX_AXIS_VALUES:
            raise ConfigError(f"--grid {p}: {name!r} has {len(values):,} values, above the limit of "
                              f"{MAX_AXIS_VALUES:,} values per flag")
        entries.append((entry(name, "", values), values))
    return entries


def build_grid(
    table: FlagTable,
    file_entries: Sequence[tuple[str, Sequence[Any]]] = (),
    cli_entries: Sequence[tuple[str, Sequence[Any]]] = (),
    every_combination: bool = False,
) -> Grid:
    """Axes from the grid file, then the command line; a flag given again replaces its values
    but keeps its place in the order."""
    order: list[str] = []
    values: dict[str, tuple[Any, ...]] = {}
    specs: dict[str, FlagSpec] = {}
    for name, raw_values in (*file_entries, *cli_entries):
        spec = table.lookup(name)
        if len(raw_values) > MAX_AXIS_VALUES:  # before parsing a million values one by one
            raise ConfigError(f"--{spec.name}: {len(raw_values):,} values, above the limit of "
                              f"{MAX_AXIS_VALUES:,} values per flag")
        parsed = _dedupe(spec.parse(v) for v in raw_values)
        if spec.dest not in values:
            order.append(spec.dest)
        values[spec.dest] = parsed
        specs[spec.dest] = spec
    grid = Grid(tuple(Axis(specs[d], values[d]) for d in order), table, every_combination)
    check_grid_size(grid)
    return grid


def check_grid_size(grid: Grid) -> None:
    """Refuse, before a single point is built, a product of more than :data:`MAX_SWEEP_POINTS`."""
    n = len(grid)
    if n > MAX_SWEEP_POINTS:
        sizes = " × ".join(f"{len(a.values):,} {a.spec.name}" for a in grid.swept)
        raise ConfigError(f"the sweep has {n:,} configurations ({sizes}), above the limit of "
                          f"{MAX_SWEEP_POINTS:,}: sweep fewer values")
