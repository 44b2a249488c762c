"""Op costs from the trace's own shapes: the FLOPs and the bytes read and written by each op.

The trace says what ran (op names, tensor shapes, element sizes); this module turns each op into
an :class:`OpCost` that the roofline model (:mod:`triosim.compute.roofline`) times on a device.
Conventions (one multiply-add is 2 FLOPs; bytes are HBM traffic of the listed tensors, each
distinct tensor counted once per pass):

- matmul family (linear, addmm, mm, bmm, matmul, baddbmm): ``2·numel(out)·K``; a linear of
  (b, in) -> (b, out) is ``2·b·in·out``. Its backward (AddmmBackward0, MmBackward0, ...) is the two
  products dX = dY·W and dW = dYᵀ·X: twice that. The original's traces list only the weight's
  transpose for AddmmBackward0; the rows then come from the forward op the backward belongs to.
  A batched product's backward (BmmBackward0 over [..., M, N] = [..., M, K]·[..., K, N], as an
  attention core's QKᵀ and ·V) has no 2-D weight: its (B·M, N, K) comes from its own grad_output
  and operands, ``4·B·M·N·K``.
- grouped GEMM (``_grouped_mm``, the experts of an MoE layer): ``2·M·N·K`` over its M rows
  (every expert's tokens), the backward (data and weight gradients) twice that;
- convolution: ``2·numel(out)·(Cin/groups)·kh·kw`` = ``2·numel(out)·numel(weight)/Cout``
  (groups are in the weight's shape). Its backward (ConvolutionBackward0) is the weight-gradient
  product plus, when the op writes one (the first layer's input needs none), the
  input-gradient product: twice the forward.
- attention (scaled_dot_product / flash): QKᵀ and PV, ``4·numel(q)·s_k`` (= 4·b·h·s_q·s_k·d),
  half that under a causal mask (meta.json ``attention_mask: causal``; with as many keys as
  queries); backward 2.5× (FlashAttention-2's accounting).
  Bytes: q, k, v and the outputs only (no s×s matrix in HBM).
- norms and softmax: bytes-bound, ~5 FLOPs per element (8 for backward); layer/RMS norm and
  softmax read a row once, group/instance norm read their input twice (statistics, then normalise).
- training batch norm (cuDNN's kernels, one thread block per channel): forward reads x for the
  statistics, then x again to write y; backward reads x and dy for its two sums, then both again
  to write dx. ``blocks`` = C (the channels) when the input has spatial dims: the roofline then
  also bounds the op by what C blocks can read (:meth:`Device.block_limited_rate`).
- elementwise and activation ops, pooling, embedding, loss: bytes of the listed tensors.
- optimizer (``_foreach_*``, fused Adam): every listed tensor list read, the first written (an
  in-place ``_foreach_*_`` lists no outputs).
- anything else: bytes of the listed tensors only, ``known=False`` (counted in summaries).

A tensor of 0 bytes (an undefined optional output, such as the first conv's input gradient)
moves nothing and asks for no product.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..trace import Op, Tensor, Trace
from .op_kinds import BATCH_NORM, ELEMENTWISE, MATRIX_CLASSES, NORM, base_name, classify

BYTES_TO_DTYPE = {8: "fp64", 4: "fp32", 2: "bf16", 1: "fp8"}
# Tensors that carry indices, masks or labels, not the op's arithmetic type.
_NOT_DATA = frozenset({"indices", "target", "mask", "total_weight"})


@dataclass(frozen=True)
class OpCost:
    """The work of one op: FLOPs, HBM bytes read and written, its class and dtype."""

    flops: float
    bytes_read: float
    bytes_written: float
    kind: str  # the formula used: matmul, matmul_backward, conv, conv_backward, attention, norm, ...
    op_class: str  # matmul, conv, attention, norm, pooling, embedding, loss, elementwise, optimizer, unknown
    dtype: str  # fp32, bf16, fp8, fp64: from the op's element size (2 bytes read as bf16)
    known: bool = True
    gemm: tuple[int, int, int] | None = None  # (M, N, K) of a matmul's forward product
    blocks: int | None = None  # thread blocks of a kernel whose parallelism the shape limits (BN: C)
    attention: tuple[int, bool, int] | None = None  # a fused attention op's (head size, causal mask, keys per query)

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def on_matrix_units(self) -> bool:
        return self.op_class in MATRIX_CLASSES

    def with_work(self, flops: float, bytes_read: float, bytes_written: float) -> OpCost:
        """This cost with other FLOPs and bytes: ``dataclasses.replace`` without its walk over the
        fields (``plan`` re-scales some 10^5 costs)."""
        return OpCost(flops, bytes_read, bytes_written, self.kind, self.op_class, self.dtype, self.known, self.gemm,
                      self.blocks, self.attention)


def _numel(shape: Sequence[int] | None) -> int:
    return math.prod(shape) if shape is not None else 0


def _dtype(tensors: Sequence[Tensor]) -> str:
    for t in tensors:
        if t.category not in _NOT_DATA and t.each_byte in BYTES_TO_DTYPE and t.numel > 0:
            return BYTES_TO_DTYPE[t.each_byte]
    return "fp32"


def _unique(ids: Sequence[str], tensors: Mapping[str, Tensor]) -> list[Tensor]:
    seen: dict[str, Tensor] = {}
    for tid in ids:
        if tid not in seen:
            seen[tid] = tensors[tid]
    return list(seen.values())


def _listed_bytes(ins: list[Tensor], outs: list[Tensor]) -> tuple[float, float]:
    return float(sum(t.bytes for t in ins)), float(sum(t.bytes for t in outs))


def _largest(ts: list[Tensor]) -> Tensor | None:
    return max(ts, key=lambda t: t.numel, default=None)


def _matmul_forward(short: str, ins: list[Tensor], outs: list[Tensor]) -> tuple[int, int, int] | None:
    """(M, N, K) with numel(out) = M·N: K is the contraction length."""
    out = _largest(outs)
    mats = [t for t in ins if t.shape and len(t.shape) >= 1 and t.numel > 0]
    if out is None or not out.shape or not mats:
        return None
    if short == "linear":  # weight [out, in]; the input may be listed before its flatten
        weight = next((t for t in mats[1:] if t.category == "weight" and len(t.shape) == 2), None)
        k = weight.shape[1] if weight is not None else mats[0].shape[-1]
    elif short in ("addmm", "baddbmm", "addbmm", "addmv") and len(mats) >= 3:
        k = mats[1].shape[-1]
    else:
        k = mats[0].shape[-1]
    n = out.shape[-1]
    return (out.numel // max(n, 1), n, k)


def _gemm_bytes(m: int, n: int, k: int, each: int) -> float:
    return float((m * k + k * n + m * n) * each)


def _matmul_backward(ins: list[Tensor], hint: tuple[int, int, int] | None, rows: int | None
                     ) -> tuple[int, int, int] | None:
    """The forward product's (M, N, K) for a matmul backward: N and K from its 2-D weight, M
    from its grad_output; else ``hint`` (the forward op's product), else ``rows`` rows."""
    weight = next((t for t in ins if t.category == "weight" and t.shape and len(t.shape) == 2), None)
    if weight is None:
        weight = next((t for t in ins if t.shape and len(t.shape) == 2), None)
    if weight is None:
        return hint
    dims = set(weight.shape)
    if hint is not None and {hint[1], hint[2]} == dims:
        return hint
    for t in ins:
        if t is not weight and t.shape and t.shape[-1] in dims and t.numel > 0:
            n = t.shape[-1]
            k = weight.shape[1] if weight.shape[0] == n else weight.shape[0]
            return (t.numel // n, n, k)
    if hint is not None:
        return hint
    return (rows, weight.shape[0], weight.shape[1]) if rows else None


def _batched_backward(ins: list[Tensor]) -> tuple[int, int, int] | None:
    """(B·M, N, K) of a batched product's backward from [grad_out [..., M, N], a [..., M, K],
    b [..., K, N]] (None when the three do not fit together)."""
    data = [t for t in ins if t.category not in _NOT_DATA and t.shape and len(t.shape) >= 3 and t.numel > 0]
    if len(data) < 3:
        return None
    g, a, b = data[0], data[1], data[2]
    n, k = g.shape[-1], a.shape[-1]
    if a.shape[-2] != g.shape[-2] or b.shape[-2:] != (k, n):
        return None
    return (g.numel // n, n, k)


def _conv_flops(out: Tensor | None, weight: Tensor | None) -> float:
    if out is None or weight is None or not weight.shape or not weight.shape[0]:
        return 0.0
    return 2.0 * out.numel * (weight.numel // weight.shape[0])


def _attention_flops(q: Tensor | None, k: Tensor | None) -> float:
    if q is None or k is None or not k.shape or len(k.shape) < 2:
        return 0.0
    return 4.0 * q.numel * k.shape[-2]


def _list_count(ins: list[Tensor]) -> int:
    """How many tensor lists a ``_foreach_*`` op's inputs are (the same shapes repeated)."""
    shapes = [t.shape for t in ins]
    for lists in (4, 3, 2):
        if len(shapes) % lists == 0 and len(shapes) >= lists:
            n = len(shapes) // lists
            if all(shapes[i * n:(i + 1) * n] == shapes[:n] for i in range(1, lists)):
                return lists
    return 1


def _batch_norm(short: str, ins: list[Tensor], read: float) -> tuple[float, float, int | None]:
    """(bytes read, FLOPs, thread blocks) of a training batch norm: the listed tensors once, plus
    the second pass over x (forward) or over x and dy (backward); one block per channel."""
    backward = "Backward" in short
    acts = sorted((t for t in ins if t.category not in _NOT_DATA and t.shape and len(t.shape) >= 2),
                  key=lambda t: -t.numel)
    big = acts[0] if acts else None
    if big is None:
        return read, 0.0, None
    again = [t for t in acts[: 2 if backward else 1] if t.numel == big.numel]
    read += sum(t.bytes for t in again)
    blocks = big.shape[1] if len(big.shape) >= 3 else None  # (N, C) is cuDNN's per-activation mode
    return read, (8.0 if backward else 5.0) * big.numel, blocks


def op_cost(op: Op, tensors: Mapping[str, Tensor], gemm_hint: tuple[int, int, int] | None = None,
            rows: int | None = None, causal: bool = False) -> OpCost:
    """The cost of ``op`` from its tensors' shapes. For a matmul backward that lists only its
    weight (the original's traces): ``gemm_hint``, the (M, N, K) of the forward product it belongs
    to, else ``rows`` (the batch) as M. A matmul without a product it can find is costed by bytes
    only (``known=False``). ``causal``: the trace's fused attention ops run under a causal mask."""
    kind, op_class = classify(op.name, op.stage)
    short = base_name(op.name)
    ins = _unique(op.inputs, tensors)
    outs = [t for t in _unique(op.outputs, tensors) if t.bytes > 0]
    live_ins = [t for t in ins if t.bytes > 0]
    dtype = _dtype([*live_ins, *outs])
    each = {"fp64": 8, "fp32": 4, "bf16": 2, "fp8": 1}[dtype]
    read, written = _listed_bytes(live_ins, outs)
    flops = 0.0
    gemm = None
    blocks = None
    attention = None
    if kind == "matmul":
        gemm = _matmul_forward(short, live_ins, outs)
        if gemm is not None:
            flops = 2.0 * gemm[0] * gemm[1] * gemm[2]
    elif kind == "matmul_backward":
        if short == "GroupedMmBackward0" and len(live_ins) >= 2:  # grad_out [.., M, N], input [.., M, K], weight [E, N, K]
            gemm = (live_ins[0].numel // live_ins[0].shape[-1], live_ins[0].shape[-1], live_ins[1].shape[-1])
        else:
            batched = not any(t.shape and len(t.shape) == 2 for t in live_ins) and _batched_backward(live_ins)
            gemm = batched or _matmul_backward(live_ins, gemm_hint, rows)
        if gemm is not None:
            m, n, k = gemm
            flops = 4.0 * m * n * k
            # dX = dY·W reads dY, W and writes dX; dW = dYᵀ·X reads dY, X and writes dW.
            read = max(read, float((2 * m * n + n * k + m * k) * each))
            written = max(written, float((m * k + n * k) * each))
    elif kind in ("conv", "conv_backward"):
        weight = next((t for t in live_ins if t.category == "weight"), None)
        if weight is None:
            weight = next((t for t in live_ins if t.shape and len(t.shape) >= 3 and t is not live_ins[0]), None)
        if kind == "conv":
            flops = _conv_flops(_largest(outs), weight)
        else:
            grad_out = live_ins[0] if live_ins else None
            fwd = _conv_flops(grad_out, weight)
            grad_input = tensors[op.outputs[0]] if op.outputs else None
            flops = fwd * (2 if grad_input is not None and grad_input.bytes > 0 else 1)
    elif kind in ("attention", "attention_backward"):
        data = [t for t in live_ins if t.category not in _NOT_DATA]
        q, k = (data[0], data[1]) if kind == "attention" and len(data) >= 2 else (
            (data[1], data[2]) if len(data) >= 3 else (None, None))
        flops = _attention_flops(q, k) * (1.0 if kind == "attention" else 2.5)
        if q is not None and k is not None and flops > 0:
            # the mask keeps half the (query, key) pairs only where queries and keys are the same
            # positions; a sliding window's keys are already the window
            square = causal and len(q.shape) >= 2 and q.shape[-2] == k.shape[-2]
            # a traced q is often a view recorded with its base's [b, s, heads·d] shape: its head
            # size is then unknown (0), and no measured attention curve is chosen for it
            attention = (q.shape[-1] if len(q.shape) == 4 else 0, square, k.shape[-2])
            flops *= 0.5 if square else 1.0
    elif kind == "norm" and short in BATCH_NORM:
        read, flops, blocks = _batch_norm(short, live_ins, read)
    elif kind == "norm":
        big = _largest(live_ins)
        passes = NORM.get(short, 1)
        if big is not None:
            read += (passes - 1) * big.bytes
            flops = (8.0 if "Backward" in short else 5.0) * big.numel
    elif kind == "optimizer":
        lists = _list_count(live_ins)
        if not outs:  # in place: the first list is written back
            written = float(sum(t.bytes for t in live_ins[: len(live_ins) // lists]))
        flops = 2.0 * sum(t.numel for t in live_ins)
    elif kind == "pooling":
        big = _largest([*live_ins, *outs])
        flops = float(big.numel) if big is not None else 0.0
        out = _largest(outs)
        if short.startswith("max_pool") and out is not None and not any(t.each_byte == 8 for t in outs):
            written += 8.0 * out.numel  # training's max pool also writes an int64 index per output
    elif kind in ("elementwise", "embedding", "loss"):
        big = _largest([*live_ins, *outs])
        per = ELEMENTWISE.get(short, 1 if kind == "elementwise" else 4)
        flops = float(per * big.numel) if big is not None else 0.0
    known = kind != "unknown" and not (kind.startswith("matmul") and gemm is None)
    return OpCost(flops, read, written, kind, op_class, dtype, known=known, gemm=gemm, blocks=blocks, attention=attention)


def trace_op_costs(trace: Trace) -> list[OpCost]:
    """Every op's cost; a matmul backward that lists no grad_output takes its rows from the
    forward op it belongs to (:attr:`Trace.forward_partner`)."""
    costs: list[OpCost] = []
    partner = None
    causal = trace.info.get("attention_mask") == "causal"
    for op in trace.ops:
        hint = None
        if classify(op.name, op.stage)[0] == "matmul_backward":
            if partner is None:
                partner = trace.forward_partner
            p = partner[op.index]
            if p is not None and p < len(costs):
                hint = costs[p].gemm
        costs.append(op_cost(op, trace.tensors, hint, trace.batch_size, causal))
    return costs


__all__ = ["OpCost", "op_cost", "trace_op_costs"]
