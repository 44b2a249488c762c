"""The precision flags of a run: ``--dtype`` as the training dtype, ``--grad-reduce-dtype`` and
FP8 training's ``--fp8-recipe`` and ``--fp8-param-gather``.

``--dtype`` (defined with the GPU flags, where it also picks the roofline's math dtype) set to
``bf16``, ``fp16`` or ``fp32`` trains in that dtype: every buffer is resized by role
(:mod:`triosim.graph.data.precision`). ``fp8`` trains in bf16 with the linear layers' GEMMs in
FP8 as Transformer Engine runs them (:mod:`triosim.trace.fp8`): ``--fp8-recipe`` (default: mxfp8
on a GPU that runs it, Blackwell; else current scaling) and ``--fp8-param-gather`` (Megatron-Core's
switch, off by default: parameters kept and all-gathered in FP8; it needs the distributed
optimizer or FSDP, ``--zero 1|2|3``). ``auto`` (the default) and ``tf32`` keep the traced sizes
(tf32 names a math mode only). ``--grad-reduce-dtype`` is the dtype gradients are accumulated and
reduced over data parallelism in; left out (``auto``), Megatron-LM's: fp16 under ``--dtype fp16``
(its ``--fp16`` without ``--accumulate-allreduce-grads-in-fp32``), else fp32
(:func:`~triosim.trace.precision.default_grad_reduce_dtype`). Megatron-Core's precision-aware
optimizer (``--use-precision-aware-optimizer`` with ``--exp-avg-dtype``, ``--exp-avg-sq-dtype``,
``--main-params-dtype``, ``--main-grads-dtype``, Megatron-LM's names and choices) keeps the
optimizer state in those dtypes (:class:`~triosim.trace.precision.OptimizerDtypes`); the dtypes
other than fp32 need the switch, as Megatron-Core asserts.
"""

from __future__ import annotations

import argparse

from ..compute.op_time_source import check_dtype
from ..errors import ConfigError
from ..graph.data.precision import with_training_precision
from ..graph.strategy import parse_zero
from ..trace import Trace
from ..trace.fp8 import DELAYED_REFUSED_MODULES, FP8_RECIPES, Fp8Training
from ..trace.precision import (
    AUTO_GRAD_REDUCE_DTYPE,
    DEFAULT_GRAD_REDUCE_DTYPE,
    EXP_AVG_DTYPES,
    GRAD_REDUCE_DTYPES,
    MAIN_GRADS_DTYPES,
    MAIN_PARAMS_DTYPES,
    TRAINING_DTYPES,
    OptimizerDtypes,
    TrainingPrecision,
    default_grad_reduce_dtype,
)
from .gpu import GpuOptions

# dest -> default: a run's configuration block records the flag only when set (as the GPU flags).
PRECISION_FLAG_DEFAULTS = {"grad_reduce_dtype": AUTO_GRAD_REDUCE_DTYPE, "fp8_recipe": "auto",
                           "fp8_param_gather": False, "use_precision_aware_optimizer": False,
                           "main_grads_dtype": "fp32", "main_params_dtype": "fp32", "exp_avg_dtype": "fp32",
                           "exp_avg_sq_dtype": "fp32"}
# flag -> (dest, choices) of the precision-aware optimizer's dtypes
OPTIMIZER_DTYPE_FLAGS = {"--main-grads-dtype": ("main_grads_dtype", MAIN_GRADS_DTYPES),
                         "--main-params-dtype": ("main_params_dtype", MAIN_PARAMS_DTYPES),
                         "--exp-avg-dtype": ("exp_avg_dtype", EXP_AVG_DTYPES),
                         "--exp-avg-sq-dtype": ("exp_avg_sq_dtype", EXP_AVG_DTYPES)}
FP8_RECIPE_CHOICES = ("auto", *FP8_RECIPES)
FP8_TRAINING_DTYPE = "bf16"  # what an FP8 run trains in around its FP8 GEMMs (Megatron: --bf16 with --fp8-format)
GRAD_REDUCE_CHOICES = (AUTO_GRAD_REDUCE_DTYPE, *GRAD_REDUCE_DTYPES)


def add_precision_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("precision")
    g.add_argument("--grad-reduce-dtype", default=AUTO_GRAD_REDUCE_DTYPE, choices=GRAD_REDUCE_CHOICES,
                   help="with --dtype bf16|fp16|fp32|fp8: the dtype gradients are accumulated and reduced over "
                        "data parallelism in (auto: Megatron-LM's, fp16 under --dtype fp16, else fp32; bf16/fp16 "
                        "halve that traffic and the gradient buffer)")
    g.add_argument("--fp8-recipe", default="auto", choices=FP8_RECIPE_CHOICES,
                   help="with --dtype fp8: Transformer Engine's scaling recipe (delayed, current, blockwise, mxfp8; "
                        "auto: mxfp8 on Blackwell, else current); it sets the cast kernels' bytes, see "
                        "docs/precision.md")
    g.add_argument("--fp8-param-gather", action="store_true",
                   help="with --dtype fp8 and --zero 1|2|3: parameters kept and all-gathered in FP8 (1 byte each "
                        "instead of 2), as Megatron-Core's --fp8-param-gather")
    g.add_argument("--use-precision-aware-optimizer", action="store_true",
                   help="Megatron-Core's precision-aware optimizer (Transformer Engine's FusedAdam): the optimizer "
                        "state in the dtypes below; under bf16 the fp32 master weight is kept as its 16-bit "
                        "remainder (2 bytes)")
    what = {"--main-grads-dtype": "the gradient the optimizer steps with (bf16: no fp32 copy)",
            "--main-params-dtype": "the master weights", "--exp-avg-dtype": "Adam's first moment",
            "--exp-avg-sq-dtype": "Adam's second moment"}
    for flag, (dest, choices) in OPTIMIZER_DTYPE_FLAGS.items():
        g.add_argument(flag, dest=dest, default="fp32", choices=choices,
                       help=f"with --use-precision-aware-optimizer: the dtype of {what[flag]} (default fp32)")


def _micro_batches(args: argparse.Namespace, batch: int | None) -> int:
    """Micro-batches per iteration of a run whose per-replica batch is ``batch`` (1 when unknown)."""
    mb = getattr(args, "micro_batch_size", None)
    if batch is None or mb in (None, -1) or mb <= 0:
        return 1
    return max(1, -(-batch // mb))


def fp8_training(args: argparse.Namespace, batch: int | None = None) -> Fp8Training | None:
    """The FP8 training of the flags (None without ``--dtype fp8``), checked. ``batch``: the
    per-replica batch, which says how many micro-batches share one weight cast."""
    dtype = getattr(args, "dtype", "auto") or "auto"
    recipe = getattr(args, "fp8_recipe", "auto") or "auto"
    gather = bool(getattr(args, "fp8_param_gather", False))
    if dtype != "fp8":
        for flag, given in (("--fp8-recipe", recipe != "auto"), ("--fp8-param-gather", gather)):
            if given:
                raise ConfigError(f"{flag} needs --dtype fp8 (FP8 training), got --dtype {dtype}")
        return None
    if recipe not in FP8_RECIPE_CHOICES:
        raise ConfigError(f"--fp8-recipe must be one of {', '.join(FP8_RECIPE_CHOICES)}, got {recipe!r}")
    zero = parse_zero(getattr(args, "zero", "0"))
    if gather and zero < 1:
        raise ConfigError("--fp8-param-gather needs the distributed optimizer or FSDP (--zero 1|2|3): only they "
                          "all-gather parameters")
    device = GpuOptions.of(args).device()
    if device is None:  # GpuOptions.check words it
        return None
    check_dtype(device, "fp8")  # a GPU without an fp8 peak (a V100): that error first
    if recipe == "auto":
        recipe = device.default_fp8_recipe
    if recipe not in device.fp8_recipes:
        raise ConfigError(f"--fp8-recipe {recipe}: {device.display_name} ({device.name}) runs "
                          f"{', '.join(device.fp8_recipes)} (MXFP8 needs a Blackwell GPU, SM 10.0)")
    if recipe == "delayed":
        modules = str(getattr(args, "recompute_modules", None) or "").replace(" ", ",").split(",")  # as parallel_flags
        for module in DELAYED_REFUSED_MODULES:
            if module in modules:
                raise ConfigError(f"--recompute-modules {module} with --fp8-recipe delayed: Megatron-Core's delayed "
                                  "scaling does not recompute norms or expert activations in FP8; use another recipe")
    if gather and recipe == "mxfp8":
        raise ConfigError("--fp8-param-gather with --fp8-recipe mxfp8 is not modelled (Megatron-Core gathers MXFP8 "
                          "parameters through the gradient buffer); leave --fp8-param-gather out or use another recipe")
    share = 1.0 if zero >= 3 else 1.0 / _micro_batches(args, batch)
    return Fp8Training(recipe, gather, device.fp8_transposed_copy, share)


def training_precision(args: argparse.Namespace, batch: int | None = None) -> TrainingPrecision | None:
    """The training precision of the flags (None: sizes as traced), checked; ``batch`` as
    :func:`fp8_training`'s."""
    dtype = getattr(args, "dtype", "auto") or "auto"
    reduce = getattr(args, "grad_reduce_dtype", AUTO_GRAD_REDUCE_DTYPE) or AUTO_GRAD_REDUCE_DTYPE
    if dtype == "auto" and (getattr(args, "model", None) or getattr(args, "model_file", None)):
        dtype = "bf16"  # a model card trains in mixed precision unless told otherwise, as Megatron-LM runs
    if reduce not in GRAD_REDUCE_CHOICES:
        raise ConfigError(f"--grad-reduce-dtype must be one of {', '.join(GRAD_REDUCE_CHOICES)}, got {reduce!r}")
    fp8 = fp8_training(args, batch)
    optimizer = optimizer_dtypes(args, dtype)
    if getattr(args, "moe_a2a_overlap", False) and dtype in ("fp32", "tf32"):
        raise ConfigError(f"--moe-a2a-overlap needs a 16-bit model (--dtype bf16, fp16 or fp8), got --dtype {dtype} "
                          "(Megatron-Core runs the expert-parallel overlap only with bf16 or fp16)")
    if dtype not in (*TRAINING_DTYPES, "fp8"):
        if reduce not in (AUTO_GRAD_REDUCE_DTYPE, DEFAULT_GRAD_REDUCE_DTYPE):
            raise ConfigError(f"--grad-reduce-dtype {reduce} needs a training dtype: give --dtype "
                              f"{'|'.join((*TRAINING_DTYPES, 'fp8'))} (--dtype {dtype} keeps the traced sizes)")
        return None
    if getattr(args, "reference_compat", False):
        raise ConfigError(f"--dtype {dtype} cannot be combined with --reference-compat (the original keeps the "
                          "traced sizes)")
    if dtype == "fp8":
        if reduce == AUTO_GRAD_REDUCE_DTYPE:
            reduce = default_grad_reduce_dtype(FP8_TRAINING_DTYPE)
        return TrainingPrecision(FP8_TRAINING_DTYPE, reduce, fp8, optimizer) if fp8 is not None else None
    if reduce == AUTO_GRAD_REDUCE_DTYPE:
        reduce = default_grad_reduce_dtype(dtype)
    return TrainingPrecision(dtype, reduce, optimizer=optimizer)


def optimizer_dtypes(args: argparse.Namespace, dtype: str) -> OptimizerDtypes:
    """The optimizer-state dtypes of the flags, checked as Megatron-Core checks them: a dtype other
    than fp32 needs ``--use-precision-aware-optimizer``, which needs a 16-bit training dtype."""
    aware = bool(getattr(args, "use_precision_aware_optimizer", False))
    values = {}
    for flag, (dest, choices) in OPTIMIZER_DTYPE_FLAGS.items():
        value = getattr(args, dest, "fp32") or "fp32"
        if value not in choices:
            raise ConfigError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")
        if value != "fp32" and not aware:
            raise ConfigError(f"{flag} {value} needs --use-precision-aware-optimizer (Megatron-Core keeps the "
                              "optimizer state in fp32 without it)")
        values[dest] = value
    if aware and dtype not in ("bf16", "fp16", "fp8"):
        raise ConfigError(f"--use-precision-aware-optimizer needs a 16-bit training dtype (--dtype bf16, fp16 or "
                          f"fp8), got --dtype {dtype}")
    return OptimizerDtypes(aware, values["main_grads_dtype"], values["main_params_dtype"], values["exp_avg_dtype"],
                           values["exp_avg_sq_dtype"])


def with_flag_precision(trace: Trace, args: argparse.Namespace) -> Trace:
    """``trace`` sized for the flags' training precision (as traced without one)."""
    return with_training_precision(trace, training_precision(args, trace.batch_size))


__all__ = ["FP8_RECIPE_CHOICES", "OPTIMIZER_DTYPE_FLAGS", "PRECISION_FLAG_DEFAULTS", "add_precision_flags",
           "fp8_training", "optimizer_dtypes", "training_precision",
           "with_flag_precision"]
