"""Tracing your own model: one training step of any ``nn.Module`` into a TrioSim trace directory.

``triosim trace collect`` builds its model by name; :func:`trace_module` takes the user's module,
a batch, a loss and an optimizer instead, and runs the same machinery: warm-up iterations
(``zero_grad(set_to_none=True)``, forward, loss, backward, ``optimizer.step()``), one more under
torch.profiler and the execution-trace observer, then the conversion into ``trace.csv``,
``tensor.csv`` and ``meta.json``, which ``triosim run -trace-dir DIR`` simulates.  The arguments
are checked before any training, each mistake one :class:`TracerError` line.  torch is imported
inside the function only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .collect import CollectResult, collect_into, command_line, record_iterations
from .convert import DEFAULT_TARGETS
from .errors import TracerError


def trace_module(model: Any, example_inputs: Any, loss_fn: Callable[..., Any], optimizer: Any,
                 out_dir: str | os.PathLike[str], *, target: Any = None,
                 batch_size: int | None = None, iterations: int = 3, name: str | None = None,
                 tp_ops: tuple[str, ...] = DEFAULT_TARGETS, keep_raw: bool = False,
                 quiet: bool = True) -> CollectResult:
    """Train ``model`` for ``iterations`` steps, record the last one and write it to ``out_dir``.

    One step is ``optimizer.zero_grad(set_to_none=True)``, ``out = model(*example_inputs)`` (a
    tensor is one argument, a dict gives keyword arguments), ``loss = loss_fn(out, target)`` (or
    ``loss_fn(out)`` without ``target``), ``loss.backward()``, ``optimizer.step()``.  The model is
    put in train mode and trained for real: its weights and the optimizer state change.  It runs
    where its parameters are (move model and inputs to the GPU first for GPU kernel times).

    ``batch_size`` (written to meta.json, where ``triosim run`` reads it) defaults to the first
    dimension of the first input tensor; ``name`` (default: the module's class name) names the
    model in meta.json; ``tp_ops`` are the ops split under tensor parallelism (``tpflag``);
    ``keep_raw`` keeps the profiler's JSON pair in ``out_dir/raw``.  Returns the recorded step and
    the converted tables; ``result.trace_dir`` is ``out_dir``.
    """
    import torch

    out = Path(out_dir)
    args, kwargs = _check(model, example_inputs, loss_fn, optimizer, out, iterations)
    label = _label(name if name is not None else type(model).__name__)
    batch = batch_size if batch_size is not None else _batch_of(example_inputs)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise TracerError(f"trace_module: batch_size must be a positive integer, got {batch!r}")
    device = next(model.parameters()).device
    model.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        output = model(*args, **kwargs)
        loss = loss_fn(output) if target is None else loss_fn(output, target)
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
            what = (f"a tensor of shape {tuple(loss.shape)}{'' if loss.requires_grad else ' without grad'}"
                    if isinstance(loss, torch.Tensor) else type(loss).__name__)
            raise TracerError(f"trace_module: loss_fn must return a scalar tensor that depends on the "
                              f"model's parameters, got {what}")
        loss.backward()
        optimizer.step()

    def record(raw_dir: Path, progress: Any) -> Any:
        recorded = record_iterations(step, device, label, iterations, raw_dir, progress)
        recorded.meta = {
            "model": label,
            "model_description": f"{type(model).__module__}.{type(model).__qualname__} "
                                 f"({sum(p.numel() for p in model.parameters()):,} parameters)",
            "batch_size": batch,
            "optimizer": type(optimizer).__name__.lower(),
            "foreach": optimizer.defaults.get("foreach"),
            "data": "given",
            "command": command_line(),
            "traced_by": "triosim.tracer.trace_module",
            **recorded.meta,
        }
        return recorded

    return collect_into(out, record, label=label, raw_dir=None, keep_raw=keep_raw,
                        targets=tuple(tp_ops), quiet=quiet)


def _check(model: Any, inputs: Any, loss_fn: Any, optimizer: Any, out: Path,
           iterations: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments' mistakes, before any training; the model's positional and keyword inputs."""
    from .collect import check_tracer_dependencies

    missing = check_tracer_dependencies()
    if missing:
        raise TracerError(missing)
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TracerError(f"trace_module: model must be a torch.nn.Module, got {type(model).__name__}")
    params = list(model.parameters())
    if not params:
        raise TracerError(f"trace_module: {type(model).__name__} has no parameters to train")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TracerError(f"trace_module: optimizer must be a torch.optim.Optimizer (e.g. "
                          f"torch.optim.Adam(model.parameters())), got {type(optimizer).__name__}")
    mine = {id(p) for p in params}
    if not any(id(p) in mine for group in optimizer.param_groups for p in group["params"]):
        raise TracerError("trace_module: the optimizer holds none of the model's parameters "
                          "(make it from model.parameters())")
    if not callable(loss_fn):
        raise TracerError(f"trace_module: loss_fn must be callable, got {type(loss_fn).__name__}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 2:
        raise TracerError(f"trace_module: iterations must be at least 2 (warm-up + recorded), "
                          f"got {iterations!r}")
    if out.exists() and not out.is_dir():
        raise TracerError(f"trace_module: out_dir {out} exists and is not a directory")
    if isinstance(inputs, Mapping):
        args, kwargs = (), dict(inputs)
    elif isinstance(inputs, (tuple, list)):
        args, kwargs = tuple(inputs), {}
    else:
        args, kwargs = (inputs,), {}
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    if not tensors:
        raise TracerError("trace_module: example_inputs holds no tensor (give a tensor, a tuple of "
                          "the model's arguments or a dict of its keyword arguments)")
    device = params[0].device
    elsewhere = [str(t.device) for t in tensors if t.device != device]
    if elsewhere:
        raise TracerError(f"trace_module: the model is on {device} but example_inputs has a tensor "
                          f"on {elsewhere[0]}; move both to one device")
    return args, kwargs


def _batch_of(inputs: Any) -> int:
    """The first dimension of the first input tensor."""
    import torch

    values = list(inputs.values()) if isinstance(inputs, Mapping) else (
        list(inputs) if isinstance(inputs, (tuple, list)) else [inputs])
    first = next(v for v in values if isinstance(v, torch.Tensor))
    if first.dim() == 0:
        raise TracerError("trace_module: the first input tensor is a scalar, so the batch size is "
                          "unknown; give batch_size=")
    return int(first.shape[0])


def _label(name: str) -> str:
    """The model's name as it appears in file names: letters, digits, ``._-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._") or "model"
