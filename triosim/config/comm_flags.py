"""``--link-efficiency``: the achieved share of nominal link bandwidth, for the whole platform or per
link class (``nvlink``, ``nic``, ``spine``); it replaces a topology file's ``efficiency`` values.

Forms: one number for every class (``0.8``), or ``class=number`` pairs (``nvlink=0.8,nic=0.9``);
classes not named keep the topology's value (a topology file's, else 1 for flag-built links).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError
from ..hardware.link_efficiency import LINK_CLASSES, check_efficiency, with_link_efficiency
from ..hardware.platform import Platform

FLAG = "--link-efficiency"


def add_comm_flags(group: argparse._ArgumentGroup) -> None:
    """Add ``--link-efficiency`` to the platform flags."""
    group.add_argument(FLAG, dest="link_efficiency", default=None, metavar="E|CLASS=E,...",
                       help="achieved share of nominal link bandwidth, 0 < E <= 1: one number for every link, "
                            "or per class (nvlink=0.8,nic=0.92,spine=0.92); default: the topology file's "
                            "efficiency (cluster files: measured NCCL bus bandwidth), 1 for flag-built links")


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where} must be a number with 0 < efficiency <= 1, got {text!r}") from None
    return check_efficiency(value, where)


def parse_link_efficiency(raw: Any) -> dict[str, float]:
    """The flag's value as {class: efficiency}; None gives {} (the topology's own values)."""
    if raw is None:
        return {}
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return dict.fromkeys(LINK_CLASSES, check_efficiency(raw, FLAG))
    text = str(raw).strip()
    if "=" not in text:
        return dict.fromkeys(LINK_CLASSES, _number(text, FLAG))
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep or name not in LINK_CLASSES:
            raise ConfigError(f"{FLAG}: {part.strip()!r} is not CLASS=NUMBER with CLASS one of "
                              f"{', '.join(LINK_CLASSES)}")
        if name in out:
            raise ConfigError(f"{FLAG}: class {name!r} given twice")
        out[name] = _number(value.strip(), f"{FLAG} {name}")
    return out


def apply_link_efficiency(platform: Platform, raw: Any, reference_compat: bool = False) -> Platform:
    """``platform`` with the flag's efficiencies (unchanged when the flag is not given)."""
    efficiency = parse_link_efficiency(raw)
    if efficiency and reference_compat:
        raise ConfigError(f"{FLAG} cannot be combined with --reference-compat (the original's links run at "
                          "their nominal rate)")
    return with_link_efficiency(platform, efficiency)


__all__ = ["FLAG", "add_comm_flags", "apply_link_efficiency", "parse_link_efficiency"]
