"""Seed-compatible conversion script: ``python tracer/dataprocess.py``.

Like the original it converts every pair ``data/graph/graph_<key>.json`` +
``data/profiler/profiler_<key>.json`` into ``data/middledata/trace/<model>/{trace,tensor}.csv``
(``<model>`` is ``<key>`` without its ``-iter<k>`` suffix).  It also converts one explicit pair:
``python tracer/dataprocess.py GRAPH.json PROFILER.json [--out DIR]``.  A thin wrapper over
``triosim.tracer.convert``; the friendly form is ``triosim trace convert``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__":  # run as a script: don't let tracer/ shadow installed modules
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

try:
    from triosim.tracer.convert import DEFAULT_TARGETS, ConvertOptions, convert_files
    from triosim.tracer.csvout import write_trace_dir
    from triosim.tracer.errors import TracerError
except ImportError as _exc:  # pragma: no cover - only without an installed triosim
    sys.exit(f"error: cannot import triosim.tracer ({_exc}); install it: pip install -e .")


def _model_of(graph: Path) -> str:
    key = graph.stem[len("graph_"):] if graph.stem.startswith("graph_") else graph.stem
    return key.split("-iter")[0]


def find_pairs(data_dir: Path) -> list[tuple[Path, Path]]:
    """(graph, profiler) pairs of data_dir/graph and data_dir/profiler, matched by name."""
    graph_dir, profiler_dir = data_dir / "graph", data_dir / "profiler"
    for d in (graph_dir, profiler_dir):
        if not d.is_dir():
            raise TracerError(f"{d}: directory not found (run datacollect.py first, or give "
                              "GRAPH.json PROFILER.json)")
    pairs = []
    for graph in sorted(graph_dir.glob("graph_*.json")):
        profiler = profiler_dir / ("profiler_" + graph.name[len("graph_"):])
        if not profiler.is_file():
            raise TracerError(f"{graph}: no matching profiler file {profiler}")
        pairs.append((graph, profiler))
    if not pairs:
        raise TracerError(f"{graph_dir}: no graph_*.json files to convert")
    return pairs


def main(argv: Sequence[str] | None = None) -> int:
    """Convert JSON pairs to trace.csv + tensor.csv; returns an exit code."""
    parser = argparse.ArgumentParser(allow_abbrev=False,
        prog="dataprocess.py",
        description="Convert execution-trace + profiler JSON pairs to TrioSim CSV traces.")
    parser.add_argument("files", nargs="*", type=Path, metavar="GRAPH.json PROFILER.json",
                        help="one pair to convert (default: every pair under --data-dir)")
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory for an explicit pair (default: "
                             "<data-dir>/middledata/trace/<model>)")
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                        help="ops split under tensor parallelism (comma-separated)")
    args = parser.parse_args(argv)
    if len(args.files) not in (0, 2):
        parser.error("give no files, or exactly GRAPH.json PROFILER.json")
    options = ConvertOptions(targets=tuple(t for t in args.targets.split(",") if t.strip()))
    try:
        pairs = [(args.files[0], args.files[1])] if args.files else find_pairs(args.data_dir)
        for graph, profiler in pairs:
            out = args.out if (args.out and args.files) else (
                args.data_dir / "middledata" / "trace" / _model_of(graph))
            tables = convert_files(graph, profiler, options)
            write_trace_dir(tables, out, inputs=[graph, profiler])
            print(f"{graph.name}: {len(tables.ops)} ops, {len(tables.tensors)} tensor rows -> "
                  f"{out}")
    except TracerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
