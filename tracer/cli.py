"""Command line of the tracer: ``triosim trace collect``, ``convert`` and ``repeat``.

``register(subparsers)`` adds the ``trace`` command (with ``collect`` / ``convert``) to the main
``triosim`` parser; every handler returns an exit code (0 ok, 2 bad input).  ``main(argv)`` runs the
same two commands standalone: ``python -m triosim.tracer.cli collect --model resnet18 ...``.
torch is imported only when ``collect`` runs, so ``convert`` works without it.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .convert import DEFAULT_TARGETS, ConvertOptions, TraceTables
from .errors import TracerError


def _targets(text: str) -> tuple[str, ...]:
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    if not items:
        raise argparse.ArgumentTypeError("give at least one op name, e.g. conv2d,linear")
    return items


def _batch_sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(sorted({_positive(t.strip()) for t in text.split(",") if t.strip()}))
    if len(sizes) < 2:
        raise argparse.ArgumentTypeError(f"give two or more different batch sizes, e.g. 8,16,32 (got '{text}')")
    return sizes


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_number(text: str) -> float:
    """A finite number > 0 (``--lr``): NaN, infinity, zero and negatives are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got '{text}'") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def _path(text: str) -> Path:
    """A file or directory name; an empty one (``--out ""``) is refused rather than read as the
    current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the name is empty; give a file or directory")
    return Path(text)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--targets", type=_targets, default=DEFAULT_TARGETS, metavar="OP,OP",
                   help="ops split under tensor parallelism (tpflag=1), with their backward "
                        "ops (default: conv2d,linear,embedding)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")


def _add_collect(sub: Any) -> None:
    p = sub.add_parser(
        "collect", help="train a model for a few steps and trace the last one",
        description="Run warm-up training iterations of a model, record one more with "
                    "torch.profiler and the execution-trace observer, and convert it to "
                    "trace.csv + tensor.csv in --out (raw JSON in --out/raw).")
    p.add_argument("--model", required=True,
                   help="torchvision classifier (vgg13, resnet50, densenet121, vit_b_16, ...), "
                        "gpt, gpt-h16, gpt-tiny, gpt2-small or tinycnn")
    p.add_argument("--batch-size", type=_positive, default=None, help="samples per step")
    p.add_argument("--batch-sizes", type=_batch_sizes, default=None, metavar="B,B,...",
                   help="trace several batch sizes for the op-time fit: the largest goes to --out, "
                        "the others to --out/batch-<B>/ (instead of --batch-size)")
    p.add_argument("--out", type=_path, required=True, help="output directory")
    p.add_argument("--device", default="auto",
                   help="auto (cuda when available, else cpu), cpu, cuda or cuda:N")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--iterations", type=_positive, default=3,
                   help="training steps in total; the last one is recorded (default 3)")
    p.add_argument("--image-size", type=_positive, default=224, help="image side (default 224)")
    p.add_argument("--num-classes", type=_positive, default=1000)
    p.add_argument("--seq-len", type=_positive, default=None,
                   help="tokens per sample for gpt models (default: the preset's)")
    p.add_argument("--data", type=_path, default=None, metavar="DIR",
                   help="ImageFolder directory to take the batch from (default: synthetic)")
    p.add_argument("--lr", type=_positive_number, default=None, help="learning rate (a finite number > 0)")
    p.add_argument("--no-foreach", dest="foreach", action="store_false",
                   help="per-tensor optimizer ops instead of multi-tensor (_foreach_) ones")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--raw-dir", type=_path, default=None,
                   help="where to keep the JSON pair (default: OUT/raw)")
    p.add_argument("--no-raw", dest="keep_raw", action="store_false",
                   help="do not keep the JSON pair")
    _add_common(p)
    p.set_defaults(func=cmd_collect)


def _add_convert(sub: Any) -> None:
    p = sub.add_parser(
        "convert", help="convert an execution-trace + profiler JSON pair to CSV",
        description="Pair an execution trace (ExecutionTraceObserver JSON) with the profiler "
                    "trace of the same step and write trace.csv + tensor.csv.  Needs no torch.")
    p.add_argument("--graph", type=_path, required=True, help="execution-trace JSON")
    p.add_argument("--profiler", type=_path, required=True, help="torch.profiler Chrome trace")
    p.add_argument("--out", type=_path, required=True, help="output directory")
    p.add_argument("--gpuid", type=int, default=0, help="value of the gpuid columns")
    p.add_argument("--batch-size", type=_positive, default=None,
                   help="batch the step was recorded at, written to meta.json (without it, triosim run "
                        "assumes 128 unless given --batch-size)")
    _add_common(p)
    p.set_defaults(func=cmd_convert)


def _add_repeat(sub: Any) -> None:
    p = sub.add_parser(
        "repeat", help="repeat a trace's transformer layer to L layers",
        description="Find the repeated transformer layer of a trace (from its op names and data "
                    "flow) and write a trace with that layer repeated to --layers L: forward, "
                    "backward and optimizer work, tensors renumbered, data flow intact, each op "
                    "at its mean time over the traced layers.")
    p.add_argument("--layers", type=_positive, required=True, help="layers of the written trace")
    p.add_argument("--in", dest="src", type=_path, required=True, metavar="DIR", help="trace directory to read")
    p.add_argument("--out", type=_path, required=True, metavar="DIR", help="trace directory to write")
    p.add_argument("--batch-size", type=_positive, default=None,
                   help="batch the trace was recorded at (default: from meta.json, else 128)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    p.set_defaults(func=cmd_repeat)


def add_commands(subparsers: Any) -> None:
    """Add ``collect``, ``convert`` and ``repeat`` to an argparse subparsers object."""
    _add_collect(subparsers)
    _add_convert(subparsers)
    _add_repeat(subparsers)


def register(subparsers: Any) -> None:
    """Add the ``trace`` command (``trace collect`` / ``convert`` / ``repeat``) to the triosim CLI."""
    p = subparsers.add_parser(
        "trace", help="collect, convert or repeat a PyTorch operator trace",
        description="Make TrioSim traces (trace.csv + tensor.csv) from PyTorch training steps.")
    sub = p.add_subparsers(dest="trace_command", metavar="{collect,convert,repeat}")
    sub.required = True
    add_commands(sub)


def _summary(tables: TraceTables, out: Path) -> str:
    stages: dict[str, tuple[int, float]] = {}
    for o in tables.ops:
        n, t = stages.get(o.stage, (0, 0.0))
        stages[o.stage] = (n + 1, t + o.cudatime_nooverlap)
    parts = ", ".join(f"{n} {s} ({t / 1000:.3f} ms)" for s, (n, t) in stages.items())
    total = sum(t for _, t in stages.values()) / 1000
    unique = len({r.tensor_id for r in tables.tensors})
    source = "kernel" if tables.stats.time_source == "kernels" else "CPU op"
    how = ("record-function id" if tables.stats.pairing == "record-function-id"
           else "per-thread name/sequence-number alignment (no record-function ids)")
    text = (f"wrote {out / 'trace.csv'}: {len(tables.ops)} ops: {parts}; total {total:.3f} ms "
            f"of {source} time\nwrote {out / 'tensor.csv'}: {len(tables.tensors)} rows, "
            f"{unique} tensors (ops paired with profiler events by {how})")
    if tables.stats.attention_mask == "mixed":
        text += (f"\nnote: {tables.stats.causal_attention_ops} of {tables.stats.attention_ops} fused "
                 "attention ops are causal: meta.json says attention_mask mixed, which triosim costs "
                 "as the full mask")
    if tables.stats.unpaired_ops:
        text += (f"\nnote: {tables.stats.unpaired_ops} of {tables.stats.top_level_ops} "
                 "operators had no profiler event: no time is known for them")
    return text


def _fail(message: str) -> int:
    print(f"triosim: error: {message}", file=sys.stderr)
    return 2


def cmd_convert(args: argparse.Namespace) -> int:
    """Handler of ``trace convert``."""
    from .convert import convert_files
    from .csvout import write_trace_dir

    try:
        tables = convert_files(args.graph, args.profiler,
                               ConvertOptions(targets=tuple(args.targets), gpuid=args.gpuid))
        write_trace_dir(tables, args.out, inputs=[args.graph, args.profiler])
        write_convert_meta(tables, args.out, args.graph, args.profiler, args.batch_size)
    except TracerError as exc:
        return _fail(str(exc))
    if not args.quiet:
        print(_summary(tables, args.out))
        if args.batch_size is None:
            print(f"note: {args.out / 'meta.json'} records no batch size (pass --batch-size): "
                  "triosim run will assume 128 unless given --batch-size")
    return 0


def cmd_repeat(args: argparse.Namespace) -> int:
    """Handler of ``trace repeat``."""
    from triosim.errors import TriosimError
    from triosim.trace.repeat import repeat_trace_dir

    try:
        summary = repeat_trace_dir(args.src, args.out, args.layers, batch_size=args.batch_size)
    except TriosimError as exc:
        return _fail(str(exc))
    if not args.quiet:
        print(summary.line(str(args.out)))
    return 0


def write_convert_meta(tables: TraceTables, out: Path, graph: Path, profiler: Path,
                       batch_size: int | None) -> Path:
    """meta.json beside the converted CSVs: what ``triosim run`` reads the batch and the time
    source (kernels or CPU ops) from, and the attention mask of its fused attention ops (none
    without such ops). Only facts the JSON pair and the flags give; no date, so
    converting the same pair twice writes the same bytes."""
    import json

    from .csvout import write_atomic

    meta = {
        "batch_size": batch_size,
        "converted_from": {"graph": Path(graph).name, "profiler": Path(profiler).name},
        "ops": len(tables.ops),
        "pairing": tables.stats.pairing,
        "time_source": tables.stats.time_source,
    }
    if tables.stats.attention_mask is not None:  # the step's fused attention: causal, full or mixed
        meta["attention_mask"] = tables.stats.attention_mask
    path = Path(out) / "meta.json"
    if path.resolve() in {Path(graph).resolve(), Path(profiler).resolve()}:
        raise TracerError(f"{path}: refusing to overwrite an input file")
    try:
        write_atomic(path, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise TracerError(f"{path}: cannot write ({exc.strerror})") from None
    return path


def cmd_collect(args: argparse.Namespace) -> int:
    """Handler of ``trace collect``."""
    from .collect import check_tracer_dependencies

    if (args.batch_size is None) == (args.batch_sizes is None):
        return _fail("give either --batch-size B or --batch-sizes B,B,... (one of the two)")
    missing = check_tracer_dependencies()
    if missing:
        return _fail(missing)
    if args.batch_sizes is None:
        return _collect_one(args, args.batch_size, args.out, args.raw_dir)
    # The largest batch is the trace simulations start from; the others sit beside it for the
    # op-time fit (triosim.compute.op_time reads --out/batch-<B>/).
    biggest = max(args.batch_sizes)
    for batch in sorted(args.batch_sizes, reverse=True):
        out = args.out if batch == biggest else args.out / f"batch-{batch}"
        raw = None if args.raw_dir is None else args.raw_dir / f"batch-{batch}"
        code = _collect_one(args, batch, out, raw)
        if code:
            return code
    return 0


def _collect_one(args: argparse.Namespace, batch: int, out: Path, raw_dir: Path | None) -> int:
    from .collect import CollectOptions, collect, command_line

    opts = CollectOptions(
        model=args.model, batch_size=batch, out_dir=out, device=args.device,
        optimizer=args.optimizer, iterations=args.iterations, image_size=args.image_size,
        num_classes=args.num_classes, seq_len=args.seq_len, data_dir=args.data, lr=args.lr,
        foreach=args.foreach, seed=args.seed, raw_dir=raw_dir, keep_raw=args.keep_raw,
        targets=tuple(args.targets), quiet=args.quiet, command=command_line())
    try:
        result = collect(opts)
    except TracerError as exc:
        return _fail(str(exc))
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}")
    except (RuntimeError, AssertionError) as exc:  # e.g. out of memory, image too small
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return _fail(f"training step of {args.model} failed: {first}")
    except KeyboardInterrupt:
        return _fail("interrupted")
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not args.quiet and result.tables is not None and result.trace_dir is not None:
        rec = result.recorded
        print(f"recorded {args.model} (batch {batch}) on {rec.device} "
              f"[{rec.device_name}]: warm-up {rec.warmup_iteration_s * 1000:.1f} ms/iteration")
        print(_summary(result.tables, result.trace_dir))
    return 0


class _NoAbbrevParser(argparse.ArgumentParser):
    """No abbreviated flags (``--lay 3`` for ``--layers 3``), in the sub-commands too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m triosim.tracer.cli {collect,convert} ...``."""
    parser = _NoAbbrevParser(
        prog="python -m triosim.tracer.cli",
        description="Collect PyTorch training-step traces and convert them to TrioSim CSV.")
    sub = parser.add_subparsers(dest="command", metavar="{collect,convert,repeat}")  # of the same class
    sub.required = True
    add_commands(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
