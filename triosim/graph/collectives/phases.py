"""A collective's closed form as a sequence of phases (see :mod:`triosim.graph.collectives.cost`).

A phase has a number of latency-carrying steps on its critical path, a per-step latency and the
bytes every directed link carries during it; its links work in parallel, so the busiest one,
relative to its bandwidth, sets the pace.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ...hardware.platform import Platform


@dataclass(frozen=True)
class Phase:
    """Part of a collective whose links work in parallel: ``steps · step_latency + max over
    links (bytes / bandwidth)``, plus the call's ``base_latency`` on its first phase."""

    name: str
    steps: int
    step_latency: float
    link_load: dict[str, float]
    base_latency: float = 0.0
    # A pipelined chain of k chunks over h hops needs k + h − 1 chunk times for k chunks of
    # bytes: its links are busy only k / (k + h − 1) of the phase.
    fill: float = 1.0
    # A pipelined schedule whose time is its plan's longest path (the tree), not the formula.
    fixed_seconds: float | None = None
    # A phase scaled from a 1-byte plan (plans.plan): its links' distinct (1-byte load,
    # bandwidth) pairs, the payload and the link graph they were read from. Links with the same
    # pair pace alike, so the busiest is found over the pairs (a ring of 8,192 links has a few).
    scaled: tuple | None = field(default=None, compare=False, repr=False)

    def seconds(self, platform: Platform) -> float:
        if self.fixed_seconds is not None:
            return self.base_latency + self.fixed_seconds
        return self.base_latency + self.steps * self.step_latency + self.bandwidth_seconds(platform)

    def bandwidth_seconds(self, platform: Platform) -> float:
        if self.scaled is not None and self.scaled[2] is platform.graph:
            pairs, nbytes, _graph = self.scaled  # link_load[name] is unit load × nbytes: the same floats
            busiest = max(((u * nbytes) / bw for u, bw in pairs), default=0.0)
        else:
            busiest = max((b / platform.link_bandwidth(name) for name, b in self.link_load.items()), default=0.0)
        return busiest * self.fill

    def latency_seconds(self) -> float:
        return self.base_latency + self.steps * self.step_latency


def summed_load(phases: Iterable[Phase]) -> dict[str, float]:
    """The bytes each link carries over all of ``phases``."""
    load: dict[str, float] = {}
    for ph in phases:
        for link, b in ph.link_load.items():
            load[link] = load.get(link, 0.0) + b
    return load


def add_load(load: dict[str, float], route: tuple[str, ...], nbytes: float) -> None:
    """Count ``nbytes`` on every link of ``route``."""
    for name in route:
        load[name] = load.get(name, 0.0) + nbytes
