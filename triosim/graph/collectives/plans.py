"""The phases of a collective under a given (resolved, supported) algorithm, and their time.

Every algorithm but the tree is linear in the payload, so its plan is built once for one byte
per group, operation, algorithm and root (kept on the platform: a DDP run calls the same
collective once per bucket) and scaled; the tree's pipeline is timed per payload size.
"""

from __future__ import annotations

from dataclasses import replace

from ...hardware.platform import Platform
from .direct_cost import direct_phases
from .hierarchical_cost import hierarchical_phases
from .nvls_cost import nvls_phases
from .phases import Phase
from .protocols import base_latency_s, latency_family
from .ring_cost import one_way_ring_phases, ring_phases
from .tree_cost import tree_phases, tree_seconds


def _build_phases(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str,
                  root: int | None) -> list[Phase]:
    if algo == "one-way-ring":
        return one_way_ring_phases(platform, group, op, nbytes, root)
    if algo == "ring":
        return ring_phases(platform, group, op, nbytes, root)
    if algo == "direct":
        return direct_phases(platform, group, op, nbytes, root)
    if algo == "nvls":
        return nvls_phases(platform, group, op, nbytes)
    return hierarchical_phases(platform, group, op, nbytes, root)


def _unit(platform: Platform, group: tuple[int, ...], op: str, algo: str, root: int | None,
          ) -> tuple[list[Phase], list[tuple[float, float]]]:
    """The phases for a 1-byte payload and, per phase, (latency s, bandwidth s per byte).

    Every plan is linear in the payload, so it is computed once per group, operation,
    algorithm and root and scaled (a DDP run calls the same collective once per bucket).
    """
    key = (group, op, algo, root, platform.collective_latency_us)
    hit = platform._plans.get(key)
    if hit is None:
        canonical = platform.canonical_group(group) if root is None else group
        if canonical != group and (rename := platform.link_renaming(canonical, group)) is not None:
            # The canonical group's plan with its links renamed: the same loads in the same order
            # as this group's own plan, and the same times (every stage's data-parallel group of
            # a cluster file is planned once).
            phases, times = _unit(platform, canonical, op, algo, root)
            phases = [replace(p, link_load={rename(x): b for x, b in p.link_load.items()}) for p in phases]
            hit = (phases, times)
        else:
            phases = _build_phases(platform, group, op, 1.0, algo, root)
            hit = (phases, [(p.latency_seconds(), p.bandwidth_seconds(platform)) for p in phases])
        platform._plans[key] = hit
    return hit


def plan(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str,
         root: int | None = None) -> list[Phase]:
    """The phases of ``op`` with ``algo`` (already resolved and supported); base latency on the first."""
    if algo == "tree":  # its pipeline's time is not linear in the payload; no per-call latency
        return tree_phases(platform, group, nbytes)
    unit, _times = _unit(platform, group, op, algo, root)
    pairs = _load_pairs(platform, (group, op, algo, root, platform.collective_latency_us), unit)
    phases = [Phase(p.name, p.steps, p.step_latency, _scaled(p.link_load, pp, nbytes), 0.0, p.fill,
                    scaled=(pp, nbytes, platform.graph))
              for p, pp in zip(unit, pairs)]
    base = base_latency_s(platform, latency_family(algo))
    if phases and base:
        first = phases[0]
        phases[0] = Phase(first.name, first.steps, first.step_latency, first.link_load, base, first.fill,
                          scaled=first.scaled)
    return phases


def _scaled(unit_load: dict[str, float], pairs: tuple[tuple[float, float], ...], nbytes: float) -> dict[str, float]:
    """``unit_load`` times ``nbytes``, link by link; where every link carries the same 1-byte
    load (a ring's links, ``pairs`` says), that one product for every link, in one pass."""
    if len({u for u, _bw in pairs}) == 1:
        return dict.fromkeys(unit_load, pairs[0][0] * nbytes)
    return {k: v * nbytes for k, v in unit_load.items()}


def _load_pairs(platform: Platform, key: tuple, unit: list[Phase]) -> list[tuple[tuple[float, float], ...]]:
    """Per phase of a 1-byte plan, its links' distinct (load, bandwidth) pairs (see Phase.scaled)."""
    hit = platform._plans.get(("pairs", key))
    if hit is None:
        hit = platform._plans[("pairs", key)] = [
            tuple(dict.fromkeys((v, platform.link_bandwidth(k)) for k, v in p.link_load.items())) for p in unit]
    return hit


def plan_seconds(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str,
                 root: int | None = None) -> float:
    """``sum(p.seconds(platform) for p in plan(...))`` without building the scaled phases."""
    if algo == "tree":
        return tree_seconds(platform, group, nbytes)
    if root is None and (group, op, algo, root, platform.collective_latency_us) not in platform._plans:
        # The time depends only on the links of the group's routes: found once per canonical
        # group (``auto`` times every algorithm on every stage's data-parallel group).
        group = platform.canonical_group(group)
    _unit_phases, times = _unit(platform, group, op, algo, root)
    base = base_latency_s(platform, latency_family(algo)) if times else 0.0
    return base + sum(lat + nbytes * per_byte for lat, per_byte in times)
