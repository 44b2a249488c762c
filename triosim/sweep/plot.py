"""The plot of a sweep: result columns (``--plot-y``) against one swept flag (``--plot-x``).

One panel per y column (default: training throughput and speed-up), one line per combination of
the other swept flags. A configuration the x flag does not apply to (case 0 when x is the GPU
count) is drawn as a dashed horizontal reference line. The speed-up is the table's: samples/s
over one baseline shared by every line (case 0 when it ran, else the fastest configuration on
the fewest GPUs). matplotlib is optional (``triosim[plot]``) and imported only here, Agg only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..graph.strategy import CASE_NAMES
from ..output import atomic_write
from .grid import NOT_APPLICABLE, Grid, format_value
from .results import Row

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
# y column -> axis label
PLOT_COLUMNS = {
    "samples_per_s": "training throughput (samples/s)",
    "speedup": "speed-up (× samples/s of the baseline)",
    "makespan_ms": "iteration time (ms)",
    "mean_compute_ms": "mean compute per GPU (ms)",
    "mean_exposed_comm_ms": "mean exposed communication per GPU (ms)",
    "max_peak_memory_bytes": "peak memory of the fullest GPU (GB)",
}


def require_matplotlib(path: str) -> None:
    """Fail before the sweep runs if the plot could not be drawn."""
    if Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise ConfigError(f"--plot {path}: the name must end in {', '.join(PLOT_SUFFIXES)}")
    parent = Path(path).parent if str(Path(path).parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"--plot {path}: output directory {parent} does not exist")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'triosim[plot]'") from None


def check_plot_axes(grid: Grid, plot_x: str | None, plot_y: str) -> tuple[str, tuple[str, ...]]:
    """(x column, y columns) of ``--plot-x`` / ``--plot-y``, checked before anything runs."""
    swept = [a.spec.name for a in grid.swept]
    if plot_x is None:
        x = "gpus" if "gpus" in swept or not swept else swept[0]
    else:
        x = grid.table.lookup(plot_x, "--plot-x").name
        if x not in swept:
            raise ConfigError(f"--plot-x {plot_x}: not a swept flag of this sweep "
                              f"(swept: {', '.join(swept) or 'none'})")
    ys = tuple(dict.fromkeys(y.strip() for y in plot_y.split(",") if y.strip()))
    bad = [y for y in ys if y not in PLOT_COLUMNS]
    if not ys or bad:
        raise ConfigError(f"--plot-y {plot_y}: each column must be one of {', '.join(PLOT_COLUMNS)}")
    return x, ys


@dataclass(frozen=True)
class Line:
    """One line of a panel: the configurations that share every swept value but x."""

    label: str
    points: tuple[tuple[Any, float], ...]  # (x value as shown, y), in x order
    reference: bool = False  # x does not apply (e.g. case 0 against GPUs): a horizontal line
    key: tuple[tuple[str, Any], ...] = ()  # the other swept columns' values


def _y(row: Row, column: str) -> float | None:
    if column == "speedup":
        return row.speedup
    value = getattr(row.outcome, column)
    if value is not None and column == "max_peak_memory_bytes":
        return value / 1e9
    return value


def _describe(name: str, value: Any) -> str:
    if name == "case" and isinstance(value, int):
        return f"case {value}: {CASE_NAMES.get(value, '?')}"
    return f"{name}={format_value(value)}"


def plot_lines(rows: Sequence[Row], x: str, y: str, swept: Sequence[str]) -> list[Line]:
    """Every line of the ``y`` panel, in grid order of their first configuration."""
    others = [c for c in swept if c != x]
    lines: dict[tuple, list[tuple[Any, float]]] = {}
    reference: dict[tuple, bool] = {}
    for r in rows:
        value = _y(r, y) if r.ok else None
        if value is None:
            continue
        shown = dict(r.point.values)
        key = tuple((c, shown[c]) for c in others)
        lines.setdefault(key, []).append((shown.get(x, NOT_APPLICABLE), value))
        reference[key] = shown.get(x) == NOT_APPLICABLE
    order = _x_order(rows, x)
    out = []
    for key, pts in lines.items():
        label = ", ".join(_describe(c, v) for c, v in key if v != NOT_APPLICABLE) or y
        pts_sorted = tuple(sorted(pts, key=lambda p: order.get(_hashable(p[0]), len(order))))
        if reference[key]:
            label += " (does not use " + x + ")"
        out.append(Line(label, pts_sorted, reference[key], key))
    return out


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


def line_styles(lines: Sequence[Line]) -> list[tuple[int, str, str]]:
    """(colour index, line style, marker) per line: one colour per value of the first other swept
    flag (usually the case), line style and marker for the rest, so related lines look related."""
    colour_of: dict[Any, int] = {}
    seen_in: dict[int, int] = {}
    out = []
    for line in lines:
        first = _hashable(line.key[0][1]) if line.key else None
        c = colour_of.setdefault(first, len(colour_of))
        k = seen_in.get(c, 0)
        seen_in[c] = k + 1
        out.append((c, LINE_STYLES[k % len(LINE_STYLES)], MARKERS[k % len(MARKERS)]))
    return out


def _hashable(v: Any) -> Any:
    return (type(v).__name__, v)


def _x_order(rows: Sequence[Row], x: str) -> dict[Any, int]:
    """x values in their natural order: numbers ascending, anything else in grid order."""
    values = [dict(r.point.values).get(x) for r in rows]
    values = [v for v in values if v is not None and v != NOT_APPLICABLE]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    distinct = list(dict.fromkeys(_hashable(v) for v in values))
    if numeric:
        distinct.sort(key=lambda hv: hv[1])
    return {hv: i for i, hv in enumerate(distinct)}


def _is_numeric(rows: Sequence[Row], x: str) -> bool:
    values = [dict(r.point.values).get(x) for r in rows]
    values = [v for v in values if v is not None and v != NOT_APPLICABLE]
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def write_plot(path: str, rows: Sequence[Row], title: str, protect: Sequence[Path] = (), *,
               x: str = "gpus", ys: Sequence[str] = ("samples_per_s", "speedup"),
               swept: Sequence[str] | None = None) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no GUI backend

    if swept is None:
        swept = _swept_columns(rows)
    numeric = _is_numeric(rows, x)
    order = _x_order(rows, x)
    ticks = sorted(order, key=order.get)
    panels = [(y, plot_lines(rows, x, y, swept)) for y in ys]
    n_lines = max((len(lines) for _, lines in panels), default=0)
    legend_outside = n_lines > 6
    fig = Figure(figsize=(5.6 * len(ys) + (3.4 if legend_outside else 0), 4.8), layout="constrained")
    axes = fig.subplots(1, len(ys), squeeze=False)[0]
    n_colours = max((c for _, lines in panels for c, _, _ in line_styles(lines)), default=0) + 1
    colors = _colors(n_colours)
    handles: list[Any] = []
    for ax, (y, lines) in zip(axes, panels):
        handles = []
        for line, (c, style, marker) in zip(lines, line_styles(lines)):
            color = colors[c % len(colors)]
            if line.reference:
                h = ax.axhline(line.points[0][1], color=color, linestyle="--", label=line.label)
            else:
                xs = [v if numeric else order[_hashable(v)] for v, _ in line.points]
                h, = ax.plot(xs, [v for _, v in line.points], marker=marker, linestyle=style, color=color,
                             label=line.label)
            handles.append(h)
        ax.set_xlabel(x)
        ax.set_ylabel(PLOT_COLUMNS[y])
        if numeric and ticks:
            tick_values = [v for _, v in ticks]
            if x == "gpus" and len(tick_values) > 1 and min(tick_values) > 0:
                ax.set_xscale("log", base=2)
            ax.set_xticks(tick_values, [format_value(v) for v in tick_values])
        elif ticks:
            ax.set_xticks(range(len(ticks)), [format_value(v) for _, v in ticks])
        ax.grid(True, alpha=0.3)
        if not lines:
            ax.text(0.5, 0.5, "no configuration ran successfully", ha="center", va="center",
                    transform=ax.transAxes)
        if y == "speedup":
            bases = sorted({r.speedup_vs for r in rows if r.ok and r.speedup_vs})
            ax.set_title(f"Speed-up vs {' / '.join(bases)}" if bases else "Speed-up")
        else:
            name = PLOT_COLUMNS[y].split(" (")[0]
            ax.set_title(name[:1].upper() + name[1:])
    if handles:
        if legend_outside:
            fig.legend(handles=handles, loc="outside right upper", fontsize="small")
        else:
            axes[0].legend(handles=handles, fontsize="small")
    fig.suptitle(title)

    fmt = Path(path).suffix.lstrip(".").lower()
    metadata = {"Software": None} if fmt == "png" else None
    atomic_write(path, lambda fh: fig.savefig(fh, format=fmt, dpi=110, metadata=metadata), binary=True,
                 protect=protect)


def _swept_columns(rows: Sequence[Row]) -> list[str]:
    """Columns whose shown value differs between rows (when the caller has no grid at hand)."""
    if not rows:
        return []
    names = [n for n, _ in rows[0].point.values]
    return [n for n in names if len({_hashable(dict(r.point.values)[n]) for r in rows}) > 1]


def _colors(n: int) -> list[str]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i) for i in range(cmap.N)]
