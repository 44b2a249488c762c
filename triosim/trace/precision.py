"""Training precision: the facts of mixed-precision training that size a trace's buffers.

A trace records each tensor in the dtype it was traced in (fp32 for the shipped traces). A run
may train in another dtype (``--dtype bf16|fp16|fp32``); then every buffer is resized by its role
(:mod:`triosim.graph.data.precision`), following Megatron-LM's mixed precision
(``Float16OptimizerWithFloat16Params``, Megatron's ``--bf16``/``--fp16``):

- weights and activations in the training dtype (2 bytes for bf16/fp16);
- gradients accumulated and reduced over data parallelism in the gradient-reduce dtype
  (``--grad-reduce-dtype``; by default Megatron-LM's: fp32 under bf16, fp32 and FP8 training, its
  ``main_grad`` buffer of 4 bytes, and fp16 under fp16, 2 bytes: :func:`default_grad_reduce_dtype`);
- the optimizer keeps an fp32 master copy of every weight (4 bytes) beside Adam's two fp32
  moments (4 + 4 bytes) when the training dtype is 16-bit, and an fp32 copy of a 16-bit
  reduced gradient (4 bytes); an fp32 run has neither.

So a parameter costs 2 + 4 + 4 + 4 + 4 = 18 bytes under bf16 with fp32 gradients, 2 + 2 + 16 = 20
with 16-bit gradients, 16 under fp32, and with the optimizer state sharded over N data-parallel
ranks (ZeRO-1, Megatron's distributed optimizer) 6 + 12/N, 4 + 16/N and 8 + 8/N
(:func:`bytes_per_parameter`). Of the 16/N of 16-bit gradients, the fp32 gradient copy's 4/N
exists only from the optimizer step to the next iteration's start: the forward and backward
passes hold 4 + 12/N.

Megatron-Core's precision-aware optimizer (``--use-precision-aware-optimizer``, Transformer
Engine's ``FusedAdam``) keeps the optimizer state in other dtypes (:class:`OptimizerDtypes`):
each Adam moment in ``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` (fp32, bf16, fp16 or fp8: 4, 2,
2 or 1 bytes), the master weight in ``--main-params-dtype`` (fp32, or fp16: 2 bytes), and under
bf16 an fp32 master weight as the 16 bits the bf16 weight lacks (Megatron-Core stores only
these remainders with Transformer Engine 2.1 and later: 2 bytes); ``--main-grads-dtype bf16``
steps with the bf16 gradient itself, with no fp32 copy. With bf16 moments a bf16 parameter with
16-bit gradients then costs 2 + 2 + 2 + 2 + 2 = 10 bytes instead of 20.

Source: Megatron Core developer guide, "Distributed Optimizer"
(https://docs.nvidia.com/megatron-core/developer-guide/latest/distrib_optimizer.html): bytes per
parameter 18 / 6 + 12/d (bf16 parameters, fp32 gradients), 20 / 4 + 16/d (16-bit parameters and
gradients), 16 / 8 + 8/d (fp32), without / with the distributed optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .fp8 import Fp8Training
from .model import Tensor

if TYPE_CHECKING:
    from .dataflow import Trace

# Bytes per element of each dtype a run may train or reduce gradients in.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
TRAINING_DTYPES = ("bf16", "fp16", "fp32")
GRAD_REDUCE_DTYPES = ("fp32", "bf16", "fp16")
DEFAULT_GRAD_REDUCE_DTYPE = "fp32"  # Megatron's main_grad (accumulate_allreduce_grads_in_fp32)
AUTO_GRAD_REDUCE_DTYPE = "auto"  # --grad-reduce-dtype left out: default_grad_reduce_dtype
MASTER_WEIGHT_BYTES = 4  # the fp32 copy a 16-bit run's optimizer updates
OPTIMIZER_STATE_BYTES = 4  # each Adam moment, fp32 in every precision
ADAM_MOMENTS = 2
# Tensors that hold indices, masks or labels keep their size whatever the training dtype.
NOT_FLOAT_CATEGORIES = frozenset({"indices", "target", "mask", "total_weight"})


# Bytes of an Adam moment, a master weight or a main gradient in the precision-aware optimizer's dtypes
STATE_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
EXP_AVG_DTYPES = ("fp32", "fp16", "bf16", "fp8")  # Megatron-LM's choices for --exp-avg(-sq)-dtype
MAIN_PARAMS_DTYPES = ("fp32", "fp16")
MAIN_GRADS_DTYPES = ("fp32", "bf16")


def default_grad_reduce_dtype(dtype: str) -> str:
    """The dtype Megatron-LM accumulates and reduces the gradients of a ``dtype`` run in when
    ``--accumulate-allreduce-grads-in-fp32`` is not typed: the switch is off by default, and
    Megatron-LM turns it on under ``--bf16`` only (``validate_args``: "bfloat16 requires gradient
    accumulation and all-reduce to be done in fp32"). Off, the DDP gradient buffer and its
    all-reduce or reduce-scatter are in the parameters' dtype (``grad_dtype = torch.float if
    grad_reduce_in_fp32 else param.dtype``): fp16 under ``--fp16``, fp32 for an fp32 run."""
    return "fp16" if dtype == "fp16" else DEFAULT_GRAD_REDUCE_DTYPE


@dataclass(frozen=True)
class OptimizerDtypes:
    """What Megatron-Core's optimizer keeps its state in (module docstring): the defaults, or
    with ``precision_aware`` (``--use-precision-aware-optimizer``) the dtypes of its flags."""

    precision_aware: bool = False
    main_grads: str = "fp32"
    main_params: str = "fp32"
    exp_avg: str = "fp32"
    exp_avg_sq: str = "fp32"

    @property
    def moment_bytes(self) -> int:
        """Bytes of both Adam moments of one parameter."""
        return STATE_DTYPE_BYTES[self.exp_avg] + STATE_DTYPE_BYTES[self.exp_avg_sq]


@dataclass(frozen=True)
class TrainingPrecision:
    """The dtype a run trains in and the dtype its gradients are reduced (and accumulated) in;
    ``fp8``: the linear layers' GEMMs in FP8 on top (``--dtype fp8``, :mod:`triosim.trace.fp8`);
    ``optimizer``: the dtypes the optimizer keeps its state in."""

    dtype: str
    grad_reduce_dtype: str = DEFAULT_GRAD_REDUCE_DTYPE
    fp8: Fp8Training | None = None
    optimizer: OptimizerDtypes = OptimizerDtypes()

    @property
    def mixed(self) -> bool:
        """A 16-bit training dtype: the optimizer keeps an fp32 master copy of the weights."""
        return DTYPE_BYTES[self.dtype] < MASTER_WEIGHT_BYTES

    @property
    def weight_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def gradient_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_reduce_dtype]

    @property
    def master_bytes(self) -> int:
        """Optimizer bytes per parameter beside the moments: the fp32 master weight of a 16-bit
        run, and the fp32 copy of a 16-bit reduced gradient the optimizer steps with."""
        return self.master_weight_bytes + self.gradient_copy_bytes

    @property
    def master_weight_bytes(self) -> int:
        """The master weight of a 16-bit run, held for the whole iteration: fp32, or under the
        precision-aware optimizer ``--main-params-dtype fp16``'s 2 bytes, or with bf16 weights
        the 16-bit remainder of the fp32 master (Megatron-Core's ``store_param_remainders``)."""
        if not self.mixed:
            return 0
        opt = self.optimizer
        if opt.precision_aware and (opt.main_params != "fp32" or self.dtype == "bf16"):
            return 2
        return MASTER_WEIGHT_BYTES

    @property
    def moment_bytes(self) -> int:
        """Bytes of Adam's two moments per parameter (fp32 each unless the optimizer says)."""
        return self.optimizer.moment_bytes

    @property
    def gradient_copy_bytes(self) -> int:
        """The fp32 copy of a 16-bit reduced gradient: made by the optimizer step and freed at the
        next iteration's start, so held only while the optimizer runs (Megatron-Core's
        ``_copy_model_grads_to_main_grads`` sets ``main_param.grad = model_grad.float()`` before
        the step; ``zero_grad(set_to_none=True)``, first thing in the next ``train_step``, drops it).
        None under ``--main-grads-dtype bf16``: the optimizer steps with the 16-bit gradient."""
        if self.optimizer.main_grads != "fp32":
            return 0
        return MASTER_WEIGHT_BYTES if self.mixed and self.gradient_bytes < MASTER_WEIGHT_BYTES else 0


@dataclass(frozen=True)
class OptimizerStepBytes:
    """HBM bytes one optimizer step reads and writes per parameter (its kernels are memory-bound)."""

    read: int
    written: int


def optimizer_step_bytes(precision: TrainingPrecision) -> OptimizerStepBytes:
    """Bytes per parameter of Megatron-LM's optimizer step with Adam, kernel by kernel.

    A 16-bit run (``Float16OptimizerWithFloat16Params.step``):

    - a 16-bit gradient is first copied to its fp32 main gradient (read g, write 4);
    - fp16 only (bf16 runs have no loss scaler): unscale and check for inf/NaN in place
      (``_amp_foreach_non_finite_check_and_unscale_``: read 4, write 4);
    - the gradient norm for clipping (``multi_tensor_l2norm``: read 4; the default
      ``--clip-grad 1.0`` rescales only when the norm exceeds it, not counted);
    - Adam on the fp32 master weights (apex ``multi_tensor_adam``: read weight, gradient and
      both moments, 16; write weight and moments, 12);
    - the master weights copied to the 16-bit model weights (``multi_tensor_scale``: read 4,
      write w);
    - the gradient buffer zeroed for the next iteration (write g).

    An fp32 run (``FP32Optimizer``): gradient norm, Adam, zeroing (read 20, write 16).
    So 50 bytes for fp16 with fp32 gradients, 42 for bf16, 36 for fp32.

    The precision-aware optimizer (Transformer Engine's ``FusedAdam``) reads and writes the
    moments and the master weight in their own dtypes (:class:`OptimizerDtypes`) and writes the
    16-bit model weight in the same kernel (no copy kernel); with bf16 weights it rebuilds the
    fp32 master from the weight and its 16-bit remainder (read and write both). Under
    ``--main-grads-dtype bf16`` it reads the 16-bit gradient (no fp32 copy, no 4-byte norm read).
    """
    g, w = precision.gradient_bytes, precision.weight_bytes
    state = precision.moment_bytes
    norm = 4
    if not precision.mixed:
        adam_read, adam_written = MASTER_WEIGHT_BYTES + 4 + state, MASTER_WEIGHT_BYTES + state
        return OptimizerStepBytes(norm + adam_read, adam_written + g)
    opt = precision.optimizer
    copy = precision.gradient_copy_bytes  # the 16-bit gradient's fp32 copy, when made
    main_grad = g if (copy == 0 and g < MASTER_WEIGHT_BYTES) else MASTER_WEIGHT_BYTES
    norm = main_grad
    if opt.precision_aware:
        master = precision.master_weight_bytes
        remainder = w if precision.dtype == "bf16" and opt.main_params == "fp32" else 0  # the bf16 half read too
        read, written = norm + master + remainder + main_grad + state, master + state + w + g
    else:
        adam_read, adam_written = MASTER_WEIGHT_BYTES + 4 + state, MASTER_WEIGHT_BYTES + state
        read, written = norm + adam_read + MASTER_WEIGHT_BYTES, adam_written + w + g
    if copy:  # the 16-bit gradient's fp32 copy
        read, written = read + g, written + copy
    if precision.dtype == "fp16":  # loss scaling: unscale in place
        read, written = read + main_grad, written + main_grad
    return OptimizerStepBytes(read, written)


def bytes_per_parameter(precision: TrainingPrecision, zero: int = 0, dp: int = 1,
                        moments: int = ADAM_MOMENTS) -> float:
    """Weights + gradients + optimizer state per parameter on one GPU (the closed form the
    simulated memory must meet; Megatron's table): ZeRO-1 shards the optimizer state (master copy
    included) over ``dp`` ranks, ZeRO-2 the gradients too, ZeRO-3 the weights too. The fp32
    copy of a 16-bit gradient (:attr:`TrainingPrecision.gradient_copy_bytes`) is counted here
    though the forward and backward passes do not hold it."""
    n = dp if dp > 1 else 1
    w, g = float(precision.weight_bytes), float(precision.gradient_bytes)
    state = precision.moment_bytes if moments == ADAM_MOMENTS else moments * OPTIMIZER_STATE_BYTES
    o = float(precision.master_bytes + state)
    return w / (n if zero >= 3 else 1) + g / (n if zero >= 2 else 1) + o / (n if zero >= 1 else 1)


def size_key(trace: Trace, tensor_id: str) -> int:
    """What matches a parameter with its gradient or optimizer state by size: the bytes of the
    trace as traced (all share its dtype), the element count once the buffers are resized by
    role (a bf16 weight, its fp32 gradient and its fp32 moments differ in bytes)."""
    t = trace.tensors[tensor_id]
    if trace.precision is None and not _narrow_parameters(trace):
        return t.bytes
    return elements(t)


def _narrow_parameters(trace: Trace) -> bool:
    """16-bit parameters as traced (a model card's trace): their fp32 moments differ in bytes."""
    for p in trace.parameters:
        return trace.tensors[p].each_byte < 4
    return False


def elements(t: Tensor) -> int:
    """A tensor's element count (from its bytes where tensor.csv gave none)."""
    return t.numel if t.numel > 0 else t.bytes // max(1, t.each_byte)


def gathered_parameter_bytes(trace: Trace, parameter: str) -> int:
    """Bytes of ``parameter`` as ZeRO all-gathers it: its bytes as traced or sized. Under FP8
    training a linear's weight buffer also holds its FP8 copy, and its element size is the dtype
    it is gathered in (:func:`triosim.trace.fp8.gathered_bytes_per_element`): element count ×
    element size."""
    t = trace.tensors[parameter]
    if trace.precision is None or trace.precision.fp8 is None:
        return t.bytes
    return elements(t) * t.each_byte


def reduced_gradient_bytes(trace: Trace, parameter: str) -> int:
    """Bytes of ``parameter``'s gradient as data parallelism reduces it: the parameter's bytes as
    traced, its element count × the gradient-reduce dtype's bytes under a training precision."""
    t = trace.tensors[parameter]
    if trace.precision is None:
        return t.bytes
    return elements(t) * trace.precision.gradient_bytes


__all__ = ["ADAM_MOMENTS", "AUTO_GRAD_REDUCE_DTYPE", "DEFAULT_GRAD_REDUCE_DTYPE", "DTYPE_BYTES", "EXP_AVG_DTYPES", "GRAD_REDUCE_DTYPES",
           "MAIN_GRADS_DTYPES", "MAIN_PARAMS_DTYPES", "MASTER_WEIGHT_BYTES", "NOT_FLOAT_CATEGORIES",
           "OPTIMIZER_STATE_BYTES", "OptimizerDtypes", "OptimizerStepBytes", "STATE_DTYPE_BYTES", "TRAINING_DTYPES", "TrainingPrecision",
           "bytes_per_parameter", "default_grad_reduce_dtype", "elements", "gathered_parameter_bytes", "optimizer_step_bytes", "reduced_gradient_bytes",
           "size_key"]
