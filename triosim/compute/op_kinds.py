"""Which op is which: the operator names the tracers emit, sorted into the kinds op costs know.

Names arrive as the tracer wrote them: ``aten::conv2d``, ``autograd::engine::evaluate_function:
ConvolutionBackward0``. :func:`base_name` strips the prefixes; :func:`classify` gives the kind
(the formula :mod:`triosim.compute.op_cost` applies) and the class reported per op ("matmul",
"conv", "attention", "norm", "pooling", "embedding", "loss", "elementwise", "optimizer",
"unknown"). Only the matmul, conv and attention classes run on the matrix units.
"""

from __future__ import annotations

import re

MATRIX_CLASSES = frozenset({"matmul", "conv", "attention"})

_PREFIX = re.compile(r"^(?:autograd::engine::evaluate_function:\s*|aten::|torch::autograd::)+")

MATMUL_FWD = frozenset({"linear", "addmm", "mm", "bmm", "matmul", "baddbmm", "addbmm", "addmv", "mv", "dot",
                        "_addmm_activation", "einsum", "_grouped_mm"})
MATMUL_BWD = frozenset({"AddmmBackward0", "MmBackward0", "BmmBackward0", "LinearBackward0", "MatmulBackward0",
                        "BaddbmmBackward0", "AddbmmBackward0", "MvBackward0", "AddmvBackward0", "DotBackward0",
                        "GroupedMmBackward0"})
CONV_FWD = frozenset({"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "cudnn_convolution",
                      "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "mkldnn_convolution"})
CONV_BWD = frozenset({"ConvolutionBackward0", "CudnnConvolutionBackward0", "ConvolutionBackward1",
                      "MkldnnConvolutionBackward0", "CudnnConvolutionTransposeBackward0"})
ATTENTION_FWD = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                           "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                           "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward",
                           "_efficient_attention_forward", "_scaled_dot_product_attention_math"})
# name -> read passes over the big tensor (layer/RMS norm and softmax keep a row in registers and
# read it once; group/instance norm compute statistics, then normalise: twice). Training batch
# norm is costed apart (:data:`BATCH_NORM`).
NORM = {
    "layer_norm": 1, "native_layer_norm": 1, "rms_norm": 1, "_fused_rms_norm": 1, "group_norm": 2,
    "native_group_norm": 2, "instance_norm": 2, "batch_norm": 2, "native_batch_norm": 2,
    "_native_batch_norm_legit": 2, "cudnn_batch_norm": 2, "_batch_norm_impl_index": 2,
    "NativeLayerNormBackward0": 1, "FusedRmsNormBackward0": 1, "RmsNormBackward0": 1,
    "NativeGroupNormBackward0": 2, "NativeBatchNormBackward0": 2, "CudnnBatchNormBackward0": 2,
    "softmax": 1, "_softmax": 1, "log_softmax": 1, "_log_softmax": 1,
    "SoftmaxBackward0": 1, "LogSoftmaxBackward0": 1,
}
# Training batch norm over (N, C, spatial...) in NCHW, as cuDNN runs it for PyTorch on NVIDIA GPUs
# (kernels ``bn_fw_tr_1C11_kernel_NCHW`` and ``bn_bw_1C11_kernel_new`` in the H200 profiles of
# sample_trace/*-h200-*): ONE thread block per channel, which first reduces its channel's slice,
# then makes a second pass over it. Forward: reads x (statistics), reads x again and writes y.
# Backward: reads x and dy (the sums of dy and dy·x̂), then reads both again to write dx.
BATCH_NORM = frozenset({"batch_norm", "native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm",
                        "_batch_norm_impl_index", "CudnnBatchNormBackward0", "NativeBatchNormBackward0"})
POOLING = frozenset({"max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices",
                     "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                     "adaptive_avg_pool3d", "_adaptive_avg_pool2d", "adaptive_max_pool2d",
                     "MaxPool2DWithIndicesBackward0", "MaxPool3DWithIndicesBackward0", "AvgPool2DBackward0",
                     "AvgPool3DBackward0", "AdaptiveAvgPool2DBackward0", "AdaptiveMaxPool2DBackward0",
                     "AdaptiveAvgPool3DBackward0"})
EMBEDDING = frozenset({"embedding", "EmbeddingBackward0", "embedding_dense_backward", "embedding_bag",
                       "EmbeddingBagBackward0"})
LOSS = frozenset({"cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss2d", "mse_loss", "l1_loss",
                  "binary_cross_entropy", "binary_cross_entropy_with_logits", "NllLossBackward0",
                  "NllLoss2DBackward0", "MseLossBackward0", "L1LossBackward0", "BinaryCrossEntropyBackward0",
                  "BinaryCrossEntropyWithLogitsBackward0"})
# Elementwise ops and roughly how many FLOPs each output element costs (they are bytes-bound on
# every GPU here; the count matters only for the compute side of the roofline).
ELEMENTWISE = {
    "relu": 1, "relu_": 1, "ReluBackward0": 1, "gelu": 8, "gelu_": 8, "GeluBackward0": 12, "silu": 4, "silu_": 4,
    "SiluBackward0": 6, "SwiGLUFunction": 5, "SwiGLUFunctionBackward": 8,
    "WeightedSwiGLUFunction": 6, "WeightedSwiGLUFunctionBackward": 10, "tanh": 4, "TanhBackward0": 2, "sigmoid": 4, "SigmoidBackward0": 2, "leaky_relu": 1,
    "leaky_relu_": 1, "LeakyReluBackward0": 1, "hardtanh": 1, "hardtanh_": 1, "HardtanhBackward0": 1,
    "add": 1, "add_": 1, "AddBackward0": 1, "sub": 1, "sub_": 1, "SubBackward0": 1, "mul": 1, "mul_": 1,
    "MulBackward0": 2, "div": 1, "div_": 1, "DivBackward0": 3, "neg": 1, "exp": 4, "log": 4, "sqrt": 2, "rsqrt": 2,
    "pow": 2, "PowBackward0": 3, "where": 1, "masked_fill": 1, "masked_fill_": 1, "clamp": 1, "clamp_": 1,
    "dropout": 2, "native_dropout": 2, "dropout_": 2, "NativeDropoutBackward0": 1, "feature_dropout": 2,
    "repeat_interleave": 0, "ones_like": 0, "zeros_like": 0, "empty_like": 0, "fill_": 0, "zero_": 0, "copy_": 0, "clone": 0,
    "contiguous": 0, "to": 0, "_to_copy": 0, "ToCopyBackward0": 0, "arange": 0, "cat": 0, "stack": 0,
    "CatBackward0": 0, "ViewBackward0": 1, "UnsafeViewBackward0": 1, "TransposeBackward0": 0, "PermuteBackward0": 0,
    "ExpandBackward0": 1, "CloneBackward0": 0, "mean": 1, "sum": 1, "MeanBackward0": 1, "MeanBackward1": 1,
    "SumBackward0": 1, "SumBackward1": 1, "flatten": 0, "reshape": 0, "view": 0,
    # mixture of experts: the router's top-k, the token permutation into expert order and back
    # (un-permutation: a sum of each token's k expert outputs, already weighted by the experts'
    # activation; its backward a gather)
    "topk": 2, "TopkBackward0": 1, "moe::permute": 0, "MoePermuteBackward0": 1, "moe::unpermute": 1,
    "MoeUnpermuteBackward0": 0,
}


def base_name(name: str) -> str:
    """The op's schema name without the tracer's prefixes or an overload suffix
    (``aten::add_.Tensor`` -> ``add_``)."""
    short = _PREFIX.sub("", name.strip())
    return short.split(".", 1)[0] if not short.endswith("Backward0") else short


def is_optimizer(short: str) -> bool:
    return short.startswith("_foreach_") or short.startswith("_fused_") or short in ("adam", "adamw", "sgd")


def is_attention_backward(short: str) -> bool:
    s = short.lower()
    return "backward" in s and ("scaleddotproduct" in s or "flashattention" in s or "efficientattention" in s)


def classify(name: str, stage: str = "") -> tuple[str, str]:
    """(kind, class) of an op: the kind picks the cost formula, the class is what is reported."""
    short = base_name(name)
    if short in MATMUL_FWD:
        return "matmul", "matmul"
    if short in MATMUL_BWD:
        return "matmul_backward", "matmul"
    if short in CONV_FWD:
        return "conv", "conv"
    if short in CONV_BWD:
        return "conv_backward", "conv"
    if short in ATTENTION_FWD:
        return "attention", "attention"
    if is_attention_backward(short):
        return "attention_backward", "attention"
    if short in NORM:
        return "norm", "norm"
    if short in POOLING:
        return "pooling", "pooling"
    if short in EMBEDDING:
        return "embedding", "embedding"
    if short in LOSS:
        return "loss", "loss"
    if is_optimizer(short) or stage == "optimizer":
        return "optimizer", "optimizer"
    if short in ELEMENTWISE:
        return "elementwise", "elementwise"
    return "unknown", "unknown"


__all__ = ["BATCH_NORM", "MATRIX_CLASSES", "base_name", "classify"]
