"""The precision flags of a run: ``--dtype`` as the training dtype and ``--grad-reduce-dtype``.

``--dtype`` (defined with the GPU flags, where it also picks the roofline's math dtype) set to
``bf16``, ``fp16`` or ``fp32`` trains in that dtype: every buffer is resized by role
(:mod:`triosim.graph.data.precision`). ``auto`` (the default), ``tf32`` and ``fp8`` keep the
traced sizes (tf32 and fp8 name a math mode only). ``--grad-reduce-dtype`` is the dtype gradients
are accumulated and reduced over data parallelism in (fp32, as Megatron-LM's default).
"""

from __future__ import annotations

import argparse

from ..errors import ConfigError
from ..graph.data.precision import with_training_precision
from ..trace import Trace
from ..trace.precision import (
    DEFAULT_GRAD_REDUCE_DTYPE,
    GRAD_REDUCE_DTYPES,
    TRAINING_DTYPES,
    TrainingPrecision,
)

# dest -> default: a run's configuration block records the flag only when set (as the GPU flags).
PRECISION_FLAG_DEFAULTS = {"grad_reduce_dtype": DEFAULT_GRAD_REDUCE_DTYPE}


def add_precision_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("precision")
    g.add_argument("--grad-reduce-dtype", default=DEFAULT_GRAD_REDUCE_DTYPE, choices=GRAD_REDUCE_DTYPES,
                   help="with --dtype bf16|fp16|fp32: the dtype gradients are accumulated and reduced over "
                        "data parallelism in (fp32, as Megatron-LM; bf16/fp16 halve that traffic)")


def training_precision(args: argparse.Namespace) -> TrainingPrecision | None:
    """The training precision of the flags (None: sizes as traced), checked."""
    dtype = getattr(args, "dtype", "auto") or "auto"
    reduce = getattr(args, "grad_reduce_dtype", DEFAULT_GRAD_REDUCE_DTYPE) or DEFAULT_GRAD_REDUCE_DTYPE
    if dtype == "auto" and (getattr(args, "model", None) or getattr(args, "model_file", None)):
        dtype = "bf16"  # a model card trains in mixed precision unless told otherwise, as Megatron-LM runs
    if reduce not in GRAD_REDUCE_DTYPES:
        raise ConfigError(f"--grad-reduce-dtype must be one of {', '.join(GRAD_REDUCE_DTYPES)}, got {reduce!r}")
    if dtype not in TRAINING_DTYPES:
        if reduce != DEFAULT_GRAD_REDUCE_DTYPE:
            raise ConfigError(f"--grad-reduce-dtype {reduce} needs a training dtype: give --dtype "
                              f"{'|'.join(TRAINING_DTYPES)} (--dtype {dtype} keeps the traced sizes)")
        return None
    if getattr(args, "reference_compat", False):
        raise ConfigError(f"--dtype {dtype} cannot be combined with --reference-compat (the original keeps the "
                          "traced sizes)")
    return TrainingPrecision(dtype, reduce)


def with_flag_precision(trace: Trace, args: argparse.Namespace) -> Trace:
    """``trace`` sized for the flags' training precision (as traced without one)."""
    return with_training_precision(trace, training_precision(args))


__all__ = ["PRECISION_FLAG_DEFAULTS", "add_precision_flags", "training_precision", "with_flag_precision"]
