"""Seed-compatible collection script: ``python tracer/datacollect.py <batch_size>``.

Like the original tracer's script it trains each model of the original list (vgg11-19,
resnet18-152, densenet121-201) on one batch, records one iteration and leaves the JSON pair as
``data/graph/graph_<model>-iter<k>.json`` and ``data/profiler/profiler_<model>-iter<k>.json``,
ready for ``python tracer/dataprocess.py``.  Unlike it, it runs on the CPU when there is no GPU,
uses synthetic images unless ``./ILSVRC2012_img_val`` (or ``--images``) exists, and takes options.
A thin wrapper over ``triosim.tracer.collect``; the friendly form is ``triosim trace collect``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__":  # run as a script: don't let tracer/ shadow installed modules
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

try:
    from triosim.tracer.collect import (
        CollectOptions,
        check_tracer_dependencies,
        command_line,
        record_step,
    )
    from triosim.tracer.errors import TracerError
    from triosim.tracer.models import ORIGINAL_MODELS
except ImportError as _exc:  # pragma: no cover - only without an installed triosim
    sys.exit(f"error: cannot import triosim.tracer ({_exc}); install it: pip install -e '.[tracer]'")


def main(argv: Sequence[str] | None = None) -> int:
    """Collect the JSON pair of one training step per model; returns an exit code."""
    parser = argparse.ArgumentParser(allow_abbrev=False,
        prog="datacollect.py",
        description="Record one training iteration per model into data/graph and data/profiler.")
    parser.add_argument("batch_size", type=int, help="batch size")
    parser.add_argument("--models", default=",".join(ORIGINAL_MODELS),
                        help="comma-separated model names (default: the original's 13 CNNs)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--data-dir", type=Path, default=Path("data"),
                        help="writes <dir>/graph and <dir>/profiler (default: data)")
    parser.add_argument("--images", type=Path, default=Path("ILSVRC2012_img_val"),
                        help="ImageFolder to take the batch from, when it exists")
    parser.add_argument("--iterations", type=int, default=3,
                        help="steps per model, the last one recorded (default 3)")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args(argv)

    missing = check_tracer_dependencies()
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    graph_dir, profiler_dir = args.data_dir / "graph", args.data_dir / "profiler"
    graph_dir.mkdir(parents=True, exist_ok=True)
    profiler_dir.mkdir(parents=True, exist_ok=True)
    images = args.images if args.images.is_dir() else None
    status = 0
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        opts = CollectOptions(model=model, batch_size=args.batch_size, device=args.device,
                              optimizer=args.optimizer, iterations=args.iterations,
                              image_size=args.image_size, data_dir=images,
                              command=command_line())
        try:
            rec = record_step(opts, raw_dir=graph_dir)
        except TracerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except RuntimeError as exc:  # e.g. out of memory: skip the model, as the original did
            print(f"{model}: failed ({str(exc).splitlines()[0]}); skipped", file=sys.stderr)
            status = 1
            continue
        os.replace(rec.profiler_path, profiler_dir / rec.profiler_path.name)
        print(f"{model}: avg warm-up iteration {rec.warmup_iteration_s * 1000:.1f} ms on "
              f"{rec.device}; wrote {rec.graph_path} and {profiler_dir / rec.profiler_path.name}")
    return status


if __name__ == "__main__":
    sys.exit(main())
