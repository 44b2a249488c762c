"""TpDone answers every lookup as the dict it replaces: entries set directly, and the entries of
blocks added from a template as if each block had been written in with dict.update."""

from __future__ import annotations

from triosim.graph.tp_done import TpDone

from .lookups import assert_reads_as


def _both():
    lazy, plain = TpDone(), {}
    first = lazy.template([(3, 0, 1), (5, 0, 4)])
    second = lazy.template([(5, 0, 2), (8, 0, 0)])  # op 5 in two templates: the block added last wins
    for number, entries, r, base in ((first, [(3, 0, 1), (5, 0, 4)], 0, 100), (first, [(3, 0, 1), (5, 0, 4)], 1, 200),
                                     (second, [(5, 0, 2), (8, 0, 0)], 1, 300)):
        lazy.add_block(number, r, base)
        plain.update({(op, r, 0): {gpu: base + k} for op, gpu, k in entries})
    for key, value in (((3, 2, 0), {0: 7}), ((3, 0, 1), {4: 9})):  # set directly (built op by op)
        lazy[key] = plain[key] = value
    return lazy, plain


def test_lookups_equal_the_dict_written_block_by_block() -> None:
    lazy, plain = _both()
    assert_reads_as(lazy, plain, [(op, r, d) for op in (3, 5, 8, 9) for r in (0, 1, 2) for d in (0, 1)])
    assert lazy[(5, 1, 0)] == {0: 302}  # the later block's
    assert len(lazy) == 2 and list(lazy) == [(3, 2, 0), (3, 0, 1)]  # only what was set directly
