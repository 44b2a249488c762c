"""The ``nvls`` algorithm as a task-DAG fragment (closed form:
:mod:`triosim.graph.collectives.nvls_cost`): one ``collective`` task holding every GPU↔switch
link for the phase's closed-form time. NVLS has no point-to-point transfers to expand (the
switch reduces and multicasts), so ``expanded`` and ``macro`` build the same task.
"""

from __future__ import annotations

from typing import Any

from ...hardware.platform import Platform
from ...schedule.tasks import TaskGraph
from . import fragment, plans


def nvls(graph: TaskGraph, platform: Platform, group: tuple[int, ...], op: str, nbytes: int, label: str,
         pre: dict[int, list[int]], attrs: dict[str, Any]) -> dict[int, int]:
    """The NVLS phase as one task on the group's switch links; every GPU's sync follows it."""
    phases = plans.plan(platform, group, op, nbytes, "nvls")
    return fragment.phase_macros(graph, platform, group, op, nbytes, phases, label, pre, attrs)
