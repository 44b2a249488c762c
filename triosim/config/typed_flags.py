"""Which flags were typed on the command line: argparse calls an action only for an option that
is present, so a flag's default, or a ``--config`` value, leaves no mark."""

from __future__ import annotations

import argparse
from typing import Any

# The namespace attribute holding the dests of the flags typed on the command line (argparse
# calls an action only for an option that is present; a default, or a --config value, is not).
TYPED = "typed_flags"


class StoreTyped(argparse.Action):
    """Store the value, as argparse's plain ``store``, and remember that the flag was typed.

    ``-case 0 --dp 2`` is a contradiction while ``--dp 2`` alone is not, though both leave 0 in
    ``args.case``: only this mark tells them apart."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, TYPED, frozenset(getattr(namespace, TYPED, frozenset())) | {self.dest})


def typed(args: argparse.Namespace, dest: str) -> bool:
    """Whether flag ``dest`` was typed on the command line (False for configure() and sweeps)."""
    return dest in getattr(args, TYPED, ())


__all__ = ["TYPED", "StoreTyped", "typed"]
