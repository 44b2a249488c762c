"""The gradient dtype of a Megatron-LM command line, as Megatron-LM derives it.

Megatron-LM accumulates gradients in the DDP buffer (``main_grad``) and reduces them over data
parallelism in fp32 only when ``accumulate_allreduce_grads_in_fp32`` is on; else in the
parameters' dtype (Megatron-Core's ``grad_dtype = torch.float if grad_reduce_in_fp32 else
param.dtype``). The switch ``--accumulate-allreduce-grads-in-fp32`` is off by default, and
``validate_args`` (``megatron/training/arguments.py``) turns it on under ``--bf16`` for fp32 main
gradients, off under ``--grad-reduce-in-bf16``. So:

* ``--bf16``: fp32, triosim's default there; with ``--grad-reduce-in-bf16`` or
  ``--main-grads-dtype bf16``, bf16 (:func:`bf16_main_grads`);
* ``--fp16``: fp16, triosim's default under ``--dtype fp16``
  (:func:`~triosim.trace.precision.default_grad_reduce_dtype`); with
  ``--accumulate-allreduce-grads-in-fp32``, fp32 (:func:`finish_fp32_grads`).
"""

from __future__ import annotations

from ..errors import ConfigError
from .megatron_card import _flag_value

FP32_GRADS = "--accumulate-allreduce-grads-in-fp32"
# What the switch stands for until the line's training dtype is known (finish_fp32_grads).
FP32_GRADS_MARKER = "--megatron-fp32-grads"


def bf16_main_grads(names: list[str], tokens: list[str], out: list[str], where: str) -> None:
    """A pasted ``--bf16`` line with ``--main-grads-dtype bf16`` reduces its gradients in bf16:
    Megatron-LM turns ``accumulate_allreduce_grads_in_fp32`` on under bf16 only for fp32 main
    gradients, and refuses it typed beside bf16 ones (``arguments.py``)."""
    if "--bf16" not in names or _flag_value(tokens, "--main-grads-dtype") != "bf16":
        return
    if FP32_GRADS in names:
        raise ConfigError(f"{where}--main-grads-dtype bf16 with {FP32_GRADS} (Megatron-LM: --main-grads-dtype can "
                          "only be fp32 when gradients are accumulated and reduced in fp32)")
    if _flag_value(out, "--grad-reduce-dtype") is None:
        out.extend(["--grad-reduce-dtype", "bf16"])


def finish_fp32_grads(out: list[str], no_effect: list[str]) -> None:
    """``--accumulate-allreduce-grads-in-fp32`` once the training dtype is known: under fp16 the
    gradients are accumulated and reduced in fp32 (``--grad-reduce-dtype fp32``; without the
    switch, in fp16). Under bf16, fp32 or FP8 training Megatron-LM reduces in fp32 already (it
    turns the switch on itself under ``--bf16``), so the switch is noted as changing nothing."""
    if FP32_GRADS_MARKER not in out:
        return
    while FP32_GRADS_MARKER in out:
        out.remove(FP32_GRADS_MARKER)
    if _flag_value(out, "--dtype") != "fp16":
        if FP32_GRADS not in no_effect:
            no_effect.append(FP32_GRADS)
        return
    given = _flag_value(out, "--grad-reduce-dtype")
    if given not in (None, "fp32", "auto"):
        raise ConfigError(f"{FP32_GRADS} with --grad-reduce-dtype {given} (or --grad-reduce-in-bf16) under --fp16: "
                          "the gradients are reduced in fp32 with the switch; give one of the two")
    out.extend(["--grad-reduce-dtype", "fp32"])


__all__ = ["FP32_GRADS", "FP32_GRADS_MARKER", "bf16_main_grads", "finish_fp32_grads"]
