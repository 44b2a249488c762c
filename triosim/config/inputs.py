"""The files a command reads, in one list, so that no output of any command (``run --json``,
``dag --export``, ``plan --out``, ``sweep --plot`` …) can replace one of them.

Every command builds its list here, from its settings: the ``--config``, ``--grid``,
``--topology-file``, ``--gpu-file`` and ``--model-file`` files, and the trace files
(``trace.csv``, ``tensor.csv``, ``meta.json``, and those of the ``batch-<N>/`` traces inside
it) of the trace directory. A new input flag is added to
:data:`INPUT_FILE_FLAGS` once, and every command then spares it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..compute.op_time import other_batch_dirs
from ..errors import ConfigError
from ..hardware.topology_file import resolve as resolve_topology_file
from ..output import refuse_overwriting_inputs
from .trace_dirs import trace_dir_from_flag

# dest -> flag of every setting that names a file a command reads
INPUT_FILE_FLAGS = {"config": "--config", "grid": "--grid", "topology_file": "--topology-file",
                    "gpu_file": "--gpu-file", "model_file": "--model-file"}
TRACE_FILES = ("trace.csv", "tensor.csv", "meta.json")


def _values(settings: argparse.Namespace | Mapping[str, Any], dest: str) -> list[Any]:
    """A setting's value, or each of its values (a sweep's axis holds a list)."""
    value = settings.get(dest) if isinstance(settings, Mapping) else getattr(settings, dest, None)
    if isinstance(value, (list, tuple)):
        return [v for v in value if v is not None]
    return [] if value is None else [value]


def trace_files(trace_dir: str | os.PathLike) -> list[Path]:
    """The files of a trace directory a run may read: its own and its ``batch-<N>/`` traces'."""
    root = Path(trace_dir)
    dirs = [root, *(d for _, d in other_batch_dirs(root))]
    return [d / name for d in dirs for name in TRACE_FILES]


def input_files(settings: argparse.Namespace | Mapping[str, Any],
                trace_dirs: Iterable[str | os.PathLike] | None = None) -> list[Path]:
    """Every file a command with ``settings`` (parsed flags, or dest -> value or list of values)
    reads. ``trace_dirs``: the trace directories it loads (default: each ``--trace-dir``, else the
    embedded sample)."""
    files: list[Path] = []
    for dest in INPUT_FILE_FLAGS:
        for value in _values(settings, dest):
            if not str(value).strip():
                continue  # "" is refused by the flag's own check
            if dest == "topology_file":  # a bare name may mean a shipped file
                try:
                    value = resolve_topology_file(value)
                except ConfigError:
                    pass
            files.append(Path(value))
    if trace_dirs is None:
        # the embedded sample too when a model card is given: sparing it costs nothing
        trace_dirs = []
        for value in _values(settings, "trace_dir") or [None]:
            try:
                trace_dirs.append(trace_dir_from_flag(value))
            except ConfigError:  # an empty -trace-dir: the run's own check says so
                pass
    for d in trace_dirs:
        files += trace_files(d)
    return files


def refuse_outputs_over_inputs(outputs: Iterable[tuple[str, str | os.PathLike | None]],
                               settings: argparse.Namespace | Mapping[str, Any],
                               trace_dirs: Iterable[str | os.PathLike] | None = None) -> None:
    """Raise ConfigError, before any work, when an output ``(flag, path)`` names a file of
    :func:`input_files` (by path, through a symlink, or by a hard link of it)."""
    refuse_overwriting_inputs(outputs, input_files(settings, trace_dirs))


__all__ = ["INPUT_FILE_FLAGS", "TRACE_FILES", "input_files", "refuse_outputs_over_inputs", "trace_files"]
