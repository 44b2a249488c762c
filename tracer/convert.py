"""Conversion of an (execution trace, profiler trace) pair into TrioSim's operator/tensor tables.

The model of one training step written here:

* **Operators** are the *top-level* calls of the step in call order: forward ops called by the
  model code, one ``autograd::engine::evaluate_function: XBackward0`` node per autograd node run
  by backward, and the optimizer's ops (children of the ``Optimizer.step#...`` annotation).  An
  op's ``OperatorID`` is its 1-based position in that list; ops that did no device work are left
  out of ``trace.csv`` (so IDs have gaps, as in the original tracer).
* **Time**: with CUDA kernels in the profile an op's duration is the sum of the durations of the
  kernels its launches started (``Operator_cudatimenooverlap``) and its span is first-kernel-start
  to last-kernel-end (``Operator_cudatime``); an op without kernels did no device work and is
  dropped.  A CPU-only profile has no kernels: both columns hold the op's own CPU duration and an
  op is dropped when everything it called is a view, an allocation or a host-side scalar read.
* **Tensors**: an op's inputs are the tensor arguments of its top call plus every other tensor its
  sub-calls read that it did not make itself; its outputs are its returned tensors plus every
  tensor it made that a later op reads (saved activations such as max-pool indices, gradients).
  Views resolve to the tensor they alias (see ``tensors.py``), so a consumer of a view reads the
  producer's tensor.
* **Attention mask**: a kept op that runs a fused attention call (``scaled_dot_product_attention``,
  its flash/efficient/cuDNN/CPU kernels and their backward calls: the first call under the op
  whose name says attention and whose schema has ``is_causal``) counts as causal or full by that
  flag; the step is ``causal`` when all are, ``full`` when none is, ``mixed`` otherwise, and has
  no mask when it has no such op (``ConvertStats.attention_mask``, written to meta.json).
* **Stage**: ``backward`` for autograd nodes, ``optimizer`` inside the optimizer step (or after
  the last backward op), else ``forward``.  **tpflag** = 1 for ops named in the target list and
  for backward ops whose forward op (matched by autograd sequence number) is one of them.
"""

from __future__ import annotations

import bisect
import os
from collections import defaultdict
from dataclasses import dataclass, field

from .errors import TracerError
from .etrace import ExecutionTrace, Node, load_execution_trace
from .kineto import ProfilerTrace, load_profiler_trace
from .pairing import pair_events
from .tensors import OpTensors, TensorTracker

DEFAULT_TARGETS: tuple[str, ...] = ("aten::conv2d", "aten::linear", "aten::embedding")
BACKWARD_PREFIX = "autograd::engine::evaluate_function"
OPTIMIZER_STEP_PREFIX = "Optimizer.step#"
PARAMETER_CATEGORIES = ("weight", "bias")

# Calls that never do device work: allocations, metadata, host-side scalar reads.  Views are
# recognised from their schema instead (outputs alias an input: Tensor(a) -> Tensor(a)).
NO_WORK_OPS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::resize_", "aten::as_strided_", "aten::set_",
    "aten::detach_", "aten::lift_fresh", "aten::_unsafe_view", "aten::_reshape_alias",
    "aten::item", "aten::_local_scalar_dense", "aten::resolve_conj", "aten::resolve_neg",
    "aten::is_nonzero", "aten::size", "aten::stride", "aten::numel", "aten::dim",
    "aten::result_type", "aten::record_stream", "aten::is_same_size", "aten::empty_permuted",
})


@dataclass(frozen=True)
class ConvertOptions:
    """Knobs of the conversion."""

    targets: tuple[str, ...] = DEFAULT_TARGETS  # ops split under tensor parallelism
    gpuid: int = 0  # value of the gpuid columns (the original hard-coded 0)


@dataclass(frozen=True)
class TensorRow:
    """One row of tensor.csv: one tensor argument of one kept op."""

    index: int
    tensor_id: int
    shape: tuple[int, ...]
    numel: int
    itemsize: int
    category: str
    storage: int
    gpuid: int


@dataclass(frozen=True)
class OpRow:
    """One row of trace.csv: one kept top-level op."""

    op_id: int
    name: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    cudatime: float
    cudatime_nooverlap: float
    input_sizes: tuple[int, ...]
    output_sizes: tuple[int, ...]
    gpuid: int
    stage: str
    tpflag: int
    fwd_op: int  # OperatorID of the forward op a backward op belongs to, else -1


@dataclass
class ConvertStats:
    """What the conversion did, for the user and the tests."""

    pairing: str
    time_source: str  # "kernels" or "cpu"
    top_level_ops: int
    kept_ops: int
    unpaired_ops: int
    dropped: dict[str, int] = field(default_factory=dict)  # name -> count of dropped ops
    attention_ops: int = 0  # kept ops that run a fused attention call
    causal_attention_ops: int = 0  # of those, the ones whose call says is_causal

    @property
    def attention_mask(self) -> str | None:
        """``causal`` when every fused attention op is causal, ``full`` when none is, ``mixed``
        when some are (triosim costs a mixed step as full), None without fused attention."""
        if not self.attention_ops:
            return None
        if self.causal_attention_ops == self.attention_ops:
            return "causal"
        return "full" if not self.causal_attention_ops else "mixed"


@dataclass
class TraceTables:
    """The converted trace: trace.csv rows, tensor.csv rows and conversion statistics."""

    ops: list[OpRow]
    tensors: list[TensorRow]
    stats: ConvertStats


@dataclass
class _TopOp:
    node: Node
    op_id: int
    in_optimizer_step: bool
    stage: str = "forward"
    keep: bool = False
    cudatime: float = 0.0
    nooverlap: float = 0.0
    tensors: OpTensors = field(default_factory=OpTensors)


def normalise_targets(targets: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Accept ``conv2d`` as well as ``aten::conv2d``."""
    out = []
    for t in targets:
        t = t.strip()
        if t:
            out.append(t if "::" in t else f"aten::{t}")
    return tuple(out)


def _is_backward(node: Node) -> bool:
    return node.name.startswith(BACKWARD_PREFIX)


def _is_container(node: Node) -> bool:
    """Annotations such as Optimizer.step#Adam.step: no schema, no tensors; look inside."""
    return not node.op_schema and not node.has_tensors() and not _is_backward(node)


def _is_view(node: Node) -> bool:
    schema = node.schema
    if schema is None or not schema.returns_view():
        return False
    in_storages = {t.storage for _, t in node.input_tensors()}
    return all(t.storage in in_storages or t.numel == 0 for _, t in node.output_tensors())


def _does_work(et: ExecutionTrace, node: Node) -> bool:
    for n in et.subtree(node):
        if n.op_schema and n.name not in NO_WORK_OPS and not _is_view(n):
            return True
    return False


def _top_level_ops(et: ExecutionTrace) -> list[_TopOp]:
    found: list[tuple[Node, bool]] = []

    def visit(node: Node, in_step: bool) -> None:
        if _is_container(node):
            inner = in_step or node.name.startswith(OPTIMIZER_STEP_PREFIX)
            for child in et.children(node):
                visit(child, inner)
        else:
            found.append((node, in_step))

    for root in et.thread_roots():
        for child in et.children(root):
            visit(child, False)
    found.sort(key=lambda p: (p[0].rf_id, p[0].id))
    return [_TopOp(node=n, op_id=i + 1, in_optimizer_step=s) for i, (n, s) in enumerate(found)]


def _assign_stages(tops: list[_TopOp]) -> None:
    last_backward = max((i for i, t in enumerate(tops) if _is_backward(t.node)), default=-1)
    for i, t in enumerate(tops):
        if _is_backward(t.node):
            t.stage = "backward"
        elif t.in_optimizer_step or (last_backward >= 0 and i > last_backward):
            t.stage = "optimizer"
        else:
            t.stage = "forward"


def _assign_times(et: ExecutionTrace, prof: ProfilerTrace, tops: list[_TopOp]) -> tuple[str, int]:
    pairing = pair_events(et, prof)
    use_kernels = prof.has_kernels
    runtime_by_tid: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in prof.runtime:
        runtime_by_tid[str(r.tid)].append((r.ts, r.correlation))
    for lst in runtime_by_tid.values():
        lst.sort()
    kernels_by_corr: dict[int, list] = defaultdict(list)
    for d in prof.device:
        if d.is_kernel:
            kernels_by_corr[d.correlation].append(d)
    unpaired = 0
    for t in tops:
        ev = pairing.by_node.get(t.node.id)
        if ev is None:
            # Calls on threads the profiler does not watch (e.g. an allocation on an intra-op
            # worker thread) have no event; only ones that did work are worth reporting.
            works = _does_work(et, t.node)
            unpaired += int(works)
            t.keep = works and not use_kernels
            continue
        if use_kernels:
            launches = runtime_by_tid.get(str(ev.tid), [])
            lo = bisect.bisect_left(launches, (ev.ts, -1))
            hi = bisect.bisect_right(launches, (ev.ts + ev.dur, float("inf")))
            kernels = [k for _, corr in launches[lo:hi] for k in kernels_by_corr.get(corr, ())]
            t.keep = bool(kernels)
            if kernels:
                t.nooverlap = sum(k.dur for k in kernels)
                t.cudatime = max(k.ts + k.dur for k in kernels) - min(k.ts for k in kernels)
        else:
            t.keep = _does_work(et, t.node)
            t.cudatime = t.nooverlap = ev.dur
    return pairing.method, unpaired


def _track_tensors(et: ExecutionTrace, tops: list[_TopOp]) -> TensorTracker:
    tracker = TensorTracker(next_id=et.max_tensor_id + 1)
    for t in tops:
        op = t.tensors
        for n in et.subtree(t.node):
            is_top = n is t.node
            if not n.op_schema:
                # Autograd wrapper nodes (XBackward0, AccumulateGrad) list the incoming grads.
                for _, ref in n.input_tensors():
                    gen = tracker.read(ref, op)
                    if gen not in op.internal:
                        op.note_read(gen, "grad_output", True)
                continue
            view = _is_view(n)
            for arg, ref in n.input_tensors():
                gen = tracker.read(ref, op)
                category = arg.name or "input"
                if is_top:
                    op.declared_inputs.append((gen, category))
                elif not ref.shape:
                    # A 0-dim tensor read by a nested call is almost always a Python number
                    # wrapped into a tensor on the spot, whose recycled ids would otherwise be
                    # taken for some earlier scalar; it is not data of the step.
                    continue
                if gen not in op.internal:
                    op.note_read(gen, category, strong=not view)
            in_by_storage: dict[int, int] = {}
            if view:
                for _, ref in n.input_tensors():
                    in_by_storage.setdefault(ref.storage, tracker.canon[tracker.current[ref.id]])
            for _, ref in n.output_tensors():
                if view and ref.storage in in_by_storage:
                    gen = tracker.alias(ref, in_by_storage[ref.storage], op)
                else:
                    gen = tracker.produce(ref, op, authoritative=is_top)
                if is_top and gen not in op.declared_outputs:
                    op.declared_outputs.append(gen)
    return tracker


def _is_causal(et: ExecutionTrace, top: _TopOp) -> bool | None:
    """The ``is_causal`` flag of the first fused attention call under a top-level op (the
    op itself, or the kernel call inside an autograd node), or None when it runs none. The
    argument is found by its schema name: its position differs from op to op."""
    for n in et.subtree(top.node):
        if "attention" in n.name:
            flag = n.scalar("is_causal")
            if isinstance(flag, bool):
                return flag
    return None


def _fwd_ops(et: ExecutionTrace, tops: list[_TopOp]) -> dict[int, _TopOp]:
    """Backward op index -> forward top-level op that created its autograd node."""
    by_seq: dict[tuple[int, int], _TopOp] = {}
    by_seq_any: dict[int, _TopOp] = {}
    for t in tops:
        if t.stage != "forward":
            continue
        for n in et.subtree(t.node):
            if n.seq_id >= 0:
                # The autograd node is created by the last op that saw this number.
                by_seq[(n.tid, n.seq_id)] = t
                by_seq_any[n.seq_id] = t
    out: dict[int, _TopOp] = {}
    for i, t in enumerate(tops):
        if t.stage != "backward":
            continue
        # The first numbered call of an autograd node is its XBackward0 wrapper.
        n = next((n for n in et.subtree(t.node) if n.seq_id >= 0), None)
        if n is None:
            continue  # AccumulateGrad has no forward op
        fwd = by_seq.get((n.fw_tid, n.seq_id)) if n.fw_tid else None
        fwd = fwd or by_seq_any.get(n.seq_id)
        if fwd is not None:
            out[i] = fwd
    return out


def convert_trace(et: ExecutionTrace, prof: ProfilerTrace,
                  options: ConvertOptions | None = None) -> TraceTables:
    """Convert a parsed execution trace + profiler trace into trace/tensor rows."""
    options = options or ConvertOptions()
    targets = set(normalise_targets(options.targets))
    tops = _top_level_ops(et)
    if not tops:
        raise TracerError(f"{et.path}: the execution trace has no operators under its thread "
                          "nodes")
    _assign_stages(tops)
    pairing_method, unpaired = _assign_times(et, prof, tops)
    if unpaired * 2 > len(tops):
        raise TracerError(f"{prof.path}: does not match {et.path}: {unpaired} of {len(tops)} "
                          "operators have no profiler event (are they from the same step?)")
    tracker = _track_tensors(et, tops)

    # Which ops read each tensor (directly, or a view of it through its storage root).
    readers: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(tops):
        for gen in t.tensors.read_order:
            readers[gen].append(i)
            root = tracker.storage_key(gen)
            if root != gen:
                readers[root].append(i)
    last_reader = {g: max(ix) for g, ix in readers.items()}
    made_anywhere: set[int] = set()
    for t in tops:
        made_anywhere |= t.tensors.internal

    def scalar_constant(gen: int) -> bool:
        """A 0-dim tensor no op makes and only one op reads: a Python number wrapped into a
        tensor inside a call (e.g. by the CPU path of _foreach_mul_), not data of the step."""
        return (gen not in made_anywhere and tracker.info[gen].shape == ()
                and len(set(readers.get(gen, ()))) <= 1)

    # Parameters: read in forward and by the optimizer, never written before that forward read.
    forward_reads: set[int] = set()
    optimizer_reads: set[int] = set()
    made_so_far: set[int] = set()
    for t in tops:
        if t.stage == "forward":
            forward_reads.update(g for g in t.tensors.read_order if g not in made_so_far)
        elif t.stage == "optimizer":
            optimizer_reads.update(t.tensors.read_order)
        made_so_far.update(t.tensors.produced)
    produced_in_backward = {g for t in tops if t.stage == "backward" for g in t.tensors.produced}
    parameters = forward_reads & optimizer_reads
    gradients = produced_in_backward & optimizer_reads
    param_category: dict[int, str] = {}
    for t in tops:
        for gen, cat in t.tensors.declared_inputs:
            if gen in parameters and cat in PARAMETER_CATEGORIES:
                param_category.setdefault(gen, cat)
        for gen, (cat, _) in t.tensors.reads.items():
            if gen in parameters and cat in PARAMETER_CATEGORIES:
                param_category.setdefault(gen, cat)

    fwd_of = _fwd_ops(et, tops)
    kept_ids = [t.op_id for t in tops if t.keep]

    def nearest_kept_forward(op_id: int) -> int:
        pos = bisect.bisect_right(kept_ids, op_id) - 1
        while pos >= 0:
            cand = tops[kept_ids[pos] - 1]
            if cand.stage == "forward":
                return cand.op_id
            pos -= 1
        return -1

    ops: list[OpRow] = []
    rows: list[TensorRow] = []
    dropped: dict[str, int] = defaultdict(int)
    masks: list[bool] = []
    for i, t in enumerate(tops):
        if not t.keep:
            dropped[t.node.name] += 1
            continue
        causal = _is_causal(et, t)
        if causal is not None:
            masks.append(causal)
        op = t.tensors
        inputs: list[tuple[int, str]] = list(op.declared_inputs)
        listed = {g for g, _ in inputs}
        for gen in op.read_order:
            if gen not in listed and not scalar_constant(gen):
                inputs.append((gen, op.reads[gen][0]))
                listed.add(gen)
        outputs: list[int] = list(op.declared_outputs)
        for gen in op.produced:
            if gen not in outputs and last_reader.get(gen, -1) > i:
                outputs.append(gen)
        if t.stage == "optimizer":
            inputs = [(g, param_category.get(g, "weight") if g in parameters
                       else "grad" if g in gradients else c) for g, c in inputs]
        fwd = fwd_of.get(i)
        tpflag = int(t.node.name in targets or (fwd is not None and fwd.node.name in targets))
        fwd_op = -1
        if fwd is not None:
            fwd_op = fwd.op_id if fwd.keep else nearest_kept_forward(fwd.op_id)
        for gen, cat in inputs:
            rows.append(_tensor_row(len(rows), gen, cat, tracker, options.gpuid))
        for gen in outputs:
            rows.append(_tensor_row(len(rows), gen, "output", tracker, options.gpuid))
        ops.append(OpRow(
            op_id=t.op_id, name=t.node.name,
            inputs=tuple(g for g, _ in inputs), outputs=tuple(outputs),
            cudatime=t.cudatime, cudatime_nooverlap=t.nooverlap,
            input_sizes=tuple(tracker.info[g].numel for g, _ in inputs),
            output_sizes=tuple(tracker.info[g].numel for g in outputs),
            gpuid=options.gpuid, stage=t.stage, tpflag=tpflag, fwd_op=fwd_op))
    stats = ConvertStats(pairing=pairing_method,
                         time_source="kernels" if prof.has_kernels else "cpu",
                         top_level_ops=len(tops), kept_ops=len(ops), unpaired_ops=unpaired,
                         dropped=dict(sorted(dropped.items())), attention_ops=len(masks),
                         causal_attention_ops=sum(masks))
    if not ops:
        raise TracerError(f"{prof.path}: no operator did any work (is this the profile of the "
                          f"same step as {et.path}?)")
    return TraceTables(ops=ops, tensors=rows, stats=stats)


def _tensor_row(index: int, gen: int, category: str, tracker: TensorTracker,
                gpuid: int) -> TensorRow:
    info = tracker.info[gen]
    return TensorRow(index=index, tensor_id=gen, shape=info.shape, numel=info.numel,
                     itemsize=info.itemsize, category=category,
                     storage=tracker.storage_key(gen), gpuid=gpuid)


def convert_files(graph: str | os.PathLike[str], profiler: str | os.PathLike[str],
                  options: ConvertOptions | None = None) -> TraceTables:
    """Read an execution-trace JSON and a profiler JSON and convert them."""
    et = load_execution_trace(graph)
    prof = load_profiler_trace(profiler)
    return convert_trace(et, prof, options)
