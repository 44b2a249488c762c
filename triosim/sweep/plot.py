"""The scaling plot of a sweep: iteration time and speed-up versus GPU count, one line per case.

When other flags vary too, each point is the fastest configuration of that case and GPU count.
Speed-up = the fastest case-0 time (else the case's own fastest time at its fewest GPUs) / the
point's time. matplotlib is optional (``triosim[plot]``) and imported only here, Agg only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ..output import atomic_write
from ..strategy import CASE_NAMES
from .results import Row

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


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


def scaling_series(rows: Sequence[Row]) -> tuple[dict[int, list[tuple[int, float, float]]], bool]:
    """case → [(gpus, best ms, speed-up)] sorted by gpus; and whether any point is a best-of.

    The speed-up is training throughput (samples/s) over the baseline's: case 0 when swept,
    else the case's own fewest-GPU point. Data-parallel GPUs each train their own batch.
    """
    best: dict[int, dict[int, tuple[float, float]]] = {}  # case -> gpus -> (ms, samples/s)
    several = False
    for r in rows:
        o = r.outcome
        if not r.ok or o.makespan_ms is None or not o.samples_per_s:
            continue
        case, gpus = r.point.get("case"), r.point.get("gpus")
        cell = best.setdefault(case, {})
        if gpus in cell:
            several = True
            cell[gpus] = min(cell[gpus], (o.makespan_ms, o.samples_per_s))
        else:
            cell[gpus] = (o.makespan_ms, o.samples_per_s)
    zero = min(best[0].values())[1] if best.get(0) else None
    series = {}
    for case in sorted(best):
        pts = sorted(best[case].items())
        base = zero if zero is not None else pts[0][1][1]
        series[case] = [(g, ms, sps / base) for g, (ms, sps) in pts]
    return series, several


def write_plot(path: str, rows: Sequence[Row], title: str, protect: Sequence[Path] = ()) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no GUI backend

    series, several = scaling_series(rows)
    fig = Figure(figsize=(11, 4.6), layout="constrained")
    ax_t, ax_s = fig.subplots(1, 2)
    gpus_seen = sorted({g for pts in series.values() for g, _, _ in pts})
    for case, pts in series.items():
        xs = [g for g, _, _ in pts]
        style = {"linestyle": "--", "marker": "s"} if case == 0 else {"marker": "o"}
        label = f"case {case}: {CASE_NAMES.get(case, '?')}" + (" (runs on 1 GPU)" if case == 0 else "")
        ax_t.plot(xs, [ms for _, ms, _ in pts], label=label, **style)
        ax_s.plot(xs, [s for _, _, s in pts], label=label, **style)
    for ax, ylabel in ((ax_t, "iteration time (ms)"), (ax_s, "speed-up (× training throughput)")):
        ax.set_xlabel("GPUs")
        ax.set_ylabel(ylabel)
        if len(gpus_seen) > 1 and gpus_seen[0] > 0:
            ax.set_xscale("log", base=2)
        if gpus_seen:
            ax.set_xticks(gpus_seen, [str(g) for g in gpus_seen])
        ax.grid(True, alpha=0.3)
    ax_t.set_title("Iteration time")
    ax_s.set_title("Speed-up vs case 0" if 0 in series else "Speed-up vs fewest GPUs")
    if series:
        ax_s.legend(fontsize="small")
    else:
        ax_t.text(0.5, 0.5, "no configuration ran successfully", ha="center", va="center",
                  transform=ax_t.transAxes)
    fig.suptitle(title + ("  (each point: fastest of the other swept flags)" if several else ""))

    fmt = Path(path).suffix.lstrip(".").lower()
    metadata = {"Software": None} if fmt == "png" else None
    atomic_write(path, lambda fh: fig.savefig(fh, format=fmt, dpi=110, metadata=metadata), binary=True,
                 protect=protect)
