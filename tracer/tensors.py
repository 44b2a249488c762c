"""Tensor identity across one training step: lifetimes, views and storage.

Execution-trace tensor ids are per tensor *object* and are recycled once an object dies, and a
saved tensor comes back in backward as a new object over the same storage.  The tracker turns the
raw ``(tensor_id, storage_id)`` pairs, visited op by op in call order, into stable identities:

* a *generation* is one lifetime of one tensor.  Its id is the ET tensor id the first time that id
  is seen, and a fresh id (above every ET id) when an op creates a new tensor under a recycled id;
* a *full alias* (a view with the same elements: ``view``, ``t``, ``flatten``, ``detach``, a saved
  tensor unpacked in backward, ...) resolves to the generation it aliases, so a consumer of the
  view reads the producer's tensor;
* a *partial view* (a slice, an ``expand``) keeps its own id and size but records the tensor that
  owns its storage (its *root*), written as ``TensorStorgeid``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .etrace import TensorRef


@dataclass
class OpTensors:
    """What one top-level op touched: external reads, tensors it made, its declared arguments."""

    touched: set[int] = field(default_factory=set)  # ET tensor ids seen inside this op
    internal: set[int] = field(default_factory=set)  # generations made inside this op
    produced: list[int] = field(default_factory=list)  # canonical generations written, in order
    reads: dict[int, tuple[str, bool]] = field(default_factory=dict)  # gen -> (category, strong)
    read_order: list[int] = field(default_factory=list)  # external reads, first-read order
    read_roots: set[int] = field(default_factory=set)
    declared_inputs: list[tuple[int, str]] = field(default_factory=list)  # top node's arguments
    declared_outputs: list[int] = field(default_factory=list)
    authoritative: set[int] = field(default_factory=set)  # gens whose info came from the top node

    def note_read(self, gen: int, category: str, strong: bool) -> None:
        prev = self.reads.get(gen)
        if prev is None:
            self.reads[gen] = (category, strong)
            self.read_order.append(gen)
        elif strong and not prev[1]:
            self.reads[gen] = (category, True)


@dataclass
class TensorTracker:
    """Maps ET tensor references to generations; see the module docstring."""

    next_id: int
    current: dict[int, int] = field(default_factory=dict)  # ET tensor id -> live generation
    info: dict[int, TensorRef] = field(default_factory=dict)  # generation -> size/shape/storage
    canon: dict[int, int] = field(default_factory=dict)  # generation -> generation it aliases
    root: dict[int, int] = field(default_factory=dict)  # generation -> owner of its storage
    storage_owner: dict[int, int] = field(default_factory=dict)  # ET storage id -> root gen

    def _new_gen(self, ref: TensorRef) -> int:
        if ref.id in self.info or ref.id in self.current:
            gen = self.next_id
            self.next_id += 1
        else:
            gen = ref.id
        self.info[gen] = ref
        self.current[ref.id] = gen
        return gen

    @staticmethod
    def _same_elements(a: TensorRef, b: TensorRef) -> bool:
        return a.numel == b.numel and a.offset == b.offset and a.itemsize == b.itemsize

    def read(self, ref: TensorRef, op: OpTensors) -> int:
        """Resolve a tensor an op reads; returns its canonical generation."""
        gen = self.current.get(ref.id)
        if gen is None or (ref.id not in op.touched and not self._consistent(gen, ref)):
            gen = self._new_gen(ref)
            # 0-dim tensors are skipped: freshly wrapped numbers often land on recycled
            # storage ids of dead scalars.
            owner = self.storage_owner.get(ref.storage) if ref.storage and ref.shape else None
            if owner is not None and self.info[owner].device == ref.device:
                # A new object over live storage: a saved tensor or a view made without a
                # recorded op.  Same elements -> the same tensor; otherwise a partial view.
                self.root[gen] = self.root[owner]
                self.canon[gen] = (self.canon[owner]
                                   if self._same_elements(ref, self.info[owner]) else gen)
            else:
                self.root[gen] = gen
                self.canon[gen] = gen
                if ref.storage:
                    self.storage_owner[ref.storage] = gen
        op.touched.add(ref.id)
        op.read_roots.add(self.root[gen])
        return self.canon[gen]

    def _consistent(self, gen: int, ref: TensorRef) -> bool:
        known = self.info[gen]
        return known.storage == ref.storage and known.numel == ref.numel

    def _recycled_in_op(self, gen: int, ref: TensorRef, op: OpTensors) -> bool:
        """Whether a tensor an op writes under an id it saw earlier is a new object under a
        recycled id rather than the earlier tensor written again: the earlier one is (a view of)
        a tensor from outside the op and the write lands on other storage.  E.g. cudnn_batch_norm
        (CUDA) views the weight, frees the view and then allocates its reserve tensor, which the
        observer may give the view's id: without this the op would write the weight."""
        return self.canon[gen] not in op.internal and ref.storage != self.info[gen].storage

    def produce(self, ref: TensorRef, op: OpTensors, authoritative: bool) -> int:
        """Record a tensor an op writes (new tensor, or in place); returns its canonical gen."""
        gen = self.current.get(ref.id)
        if gen is not None and ref.id in op.touched and not self._recycled_in_op(gen, ref, op):
            # Written again inside the same op (in place, or a nested call): same generation.
            if self.canon[gen] == gen and (authoritative or gen not in op.authoritative):
                self.info[gen] = ref
        else:
            gen = self._new_gen(ref)
            self.canon[gen] = gen
            owner = self.storage_owner.get(ref.storage) if ref.storage else None
            if owner is not None and self.root[owner] in op.read_roots:
                self.root[gen] = self.root[owner]  # the op handed back (a view of) an input
            else:
                self.root[gen] = gen
                if ref.storage:
                    self.storage_owner[ref.storage] = gen
            op.internal.add(gen)
        if authoritative:
            op.authoritative.add(gen)
        op.touched.add(ref.id)
        canonical = self.canon[gen]
        op.internal.add(canonical)
        if canonical not in op.produced:
            op.produced.append(canonical)
        return canonical

    def alias(self, ref: TensorRef, base: int, op: OpTensors) -> int:
        """Record the output of a view op over generation ``base``; returns its canonical gen."""
        if ref.id in op.touched and ref.id in self.current:
            return self.canon[self.current[ref.id]]
        gen = self._new_gen(ref)
        base_info = self.info[base]
        self.canon[gen] = self.canon[base] if self._same_elements(ref, base_info) else gen
        self.root[gen] = self.root[base]
        op.touched.add(ref.id)
        op.internal.add(gen)
        return self.canon[gen]

    def storage_key(self, gen: int) -> int:
        return self.root.get(gen, gen)
