"""The defaults a run fills in for what the user left out, as Megatron-LM fills them in.

A user who types Megatron's question (``--model llama2-70b --gpu h100-sxm --tp 8 --dp 8
--global-batch 512``) expects Megatron's answer, not a toy's:

* ``-micro-batch-size``: 1 when ``--global-batch`` is given without it (Megatron's
  ``--micro-batch-size`` is required and recipes use 1 or 2; a whole-replica micro-batch holds
  every sample's activations at once);
* ``--schedule``: 1F1B whenever a replica runs several micro-batches (Megatron's only
  non-interleaved schedule; at ``--pp 1`` it is gradient accumulation, one micro-batch's
  activations alive at a time). GPipe only when asked for, or under ``--reference-compat``
  (the original's schedule);
* the platform: ``--gpu NAME`` with no topology flag runs on that GPU's standard node fabric
  and scale-out (the device file's ``node_fabric``: DGX H100 SuperPOD for H100/H200, DGX A100
  for A100, DGX B200 for B200), not a 65 GB/s ring; a ring only when ``--topology`` says so;
* ``--dp``: ``-GPUnumber`` over tp × pp × cp, as Megatron derives the data-parallel size from
  the world size, when ``--dp`` is not given;
* ``--grad-reduce-dtype``: fp16 under ``--dtype fp16`` (Megatron-LM's ``--fp16`` accumulates and
  reduces gradients in fp16 unless ``--accumulate-allreduce-grads-in-fp32`` is typed); other
  dtypes reduce in fp32, as they always did, and record nothing.

Each default is written onto the flags (every later step reads the value that runs) and
recorded with its reason in ``args.applied_defaults``; the summary, the result's ``defaults``
list and the ``config`` block's ``defaults_applied`` show them. The ``config`` block keeps the
flags as given, so a rerun from it derives the same defaults and gives the same bytes.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from ..errors import ConfigError
from ..trace.precision import default_grad_reduce_dtype
from .flags import FlagTable
from .typed_flags import typed

APPLIED = "applied_defaults"  # namespace attribute: flag -> AppliedDefault

# Platform flags: any of them away from its default means the user chose the network.
_PLATFORM_FLAGS = ("topology", "topology_file", "ptp_bandwidth", "interconnects", "num_rows", "num_cols",
                   "gpus_per_node", "node_bandwidth", "link_latency_us")


@dataclass(frozen=True)
class AppliedDefault:
    """One value the run chose for a flag the user did not give, and why."""

    flag: str  # as documented, e.g. "--schedule"
    value: str
    why: str
    dest: str = ""  # the flag's attribute
    given: object = None  # its value before the default (what a rerun's --config must hold)

    def to_dict(self) -> dict[str, str]:
        return {"flag": self.flag, "value": self.value, "why": self.why}

    def text(self) -> str:
        return f"{self.flag} {self.value} ({self.why})"


def applied_defaults(args: argparse.Namespace) -> tuple[AppliedDefault, ...]:
    """The defaults this run filled in, in the order they were applied."""
    return tuple(getattr(args, APPLIED, {}).values())


def _record(args: argparse.Namespace, applied: AppliedDefault) -> None:
    record = dict(getattr(args, APPLIED, {}))
    record[applied.flag] = applied
    setattr(args, APPLIED, record)


def apply_run_defaults(args: argparse.Namespace) -> None:
    """Fill in the data-parallel size, the micro-batch and the node fabric (idempotent: a flag
    already holding a value is left alone, so calling it again changes nothing)."""
    derive_data_parallel(args)
    default_micro_batch(args)
    default_node_fabric(args)
    default_recompute(args)
    default_grad_reduce(args)
    default_layout_schedule(args)


def default_grad_reduce(args: argparse.Namespace) -> None:
    """``--dtype fp16`` without ``--grad-reduce-dtype``: gradients in fp16, as Megatron-LM
    (:func:`~triosim.trace.precision.default_grad_reduce_dtype`)."""
    if getattr(args, "dtype", None) != "fp16" or getattr(args, "grad_reduce_dtype", "auto") not in (None, "auto"):
        return
    given = getattr(args, "grad_reduce_dtype", "auto")
    args.grad_reduce_dtype = default_grad_reduce_dtype("fp16")
    _record(args, AppliedDefault("--grad-reduce-dtype", args.grad_reduce_dtype,
                                 "--dtype fp16, as Megatron-LM's --fp16 without --accumulate-allreduce-grads-in-fp32",
                                 "grad_reduce_dtype", given))


def default_layout_schedule(args: argparse.Namespace) -> None:
    """``--pipeline-model-parallel-layout`` of pp × V stages, V > 1, without a schedule: the
    interleaved schedule over V virtual stages, as Megatron derives it (the command line's
    translation does this too; a sweep's points and a --config file come here)."""
    from ..graph.pipeline.layer_layout import parse_layout

    layout, pp = getattr(args, "pipeline_model_parallel_layout", None), getattr(args, "pp", None)
    if layout is None or pp is None or pp < 1 or getattr(args, "schedule", "auto") not in ("auto", "interleaved"):
        return
    if getattr(args, "virtual_stages", 1) not in (1, None):
        return
    try:
        stages = len(parse_layout(layout))
    except ConfigError:
        return  # the layout's own check names it
    if stages % pp or stages // pp < 2:
        return
    why = f"--pipeline-model-parallel-layout's {stages} stages over --pp {pp}"
    if args.schedule != "interleaved":
        _record(args, AppliedDefault("--schedule", "interleaved", why, "schedule", args.schedule))
        args.schedule = "interleaved"
    _record(args, AppliedDefault("--virtual-stages", str(stages // pp), why, "virtual_stages",
                                 getattr(args, "virtual_stages", 1)))
    args.virtual_stages = stages // pp


def default_recompute(args: argparse.Namespace) -> None:
    """Recomputation's detail flags without ``--recompute``: the granularity they belong to
    (``--recompute-method``/``--recompute-num-layers`` full, ``--recompute-modules`` selective);
    ``--recompute-num-layers N`` without a method: block, the first N layers of each model chunk
    (the setting that recomputes only some layers)."""
    method, layers = getattr(args, "recompute_method", None), getattr(args, "recompute_num_layers", None)
    modules = getattr(args, "recompute_modules", None)
    if getattr(args, "recompute", "none") == "none" and typed(args, "recompute"):
        # a typed --recompute none says no recomputation: the details contradict it (left
        # untyped, they imply their granularity below)
        for flag, value in (("--recompute-method", method), ("--recompute-num-layers", layers),
                            ("--recompute-modules", modules)):
            if value is not None:
                raise ConfigError(f"{flag} with --recompute none: leave out --recompute none (the detail implies "
                                  "its granularity) or the detail")
    if getattr(args, "recompute", "none") == "none":
        if method is not None or layers is not None:
            args.recompute = "full"
            _record(args, AppliedDefault("--recompute", "full", "--recompute-method/--recompute-num-layers without it",
                                         "recompute", "none"))
        elif modules is not None:
            args.recompute = "selective"
            _record(args, AppliedDefault("--recompute", "selective", "--recompute-modules without it", "recompute",
                                         "none"))
    if getattr(args, "recompute", "none") == "full" and method is None and layers is not None:
        args.recompute_method = "block"
        _record(args, AppliedDefault("--recompute-method", "block", "--recompute-num-layers without it: the first "
                                     f"{layers} layer{'s' if layers != 1 else ''} of each model chunk",
                                     "recompute_method", None))


def derive_data_parallel(args: argparse.Namespace) -> None:
    """``-GPUnumber N --tp T --pp P --cp C`` without ``--dp``: dp = N / (T·P·C), as Megatron
    derives it (the context-parallel ranks share each sample, so they are not data parallelism's)."""
    gpus, dp = getattr(args, "gpus", None), getattr(args, "dp", None)
    tp, pp, cp = getattr(args, "tp", None), getattr(args, "pp", None), getattr(args, "cp", None)
    if gpus is None or dp is not None or (tp is None and pp is None and cp is None):
        return
    model_parallel = (tp or 1) * (pp or 1) * (cp or 1)
    if model_parallel < 1 or gpus < 1:
        return  # the degree checks name the bad value
    with_cp = f" × --cp {cp}" if cp is not None else ""
    if gpus % model_parallel:
        raise ConfigError(f"-GPUnumber {gpus} is not a multiple of --tp {tp or 1} × --pp {pp or 1}{with_cp} = "
                          f"{model_parallel}: the data-parallel size is the world size over the model-parallel size")
    args.dp = gpus // model_parallel
    _record(args, AppliedDefault("--dp", str(args.dp), f"-GPUnumber {gpus} / (tp {tp or 1} × pp {pp or 1}"
                                 f"{f' × cp {cp}' if cp is not None else ''})", "dp", None))


def default_micro_batch(args: argparse.Namespace) -> None:
    """``--global-batch`` without ``-micro-batch-size``: micro-batches of one sample."""
    if getattr(args, "global_batch", None) is None:
        return
    if getattr(args, "micro_batch_size", None) not in (None, -1):
        return
    if getattr(args, "batch_size_sim", None) not in (None, -1):
        return  # the batch-size check names the contradiction
    given = args.micro_batch_size if hasattr(args, "micro_batch_size") else -1
    args.micro_batch_size = 1
    _record(args, AppliedDefault("-micro-batch-size", "1", "--global-batch without it", "micro_batch_size", given))


def _platform_chosen(args: argparse.Namespace) -> bool:
    if typed(args, "topology"):
        return True
    defaults = FlagTable.from_cli().defaults()
    return any(getattr(args, dest, defaults.get(dest)) != defaults.get(dest) for dest in _PLATFORM_FLAGS)


def _gpu_count(args: argparse.Namespace) -> int:
    degrees = [getattr(args, k, None) for k in ("dp", "tp", "pp", "cp")]
    if any(d is not None for d in degrees):
        return math.prod(d or 1 for d in degrees)
    if getattr(args, "case", 0) == 0:
        return 1
    return getattr(args, "gpus", None) or 8


def default_node_fabric(args: argparse.Namespace) -> None:
    """``--gpu NAME`` on several GPUs with no topology flag: the GPU's standard node fabric."""
    if getattr(args, "gpu", None) is None or getattr(args, "reference_compat", False):
        return
    if _platform_chosen(args) or _gpu_count(args) <= 1:
        return
    from ..compute.op_time_source import lookup_gpu

    device = lookup_gpu(args.gpu, "--gpu")
    if device.node_fabric is None:
        return  # no standard system: the ring notice says what runs
    args.topology_file = device.node_fabric
    _record(args, AppliedDefault("--topology-file", device.node_fabric, f"{device.display_name}'s node fabric",
                                 "topology_file", None))


def resolve_schedule(args: argparse.Namespace, micro_batches: int) -> str:
    """``--schedule auto``: 1F1B over several micro-batches, GPipe over one (the two are the same
    schedule then) or under ``--reference-compat`` (the original runs GPipe)."""
    schedule = getattr(args, "schedule", "auto")
    if schedule != "auto":
        return schedule
    if micro_batches <= 1 or getattr(args, "reference_compat", False):
        return "gpipe"  # left "auto" on the flags: a rerun resolves it the same way
    args.schedule = "1f1b"
    _record(args, AppliedDefault("--schedule", "1f1b", f"{micro_batches} micro-batches", "schedule", "auto"))
    return "1f1b"


__all__ = ["APPLIED", "AppliedDefault", "apply_run_defaults", "applied_defaults", "default_grad_reduce",
           "default_layout_schedule", "default_micro_batch", "default_node_fabric", "default_recompute",
           "derive_data_parallel", "resolve_schedule"]
