"""A trace's tensors kept as columns: the ``{ID: Tensor}`` mapping of a large trace.

A 200k-op trace has half a million tensors, and making a ``Tensor`` object and a dictionary
entry for each took a fifth of loading it, though a single-GPU run only ever reads a few whole
columns (sizes, storages, categories, element counts). :class:`TensorTable` is a read-only
mapping from tensor ID to :class:`~triosim.trace.model.Tensor` that keeps those columns and makes the
objects only when asked: all of them, in one pass, on the first lookup by ID or walk over the
values (what the other strategies do), or one by one by position (:meth:`TensorTable.at`). It
equals the dictionary the row-by-row checker builds, entry for entry and in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cached_property, partial

import numpy as np

from .model import Tensor, parse_shape


class TensorTable(Mapping):
    """Tensor ``ids[c]`` has ``nbytes[c]`` bytes (``numel[c]`` elements of ``each_byte[c]``),
    category ``categories[c]``, storage ``storages[c]`` and shape text ``shape_texts[c]``; ``c``
    is its position in the mapping's order."""

    def __init__(self, ids: list[str], nbytes: np.ndarray, numel: np.ndarray, each_byte: np.ndarray,
                 categories: list[str], storages: list[str], shape_texts: list[str]) -> None:
        self.ids, self.nbytes, self.numel, self.each_byte = ids, nbytes, numel, each_byte
        self.categories, self.storages, self.shape_texts = categories, storages, shape_texts

    @cached_property
    def shapes(self) -> list[tuple[int, ...] | None]:
        """Each tensor's shape, parsed from its text as the checker parses it."""
        parsed = {text: parse_shape(text) for text in set(self.shape_texts)}
        return list(map(parsed.__getitem__, self.shape_texts))

    @cached_property
    def _tensors(self) -> dict[str, Tensor]:
        objs = map(partial(tuple.__new__, Tensor), zip(self.ids, self.nbytes.tolist(), self.numel.tolist(),
                                                       self.each_byte.tolist(), self.categories, self.storages,
                                                       self.shapes))
        return dict(zip(self.ids, objs))

    def at(self, code: int) -> Tensor:
        """The tensor at position ``code``, without making the others."""
        shapes = vars(self).get("shapes")
        return Tensor(self.ids[code], int(self.nbytes[code]), int(self.numel[code]), int(self.each_byte[code]),
                      self.categories[code], self.storages[code],
                      shapes[code] if shapes is not None else parse_shape(self.shape_texts[code]))

    def __getitem__(self, tensor_id: str) -> Tensor:
        return self._tensors[tensor_id]

    def __contains__(self, tensor_id: object) -> bool:
        return tensor_id in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def values(self):
        return self._tensors.values()

    def items(self):
        return self._tensors.items()

    def __repr__(self) -> str:
        return f"TensorTable({self._tensors!r})"


def column_or_none(tensors: Mapping, name: str):
    """The column ``name`` of a :class:`TensorTable`, or None for any other mapping (the caller
    then reads the tensors one by one)."""
    return getattr(tensors, name) if isinstance(tensors, TensorTable) else None


__all__ = ["TensorTable", "column_or_none"]
