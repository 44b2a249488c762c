"""Which algorithm (and protocol) runs a collective: the one asked for when it can run the
operation on the group, else its fallback; ``auto`` picks the fastest closed form, and with the
protocol ``auto`` the fastest (protocol, algorithm) pair, as NCCL's tuner picks both. The
tree's pipeline is timed only when a bound on it does not already lose to the ring, so ``auto``
costs about what the winner forced costs.
"""

from __future__ import annotations

from ...hardware.platform import Platform
from .hierarchical_cost import hierarchical_split
from .nvls_cost import nvls_supported
from .plans import plan_seconds
from .protocols import wire_bytes
from .tree_cost import tree_lower_bound

ALGOS = ("ring", "one-way-ring", "tree", "hierarchical", "direct", "nvls")
# "auto" tries the protocols in this order; a tie keeps the earlier one.
PROTOCOL_ORDER = ("simple", "ll128", "ll")
# "auto" leaves out the direct algorithm above this group size: its plan has N² transfers.
DIRECT_AUTO_LIMIT = 64


def supported(platform: Platform, group: tuple[int, ...], op: str, algo: str) -> bool:
    """Whether ``algo`` can run ``op`` on ``group``."""
    if op == "all_to_all":
        return algo == "direct"
    if algo == "tree":
        return op == "all_reduce"
    if algo == "hierarchical":
        return hierarchical_split(platform, group) is not None
    if algo == "nvls":  # one SHARP switch under every GPU, Simple protocol
        return nvls_supported(platform, group, op)
    return algo in ALGOS


def fallback(platform: Platform, group: tuple[int, ...], op: str, algo: str) -> str:
    """The algorithm actually run when ``algo`` cannot run ``op`` on this group."""
    if supported(platform, group, op, algo):
        return algo
    return "direct" if op == "all_to_all" else "ring"


def candidates(platform: Platform, group: tuple[int, ...], op: str) -> list[str]:
    """The algorithms ``auto`` compares, simplest first."""
    out = [a for a in ("ring", "tree", "hierarchical", "direct", "nvls") if supported(platform, group, op, a)]
    if len(group) > DIRECT_AUTO_LIMIT and op != "all_to_all":
        out = [a for a in out if a != "direct"]
    return out


def resolve_algo(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str | None = None,
                 root: int | None = None) -> str:
    """``algo`` (default: the platform's) made concrete: ``auto`` picks the fastest closed form
    under the platform's protocol (``nbytes``: the payload)."""
    return _resolve_algo(platform, group, op, nbytes, algo, root)[0]


def _resolve_algo(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str | None,
                  root: int | None) -> tuple[str, float | None]:
    """(algorithm, its time when ``auto`` computed it)."""
    algo = platform.collective_algo if algo is None else algo
    if algo == "auto":
        names = candidates(platform, group, op)
        # The tree's time is its pipeline's longest path, a walk of every chunk transfer: it is
        # timed last, and only when a bound it cannot beat does not already lose to the best of
        # the others (then it could not have won; the choice is the same).
        times: dict[str, float] = {}
        for a in sorted(names, key=lambda a: a == "tree"):
            wire = wire_bytes(platform, a, group, op, nbytes)
            if a == "tree" and times:
                beat = min(times.values()) * (1 - 1e-12) / (1 - 1e-9)  # the bound's rounding is far under 1e-9
                if tree_lower_bound(platform, group, wire, beat) >= beat:
                    continue
            times[a] = plan_seconds(platform, group, op, wire, a, root)
        best = None
        for a in names:  # in the candidates' order: ties keep the earlier (simpler) algorithm
            if a in times and (best is None or times[a] < best[0] * (1 - 1e-12)):
                best = (times[a], a)
        return (best[1], best[0]) if best else ("ring", None)
    if algo not in ALGOS:
        raise ValueError(f"unknown collective algorithm {algo!r}; choose from auto, {', '.join(ALGOS)}")
    return fallback(platform, group, op, algo), None


def resolve(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str | None = None,
            root: int | None = None) -> tuple[Platform, str]:
    """(the platform with the collective's protocol, the algorithm): with the protocol ``auto``,
    the fastest (protocol, algorithm) pair by the closed forms, as NCCL's tuner picks both.
    Kept per platform: a run's collectives repeat a few shapes (an exact case-3 run: 108 calls,
    15 distinct, each timing a 4,096-GPU tree)."""
    key = ("resolved", group, op, nbytes, algo, root)
    hit = platform._plans.get(key)
    if hit is None:
        hit = platform._plans[key] = _resolve(platform, group, op, nbytes, algo, root)
    return hit


def _resolve(platform: Platform, group: tuple[int, ...], op: str, nbytes: float, algo: str | None,
             root: int | None) -> tuple[Platform, str]:
    if platform.collective_protocol != "auto":
        return platform, resolve_algo(platform, group, op, nbytes, algo, root)
    best = None
    for proto in PROTOCOL_ORDER:
        variant = platform.protocol_variant(proto)
        a, t = _resolve_algo(variant, group, op, nbytes, algo, root)
        if t is None:
            t = plan_seconds(variant, group, op, wire_bytes(variant, a, group, op, nbytes), a, root)
        if best is None or t < best[0] * (1 - 1e-12):
            best = (t, variant, a)
    return best[1], best[2]
