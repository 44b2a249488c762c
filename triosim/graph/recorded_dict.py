"""A dict some of whose entries are kept as records and found when looked up.

The builders' lookups (which task ran an op, which task completes a TP collective) get entries
by the million on large meshes, most of them alike: a replayed block's, a column of 4,096
replicas'. :class:`RecordedDict` is the dict they read, with those entries answered by
:meth:`~RecordedDict._recorded` instead of stored; ``[]``, :meth:`get` and ``in`` see both kinds,
iteration and ``len`` only the entries set directly.
"""

from __future__ import annotations

from typing import Any


class RecordedDict(dict):
    """A dict whose missing keys may be answered by :meth:`_recorded` (None: not there)."""

    def _recorded(self, key: Any) -> Any:
        raise NotImplementedError

    def __missing__(self, key: Any) -> Any:
        hit = self._recorded(key)
        if hit is None:
            raise KeyError(key)
        return hit

    def get(self, key: Any, default: Any = None) -> Any:
        hit = dict.get(self, key)
        if hit is None:
            hit = self._recorded(key)
        return default if hit is None else hit

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self._recorded(key) is not None


__all__ = ["RecordedDict"]
