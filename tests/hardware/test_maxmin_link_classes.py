"""Max-min rates computed over classes of alike links equal, to the bit, progressive filling
over every link (the form written link by link below): the same rates for flows that load many
links alike, links loaded differently, repeated links and flows capped by their solo rate."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from triosim.hardware.flow_network import Flow, SeenComponents, maxmin_rates


def filling_link_by_link(flows: list[Flow]) -> None:
    """Progressive filling over every link: demands summed in flow order, then coefficient order."""
    residual: dict[int, float] = {}
    on_link: dict[int, list[Flow]] = {}
    for f in flows:
        f.rate = 0.0
        for r, _c in f.coefs:
            residual[r] = 1.0
            on_link.setdefault(r, []).append(f)
    unfrozen = {id(f): f for f in flows}
    level = 0.0
    while unfrozen:
        demand: dict[int, float] = {}
        for f in unfrozen.values():
            for r, c in f.coefs:
                demand[r] = demand.get(r, 0.0) + c
        step = min(f.solo_rate - level for f in unfrozen.values())
        for r, d in demand.items():
            if d > 0:
                step = min(step, residual[r] / d)
        step = max(step, 0.0)
        level += step
        for r, d in demand.items():
            residual[r] -= step * d
        frozen = [k for k, f in unfrozen.items() if f.solo_rate - level <= 1e-12 * f.solo_rate]
        for r, d in demand.items():
            if d > 0 and residual[r] <= 1e-12:
                frozen.extend(id(f) for f in on_link[r] if id(f) in unfrozen)
        if not frozen:
            frozen = list(unfrozen)
        for k in set(frozen):
            unfrozen.pop(k).rate = level


# A few bandwidths and byte shares, so that links often carry the same coefficients (the
# classes), and sometimes not.
COEF = st.sampled_from([1 / 50e9, 1 / 100e9, 1 / 450e9, 0.37 / 50e9, 0.0, 3 / 7e11])


@st.composite
def flow_sets(draw) -> list[tuple[float, list[tuple[int, float]]]]:
    n = draw(st.integers(2, 7))
    out = []
    for _ in range(n):
        links = draw(st.lists(st.integers(0, 11), min_size=1, max_size=9))
        coefs = [(r, draw(COEF)) for r in links]
        solo = draw(st.sampled_from([10e9, 45e9, 50e9, 1e12, 333e9]))
        out.append((solo, coefs))
    return out


def _flows(spec) -> list[Flow]:
    return [Flow(task=k, remaining=1e6, solo_rate=solo, coefs=list(coefs)) for k, (solo, coefs) in enumerate(spec)]


@settings(max_examples=400, deadline=None)
@given(flow_sets())
def test_rates_over_link_classes_equal_filling_link_by_link(spec) -> None:
    got, want = _flows(spec), _flows(spec)
    maxmin_rates(got)
    filling_link_by_link(want)
    assert [f.rate for f in got] == [f.rate for f in want]


def test_a_collective_and_a_transfer_sharing_one_of_its_links() -> None:
    # A ring's flow loads 8 links alike; a transfer shares one of them at half the bandwidth.
    ring = [(r, 1 / 100e9) for r in range(8)]
    spec = [(100e9, ring), (50e9, [(3, 1 / 100e9), (20, 1 / 50e9)])]
    got, want = _flows(spec), _flows(spec)
    maxmin_rates(got)
    filling_link_by_link(want)
    assert [f.rate for f in got] == [f.rate for f in want]
    assert got[0].rate == got[1].rate == 50e9  # the shared link split evenly


@settings(max_examples=150, deadline=None)
@given(st.lists(flow_sets(), min_size=1, max_size=6), st.lists(st.integers(0, 5), min_size=1, max_size=30),
       st.integers(0, 40))
def test_components_seen_before_get_the_rates_they_got(specs, order, shift) -> None:
    """Components met again (the same coefficient lists, or the same shape on other links, or
    the same links with other solo rates) get maxmin_rates' numbers."""
    seen = SeenComponents(maxmin_rates)
    lists = [[list(coefs) for _solo, coefs in spec] for spec in specs]  # shared, as the scheduler's memo shares them
    for k in order:
        spec = specs[k % len(specs)]
        for variant in range(3):
            if variant == 0:  # the same lists
                flows = [Flow(task=j, remaining=1.0, solo_rate=solo, coefs=lists[k % len(specs)][j])
                         for j, (solo, _c) in enumerate(spec)]
            elif variant == 1:  # the same shape on other links
                flows = [Flow(task=j, remaining=1.0, solo_rate=solo, coefs=[(r + shift, c) for r, c in coefs])
                         for j, (solo, coefs) in enumerate(spec)]
            else:  # the same lists, another solo rate for the first flow
                flows = [Flow(task=j, remaining=1.0, solo_rate=solo * (2.0 if j == 0 else 1.0),
                              coefs=lists[k % len(specs)][j]) for j, (solo, _c) in enumerate(spec)]
            want = [Flow(task=f.task, remaining=1.0, solo_rate=f.solo_rate, coefs=list(f.coefs)) for f in flows]
            seen(flows)
            filling_link_by_link(want)
            assert [f.rate for f in flows] == [f.rate for f in want]
