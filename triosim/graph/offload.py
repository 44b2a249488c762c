"""Activation offload to host memory, as Megatron-Core's CPU offloading runs it
(``TransformerConfig.cpu_offloading``, ``cpu_offloading_num_layers``; the double-buffered group
offload handler of ``megatron/core/extensions/transformer_engine.py`` / Transformer Engine's
``get_cpu_offload_context``): a rewrite of the trace.

For each offloaded transformer layer L of a model chunk (the chunk's first N layers; never its
last, whose activations are read back at once):

- the forward's activations that only L's backward reads (those L's ops save, its input
  included; its output is saved by the next layer) are copied to host memory over the GPU's
  host link while the next layer runs forward. An ``offload`` op placed after the next layer's forward reads them (the
  originals are freed there) and the compute after it waits for the copy (the handler's
  synchronisation at the layer boundary);
- a ``reload`` op placed right before the next layer's backward writes them back as new buffers
  ``off<L>:<buffer>`` (the copy runs while that backward runs), and L's first backward op that
  reads one waits for the copy; L's backward reads the copies.

The copies are tasks on the GPU's host link (one resource each way), never on its compute
stream. Megatron-Core refuses CPU offloading together with activation recomputation; so does
triosim.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..compute.op_time import reindex_op_time
from ..errors import ConfigError, TraceError
from ..trace import Trace
from ..trace.layers import find_layers

if TYPE_CHECKING:  # the composition's state: only named here (it imports the graph's parts)
    from .composition_state import CompositionState

OFFLOAD, RELOAD = "d2h", "h2d"


@dataclass(frozen=True)
class OffloadSpec:
    """How many layers of each model chunk offload: ``layers`` N (the first N), or ``fraction``
    of the chunk's layers (rounded down); at most all but the chunk's last layer."""

    layers: int | None = None
    fraction: float | None = None

    @classmethod
    def parse(cls, text: str) -> OffloadSpec:
        """``--offload-activations N`` (layers) or ``F`` with 0 < F <= 1 (a fraction)."""
        s = str(text).strip()
        try:
            if s.isdigit():
                n = int(s)
                if n < 1:
                    raise ValueError
                return cls(layers=n)
            f = float(s)
        except ValueError:
            f = -1.0
        if not 0.0 < f <= 1.0:
            raise ConfigError(f"--offload-activations must be a number of layers (1, 2, ...) or a fraction in "
                              f"(0, 1], got {text!r}")
        return cls(fraction=f)

    def count(self, chunk_layers: int) -> int:
        want = self.layers if self.layers is not None else int(self.fraction * chunk_layers)
        return max(0, min(want, chunk_layers - 1))

    @property
    def label(self) -> str:
        if self.layers is not None:
            return f"{self.layers} layer{'s' if self.layers > 1 else ''} a chunk"
        return f"{self.fraction:g} of each chunk's layers"


@dataclass(frozen=True)
class HostCopy:
    """One copy between GPU and host memory: ``direction`` d2h or h2d, the ``buffers`` moved (names
    in the rewritten trace), ``start_after`` (d2h: the op whose end starts it) and ``waiter``
    (h2d: the op that waits for it)."""

    direction: str
    layer: int
    buffers: tuple[str, ...]
    start_after: int | None = None
    waiter: int | None = None


@dataclass(frozen=True)
class Offloaded:
    """A trace with its offload and reload ops inserted. ``origin[i]``: the original op new op
    ``i`` is (an inserted op: the last forward op of its layer, for its row's shapes only);
    ``copies``: new op index -> its host copy."""

    trace: Trace
    origin: tuple[int, ...]
    copies: dict[int, HostCopy]
    layers: tuple[int, ...]
    spec: OffloadSpec
    renamed: dict[str, str] = field(default_factory=dict)  # original buffer -> its copy from host

    @property
    def new_index(self) -> tuple[int, ...]:
        """Original op -> its index in the rewritten trace."""
        out = [0] * (len(self.origin) - len(self.copies))
        for n, o in enumerate(self.origin):
            if n not in self.copies:
                out[o] = n
        return tuple(out)

    def bytes_per_layer(self, fraction: float = 1.0) -> list[int]:
        """Bytes each offloaded layer moves for ``fraction`` of the trace's batch (unsharded)."""
        t = self.trace
        return [int(round(sum(t.tensors[k].bytes for k in c.buffers) * fraction))
                for c in self.copies.values() if c.direction == OFFLOAD]

    def summary(self, fraction: float = 1.0) -> dict:
        """JSON-ready: the setting, the offloaded layers, and the bytes each moves per micro-batch
        (``fraction`` of the batch) before tensor-parallel sharding."""
        return {"setting": self.spec.label, "layers": list(self.layers), "copies": len(self.copies),
                "bytes_per_layer": self.bytes_per_layer(fraction)}


def _chunks(layout, cuts: frozenset[int]) -> list[list[int]]:
    """Layers (with forward and backward ops) grouped by the model chunk their first op is on."""
    ordered = sorted(cuts)
    groups: dict[int, list[int]] = {}
    for k, (fwd, bwd) in enumerate(zip(layout.forward, layout.backward)):
        if fwd and bwd:
            groups.setdefault(sum(1 for c in ordered if c <= fwd[0]), []).append(k)
    return [groups[c] for c in sorted(groups)]


def _first_after(ordered: list[int], n: int) -> int | None:
    """The first of ``ordered`` (ascending) above ``n``, or None."""
    j = bisect_right(ordered, n)
    return ordered[j] if j < len(ordered) else None


def offload(trace: Trace, spec: OffloadSpec, cuts: frozenset[int] = frozenset()) -> Offloaded:
    """``trace`` with the offload and reload ops of ``spec`` inserted; ``cuts``: the first forward
    op of each pipeline stage (model chunk)."""
    try:
        layout = find_layers(trace)
    except TraceError as e:
        raise ConfigError(f"--offload-activations needs a transformer trace with repeated layers: {e}") from None
    first_back = next((i for i, op in enumerate(trace.ops) if op.stage != "forward"), len(trace.ops))
    after: dict[int, list[int]] = {}  # original op -> offload ops (by layer) right after it
    before: dict[int, list[int]] = {}  # original op -> reload ops right before it
    moved: dict[int, tuple[str, ...]] = {}
    chosen: list[int] = []
    for chunk in _chunks(layout, cuts):
        for pos in range(spec.count(len(chunk))):
            k, nxt = chunk[pos], chunk[pos + 1]
            own = set(layout.backward[k])
            # what L's backward alone reads of the forward's activations (TE's offload handler
            # groups tensors by the layer that saves them: its input included, its output not)
            keep = []
            for i in layout.backward[k]:
                for b in trace.reads[i]:
                    if b in trace.batch_invariant or trace.producer.get(b, first_back) >= first_back:
                        continue
                    if all(c in own for c in trace.consumers.get(b, ()) if c >= first_back):
                        keep.append(b)
            if not keep:
                continue
            moved[k] = tuple(dict.fromkeys(keep))
            chosen.append(k)
            after.setdefault(max(layout.forward[nxt]), []).append(k)
            before.setdefault(min(layout.backward[nxt]), []).append(k)
    names = {b: f"off{k}:{b}" for k in chosen for b in moved[k]}
    tensors = dict(trace.tensors.items())
    for b, new in names.items():
        tensors[new] = tensors[b]._replace(id=new)
    owner = {b: k for k in chosen for b in moved[k]}
    own_back = {k: set(layout.backward[k]) for k in chosen}
    next_id = max((op.op_id for op in trace.ops), default=0) + 1
    ops, reads, writes, origin, partner = [], [], [], [], []
    copies: dict[int, HostCopy] = {}
    inserted_at: dict[tuple[str, int], int] = {}
    old_partner = trace.forward_partner

    def insert(kind: str, k: int) -> None:
        nonlocal next_id
        src = trace.ops[max(layout.forward[k])]
        r = moved[k] if kind == OFFLOAD else ()
        w = () if kind == OFFLOAD else tuple(names[b] for b in moved[k])
        word = "offload" if kind == OFFLOAD else "reload"
        ops.append(src._replace(index=len(ops), op_id=next_id, name=f"{word}::layer{k}", inputs=r, outputs=w,
                                stage="forward" if kind == OFFLOAD else "backward", tpflag=False))
        next_id += 1
        reads.append(r)
        writes.append(w)
        origin.append(max(layout.forward[k]))
        partner.append(None if kind == OFFLOAD else layout.forward[k][0])
        inserted_at[(kind, k)] = len(ops) - 1

    for i, op in enumerate(trace.ops):
        for k in before.get(i, ()):
            insert(RELOAD, k)
        r = trace.reads[i]
        if op.stage != "forward" and owner:
            r = tuple(names[b] if b in owner and i in own_back[owner[b]] else b for b in r)
        ops.append(op._replace(index=len(ops)))
        reads.append(r)
        writes.append(trace.writes[i])
        origin.append(i)
        partner.append(old_partner[i])
        for k in after.get(i, ()):
            insert(OFFLOAD, k)
    new_index = {o: n for n, o in enumerate(origin) if n not in inserted_at.values()}
    # the ops reading each reloaded copy, in order (one pass, not one per reload)
    renamed = set(names.values())
    readers: dict[str, list[int]] = {}
    for n2, rd in enumerate(reads):
        for b in rd:
            if b in renamed:
                readers.setdefault(b, []).append(n2)
    for (kind, k), n in inserted_at.items():
        if kind == OFFLOAD:
            copies[n] = HostCopy(OFFLOAD, k, moved[k], start_after=new_index[max(layout.forward[k])])
        else:
            # the first op after the reload that reads one of its copies
            waiter = min(filter(None, (_first_after(readers.get(names[b], []), n) for b in moved[k])))
            copies[n] = HostCopy(RELOAD, k, tuple(names[b] for b in moved[k]), waiter=waiter)
    partner = [new_index[p] if p is not None else None for p in partner]
    producer = {b: new_index[j] for b, j in trace.producer.items()}
    for b, new in names.items():
        producer[new] = inserted_at[(RELOAD, owner[b])]
    new = replace(trace, ops=ops, tensors=tensors, reads=reads, writes=writes, producer=producer,
                  op_time=reindex_op_time(trace.op_time, tuple(origin)), _columns=None, _op_codes=None)
    new._partner = tuple(partner)
    return Offloaded(new, tuple(origin), copies, tuple(chosen), spec, names)


def host_link_rate(trace: Trace) -> float:
    """The GPU's host link (B/s each way) from its device file; a ConfigError without one."""
    from ..compute.op_time_source import gpu_timing

    timing = gpu_timing(trace)
    device = timing.device if timing is not None else None
    rate = getattr(device, "host_link_bytes_per_s", None)
    if rate is None:
        what = f"{device.display_name}'s device file gives no host_link_gbps" if device is not None else \
            "the run names no GPU"
        raise ConfigError(f"--offload-activations copies over the GPU's host link, but {what}: give --gpu with a "
                          "device that has one (triosim gpus)")
    return float(rate)


def offload_on_plan(trace: Trace, spec_text: str, plan):
    """The rewrite of ``trace`` for ``--offload-activations spec_text`` on the chunks of the
    pipeline ``plan``, and ``plan`` moved onto the rewritten trace."""
    from .pipeline.schedules import FORWARD
    from .pipeline.stages import with_cuts_moved

    forward = [i for i, ph in enumerate(plan.phase) if ph == FORWARD]
    spec, cuts = OffloadSpec.parse(spec_text), frozenset(forward[s] for s in plan.starts[1:])
    check_layer_count(spec, spec_text, trace)
    off = offload(trace, spec, cuts)
    return off, with_cuts_moved(off.trace, plan, off.new_index)


def check_layer_count(spec: OffloadSpec, spec_text: str, trace: Trace) -> None:
    """Refuse a layer count the model does not hold, as Megatron-Core does ("CPU offloading can be
    done only for layers less than" the model's): it ran silently as each chunk's all but last.
    (A count above one chunk's layers is each chunk's all but last, as documented; plan's pins
    rely on that.)"""
    if spec.layers is None:
        return
    try:
        layout = find_layers(trace)
    except TraceError:
        return  # offload() names the trace's missing layers
    total = sum(len(c) for c in _chunks(layout, frozenset()))
    if spec.layers >= total:
        raise ConfigError(f"--offload-activations {spec_text}: the model has {total} transformer layer"
                          f"{'s' if total != 1 else ''}, and Megatron-Core offloads fewer than it has (give at most "
                          f"{max(total - 1, 1)}, or a fraction of each model chunk's layers)")


def carry_offload(plan, off: Offloaded):
    """``plan`` (a tensor-parallel plan of the trace before the rewrite) for the rewritten trace:
    every original op at its time scale with its collectives, an inserted op at no compute and no
    collective, each copy from host sharded as its original."""
    index = off.new_index
    colls = tuple(replace(c, op=index[c.op]) for c in plan.collectives)
    shards = dict(plan.shard_divisor)
    for b, copy in off.renamed.items():
        if b in shards:
            shards[copy] = shards[b]
    scale = tuple(0.0 if n in off.copies else plan.time_scale[o] for n, o in enumerate(off.origin))
    share = getattr(plan, "share", ())
    return replace(plan, time_scale=scale, collectives=colls, shard_divisor=shards,
                   **({"share": tuple(share[o] for o in off.origin)} if share else {}))


def add_host_copy(b: CompositionState, copy: HostCopy, i: int, r: int, frac: float, label: str, tags: dict, reps,
                  last, host_waits: dict) -> None:
    """Op ``i``, a copy of activation offload, on every built GPU of a pipeline rank's program: a task on the GPU's host link in its direction (copy engines: no SMs), its buffers' bytes
    at the micro-batch's share. An offload starts when its layer's forward ends and holds back
    the compute after it; a reload starts with the compute before it and holds back the op that
    first reads what it brings."""
    nbytes = sum(b.size(k, frac) for k in copy.buffers)
    dur = nbytes / b.host_rate
    attrs = {**tags, "direction": copy.direction, "sms": 0}
    host = b.graph.meta.setdefault("host_held", {})  # GPU -> [held on host now, most held], in program order
    for rep, gpu in reps:
        held = host.setdefault(gpu, [0, 0])
        held[0] += nbytes if copy.waiter is None else -nbytes
        held[1] = max(held)
        start = [b.task[(*rep, copy.start_after, r)]] if copy.start_after is not None else list(last[rep])
        task = b.graph.add_tagged("memcpy", f"{label} gpu{gpu}", dur, (f"host{gpu}:{copy.direction}",), (gpu,), attrs,
                                  nbytes, start)
        b.seq.append(gpu, (task, (i,), r))
        b.task[(*rep, i, r)] = task  # a buffer it reads may arrive from another stage
        if copy.waiter is None:
            last[rep] = [*last[rep], task]
        else:
            host_waits[(rep, copy.waiter, r)] = task


__all__ = ["OFFLOAD", "RELOAD", "HostCopy", "OffloadSpec", "Offloaded", "add_host_copy", "carry_offload",
           "check_layer_count", "host_link_rate", "offload", "offload_on_plan"]
