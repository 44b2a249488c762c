"""Collection: run a few training iterations of a model and record the last one.

One iteration is the usual step: ``zero_grad(set_to_none=True)``, forward, loss, backward,
optimizer step.  After ``iterations - 1`` warm-up steps (the optimizer state exists, caches are
warm) the last step runs under torch.profiler (CPU activity, plus CUDA when on a GPU, shapes
recorded) and the execution-trace observer.  The two JSON files are written next to each other as
``graph_<model>-iter<k>.json`` and ``profiler_<model>-iter<k>.json`` (the original tracer's
names), then converted (see ``convert.py``).  torch is imported inside the functions only.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .convert import DEFAULT_TARGETS, ConvertOptions, TraceTables, convert_files
from .csvout import write_atomic, write_trace_dir
from .errors import TracerError
from .models import build_model

OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class CollectOptions:
    """Everything one collection needs."""

    model: str
    batch_size: int
    out_dir: Path | None = None  # trace.csv/tensor.csv go here (None: record only)
    device: str = "auto"  # "auto" = cuda when available, else cpu
    optimizer: str = "adam"
    iterations: int = 3  # total steps; the last one is recorded
    image_size: int = 224
    num_classes: int = 1000
    seq_len: int | None = None  # GPT models: tokens per sample (default: the preset's)
    data_dir: Path | None = None  # ImageFolder directory; None = synthetic tensors
    lr: float | None = None
    foreach: bool = True  # multi-tensor optimizer kernels, PyTorch's default on CUDA
    seed: int = 0
    raw_dir: Path | None = None  # where the JSON pair goes (default: <out_dir>/raw)
    keep_raw: bool = True
    targets: tuple[str, ...] = DEFAULT_TARGETS
    quiet: bool = False
    command: str = ""  # the command line, recorded in meta.json


@dataclass
class RecordedStep:
    """Paths of the JSON pair of one recorded step and facts about the run."""

    graph_path: Path
    profiler_path: Path
    device: str
    device_name: str
    warmup_iteration_s: float  # mean wall time of a warm-up iteration
    recorded_step_s: float  # wall time of the recorded step (with recording overhead)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class CollectResult:
    """A recorded step and, when converted, its tables and output directory."""

    recorded: RecordedStep
    tables: TraceTables | None
    trace_dir: Path | None
    warnings: list[str] = field(default_factory=list)


def quieten_torch_logs() -> None:
    """Silence the observer's and the profiler's C++ chatter; must run before torch loads.

    On a machine without an NVIDIA device the profiler's messages are all noise (e.g.
    "gpuGetDeviceCount failed"); on a GPU machine its warnings (CUPTI) are kept.
    """
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if not os.path.exists("/dev/nvidiactl"):
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def check_tracer_dependencies() -> str | None:
    """None when torch can be imported, else a one-line message saying how to install it."""
    quieten_torch_logs()
    try:
        import torch  # noqa: F401
    except ImportError:
        return ("collecting a trace needs PyTorch, which is not installed: "
                "pip install 'triosim[tracer]'")
    return None


def resolve_device(spec: str) -> Any:
    """``auto`` -> cuda when available else cpu; validates explicit choices."""
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        raise TracerError(f"--device: unknown device '{spec}' (use auto, cpu or cuda)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TracerError(f"--device {spec}: CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise TracerError(f"--device {spec}: only cpu and cuda are supported")
    return device


def _validate(opts: CollectOptions) -> None:
    if opts.batch_size < 1:
        raise TracerError(f"--batch-size must be positive, got {opts.batch_size}")
    if opts.iterations < 2:
        raise TracerError(f"--iterations must be at least 2 (warm-up + recorded), got "
                          f"{opts.iterations}")
    if opts.optimizer not in OPTIMIZERS:
        raise TracerError(f"--optimizer: unknown optimizer '{opts.optimizer}' "
                          f"(choose from {', '.join(OPTIMIZERS)})")
    if opts.data_dir is not None and not Path(opts.data_dir).is_dir():
        raise TracerError(f"{opts.data_dir}: image directory not found")


def _image_folder_batch(opts: CollectOptions, device: Any) -> tuple[Any, Any]:
    """The first ``batch_size`` images of an ImageFolder, preprocessed like ImageNet eval."""
    import torch
    from torchvision import datasets, transforms

    tf = transforms.Compose([
        transforms.Resize(max(1, opts.image_size * 256 // 224)),
        transforms.CenterCrop(opts.image_size),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    try:
        ds = datasets.ImageFolder(str(opts.data_dir), transform=tf)
    except (FileNotFoundError, OSError) as exc:
        raise TracerError(f"{opts.data_dir}: not an ImageFolder directory ({exc})") from None
    if len(ds) < opts.batch_size:
        raise TracerError(f"{opts.data_dir}: holds {len(ds)} images, fewer than the batch size "
                          f"{opts.batch_size}")
    samples = [ds[i] for i in range(opts.batch_size)]
    x = torch.stack([s[0] for s in samples]).to(device)
    y = torch.tensor([s[1] for s in samples], dtype=torch.long).to(device)
    return x, y


def _cpu_name() -> str:
    """The CPU model (Linux /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _optimizer(name: str, params: Any, lr: float | None, foreach: bool) -> Any:
    import torch

    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3 if lr is None else lr, foreach=foreach)
    return torch.optim.SGD(params, lr=1e-2 if lr is None else lr, momentum=0.9, foreach=foreach)


class _Progress:
    """A rich progress display on stderr that appears with its first task (so an early error
    leaves the terminal clean) and stays silent when quiet."""

    def __init__(self, quiet: bool) -> None:
        self._quiet = quiet
        self._progress: Any = None

    def add_task(self, description: str, total: int) -> int:
        if self._progress is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                      BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=Console(stderr=True), disable=self._quiet)
            self._progress.start()
        return int(self._progress.add_task(description, total=total))

    def advance(self, task: int) -> None:
        self._progress.advance(task)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()


@contextmanager
def _progress(quiet: bool) -> Iterator[_Progress]:
    progress = _Progress(quiet)
    try:
        yield progress
    finally:
        progress.stop()


def record_step(opts: CollectOptions, raw_dir: Path, progress: Any = None) -> RecordedStep:
    """Train ``opts.iterations`` steps and record the last one into ``raw_dir``."""
    _validate(opts)
    quieten_torch_logs()
    import torch

    device = resolve_device(opts.device)
    torch.manual_seed(opts.seed)
    spec = build_model(opts.model, image_size=opts.image_size, num_classes=opts.num_classes,
                       seq_len=opts.seq_len)
    if opts.data_dir is not None and spec.kind != "image":
        raise TracerError(f"--data: model '{opts.model}' takes tokens, not images")
    model = spec.module.to(device).train()
    gen = torch.Generator().manual_seed(opts.seed)
    if opts.data_dir is not None:
        x, y = _image_folder_batch(opts, device)
    else:
        x, y = spec.make_batch(opts.batch_size, device, gen)
    opt = _optimizer(opts.optimizer, model.parameters(), opts.lr, opts.foreach)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = spec.loss_fn(model(x), y)
        loss.backward()
        opt.step()

    recorded = record_iterations(step, device, opts.model, opts.iterations, raw_dir, progress)
    recorded.meta = {
        "model": opts.model,
        "model_description": spec.description,
        "batch_size": opts.batch_size,
        "image_size": opts.image_size if spec.kind == "image" else None,
        "seq_len": (x.shape[1] if spec.kind == "text" else None),
        "optimizer": opts.optimizer,
        "foreach": opts.foreach,
        "data": str(opts.data_dir) if opts.data_dir else "synthetic",
        "command": opts.command,
        **recorded.meta,
    }
    return recorded


def record_iterations(step: Callable[[], None], device: Any, label: str, iterations: int,
                      raw_dir: Path, progress: Any = None) -> RecordedStep:
    """Call ``step`` (one training iteration) ``iterations - 1`` times to warm up, then once more
    under torch.profiler and the execution-trace observer; the JSON pair goes to ``raw_dir`` as
    ``graph_<label>-iter<k>.json`` and ``profiler_<label>-iter<k>.json``. The returned meta holds
    the facts of the run (device, versions, timings), not those of the model."""
    quieten_torch_logs()
    import torch
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    warmups = iterations - 1
    task = progress.add_task(f"{label}: warm-up", total=warmups) if progress else None
    t0 = time.perf_counter()
    for _ in range(warmups):
        step()
        sync()
        if progress is not None:
            progress.advance(task)
    warmup_s = (time.perf_counter() - t0) / warmups

    raw_dir.mkdir(parents=True, exist_ok=True)
    k = iterations - 1
    graph_path = raw_dir / f"graph_{label}-iter{k}.json"
    profiler_path = raw_dir / f"profiler_{label}-iter{k}.json"
    graph_tmp = raw_dir / f".{graph_path.name}.tmp"
    profiler_tmp = raw_dir / f".{profiler_path.name}.tmp"
    if progress is not None:
        rec = progress.add_task(f"{label}: recording iteration {k}", total=1)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    et = ExecutionTraceObserver()
    et.register_callback(str(graph_tmp))
    sync()
    t1 = time.perf_counter()
    try:
        try:
            et.start()
            with warnings.catch_warnings():
                # Some PyTorch versions (2.11) warn on every profile() that events are cleared
                # "at the end of each cycle"; there is one cycle here and nothing is lost.
                warnings.filterwarnings("ignore", message=".*Profiler clears events",
                                        category=UserWarning)
                with profile(activities=activities, record_shapes=True) as prof:
                    step()
                    sync()
            et.stop()
        finally:
            et.unregister_callback()  # also finishes the JSON file
        step_s = time.perf_counter() - t1
        prof.export_chrome_trace(str(profiler_tmp))
        os.replace(graph_tmp, graph_path)
        os.replace(profiler_tmp, profiler_path)
    except BaseException:
        graph_tmp.unlink(missing_ok=True)
        profiler_tmp.unlink(missing_ok=True)
        raise
    if progress is not None:
        progress.advance(rec)

    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else _cpu_name())
    try:
        import torchvision

        tv_version = torchvision.__version__
    except ImportError:
        tv_version = None
    meta = {
        "iterations": iterations,
        "recorded_iteration": k,
        "device": str(device),
        "device_name": device_name,
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torchvision": tv_version,
        "python": platform.python_version(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "warmup_iteration_s": round(warmup_s, 4),
        "recorded_step_s": round(step_s, 4),
    }
    return RecordedStep(graph_path=graph_path, profiler_path=profiler_path, device=str(device),
                        device_name=device_name, warmup_iteration_s=warmup_s,
                        recorded_step_s=step_s, meta=meta)


def collect(opts: CollectOptions) -> CollectResult:
    """Record one step and convert it into ``opts.out_dir`` (trace.csv, tensor.csv, meta.json)."""
    if opts.out_dir is None:
        raise TracerError("--out is required")
    return collect_into(Path(opts.out_dir), lambda raw, progress: record_step(opts, raw, progress),
                        label=opts.model, raw_dir=opts.raw_dir, keep_raw=opts.keep_raw,
                        targets=opts.targets, quiet=opts.quiet)


def collect_into(out_dir: Path, record: Callable[[Path, Any], RecordedStep], *, label: str,
                 raw_dir: Path | None, keep_raw: bool, targets: tuple[str, ...],
                 quiet: bool) -> CollectResult:
    """Record one step with ``record(raw_dir, progress)`` and convert it into ``out_dir``
    (trace.csv, tensor.csv, meta.json); the JSON pair stays in ``raw_dir`` (default
    ``out_dir/raw``), or in a temporary directory when ``keep_raw`` is false."""
    try:  # fail before training, not after
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TracerError(f"{out_dir}: cannot create output directory ({exc.strerror})") from None
    with _progress(quiet) as progress, tempfile.TemporaryDirectory(
            prefix="triosim-trace-") as scratch:
        raw = Path(raw_dir) if raw_dir else (out_dir / "raw" if keep_raw else Path(scratch))
        recorded = record(raw, progress)
        conv = progress.add_task(f"{label}: converting", total=1)
        tables = convert_files(recorded.graph_path, recorded.profiler_path,
                               ConvertOptions(targets=targets))
        write_trace_dir(tables, out_dir, inputs=[recorded.graph_path, recorded.profiler_path])
        meta = dict(recorded.meta)
        meta.update({
            "ops": len(tables.ops),
            "time_source": tables.stats.time_source,
            "pairing": tables.stats.pairing,
            "raw": ([str(recorded.graph_path), str(recorded.profiler_path)]
                    if keep_raw or raw_dir else []),
        })
        if tables.stats.attention_mask is not None:  # causal, full or mixed
            meta["attention_mask"] = tables.stats.attention_mask
        write_atomic(out_dir / "meta.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")
        progress.advance(conv)
    notes = []
    if recorded.device.startswith("cuda") and tables.stats.time_source != "kernels":
        notes.append("the profiler recorded no CUDA kernels (is CUPTI usable?); the trace "
                     "holds CPU op times")
    return CollectResult(recorded=recorded, tables=tables, trace_dir=out_dir, warnings=notes)


def command_line() -> str:
    """The current process's command line, for meta.json."""
    if not sys.argv:
        return ""
    prog = Path(sys.argv[0])
    if prog.name == "cli.py" and prog.parent.name == "tracer":
        head = "python -m triosim.tracer.cli"
    elif prog.suffix == ".py":
        try:
            head = f"python {prog.resolve().relative_to(Path.cwd().resolve())}"
        except ValueError:
            head = f"python {prog}"
    else:
        head = prog.name
    return " ".join([head] + [shlex.quote(a) for a in sys.argv[1:]])
