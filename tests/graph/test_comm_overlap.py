"""--tp-comm-overlap (triosim/graph/tensor/comm_overlap.py): the ring-exchange all-gather and the
pipelined reduce-scatter against their closed forms, exact on the schedule, each with the planted
bug it catches; the bulk overlaps' order; representatives equal the exact build."""

from __future__ import annotations

import tempfile
from dataclasses import replace

import pytest

from triosim import build_platform, load_trace
from triosim.graph import build_graph
from triosim.graph.strategy import Strategy
from triosim.graph.tensor import comm_overlap
from triosim.graph.tensor.comm_overlap import PIPELINE_SPLITS, Part
from triosim.schedule.list_scheduler import schedule
from triosim.trace.synthetic_transformer import SyntheticTransformer, write_synthetic_transformer

TP = 4


def _trace():
    model = SyntheticTransformer(layers=1, batch_size=2, seq_len=64, hidden=64, heads=4, seed=3,
                                 min_us=200.0, max_us=400.0)
    with tempfile.TemporaryDirectory() as tmp:
        return load_trace(write_synthetic_transformer(tmp, model), batch_size=model.batch_size)


def _run(gbps: float, exact: bool = False, overlap: bool = True):
    platform = build_platform(TP, ptp_bandwidth_gbps=gbps, topology="switch", link_latency_us=0.0)
    g = build_graph(_trace(), platform, Strategy(tp=TP, sequence_parallel=True, tp_comm_overlap=overlap, exact=exact))
    return g, schedule(g)


def _ring(g, s):
    """The first forward ring exchange on GPU 0: (start of chunk 0, GEMM seconds, step seconds,
    end of the last chunk)."""
    chunks = [t for t in range(len(g)) if g.kind[t] == "compute" and 0 in g.devices[t]
              and (g.attrs[t] or {}).get("chunk") is not None and g.attrs[t]["stage"] == "forward"
              and "reducescatter" not in g.label[t] and " .. " in g.label[t]][:TP]
    steps = [t for t in range(len(g)) if g.kind[t] == "transfer" and "allgather" in g.label[t]
             and " step" in g.label[t]][:TP - 1]
    assert len(chunks) == TP and len(steps) == TP - 1
    gemm = sum(g.duration[t] for t in chunks)
    step = g.duration[steps[0]]
    assert all(g.duration[t] == step for t in steps)
    return s.start[chunks[0]], gemm, step, s.end[chunks[-1]]


def _ring_closed_form_holds(g, s) -> bool:
    t0, gemm, step, end = _ring(g, s)
    return end == pytest.approx(t0 + max(gemm, (TP - 1) * step + gemm / TP), rel=1e-12, abs=0)


def test_a_fully_hidden_ring_exchange_all_gather_exposes_nothing():
    # TE's ring exchange computes on the rank's own shard first: while a step (one shard's send)
    # takes less than a GEMM chunk, the column GEMMs end exactly their own time after the norm.
    g, s = _run(gbps=1000.0)
    t0, gemm, step, end = _ring(g, s)
    assert step < gemm / TP
    assert end == pytest.approx(t0 + gemm, rel=1e-12, abs=0)


def test_a_bandwidth_bound_ring_exchange_exposes_its_steps_beyond_the_chunks():
    g, s = _run(gbps=0.05)
    t0, gemm, step, end = _ring(g, s)
    assert step > gemm / TP
    assert end == pytest.approx(t0 + (TP - 1) * step + gemm / TP, rel=1e-12, abs=0)  # (n−1)·(C − G/n) exposed
    assert _ring_closed_form_holds(g, s)


def test_ring_closed_form_catches_a_planted_bug(monkeypatch):
    """Bug: chunk k waits for step k − 1 (the shard before its own)."""
    real = comm_overlap.TpOverlapPlan.pieces

    def early(self, segments):
        return [(seg, replace(p, step=max(0, p.step - 1)) if p is not None and p.ring is not None else p)
                for seg, p in real(self, segments)]

    monkeypatch.setattr(comm_overlap.TpOverlapPlan, "pieces", early)
    assert not _ring_closed_form_holds(*_run(gbps=0.05))


def _pipelined_rs(g, s):
    """The first forward row GEMM's chunks on GPU 0 and its reduce-scatter chunks: (GEMM end,
    start of the op after it, one chunk's reduce-scatter seconds, bytes of all chunks, bytes of
    the whole reduce-scatter without overlap)."""
    pieces = [t for t in range(len(g)) if g.kind[t] == "compute" and 0 in g.devices[t]
              and (g.attrs[t] or {}).get("chunk") is not None and " .. " not in g.label[t]
              and g.attrs[t]["stage"] == "forward"][:PIPELINE_SPLITS]
    row = g.attrs[pieces[0]]["op"]
    rs = [t for t in range(len(g)) if g.kind[t] == "collective" and g.attrs[t].get("op_index") == row
          and g.attrs[t].get("microbatch") == 0]
    nxt = min(t for t in range(pieces[-1] + 1, len(g)) if g.kind[t] == "compute" and 0 in g.devices[t])
    return s.end[pieces[-1]], s.start[nxt], g.duration[rs[-1]], sum(g.nbytes[t] for t in rs), row


def test_a_fully_hidden_pipelined_reduce_scatter_exposes_exactly_one_chunk():
    g, s = _run(gbps=1000.0)
    gemm_end, next_start, chunk_s, nbytes, row = _pipelined_rs(g, s)
    plain, _ = _run(gbps=1000.0, overlap=False)
    whole = [t for t in range(len(plain)) if plain.kind[t] == "collective" and plain.attrs[t].get("op_index") == row
             and plain.attrs[t].get("microbatch") == 0]
    assert nbytes == plain.nbytes[whole[0]]  # the chunks carry the reduce-scatter once
    assert next_start - gemm_end == pytest.approx(chunk_s, rel=1e-9, abs=0)


def test_pipelined_reduce_scatter_catches_a_planted_bug(monkeypatch):
    """Bug: the row GEMM runs whole and its reduce-scatter chunks follow it (no pipelining)."""
    real = comm_overlap.TpOverlapPlan.pieces

    def unpipelined(self, segments):
        out = []
        for seg, p in real(self, segments):
            if p is not None and p.rs is not None:
                if p.chunk == 0:
                    out.append((seg, Part(1.0, last=False)))
                out.append((seg, Part(0.0, rs=p.rs, chunk=p.chunk, first=False, last=p.last)))
            else:
                out.append((seg, p))
        return out

    monkeypatch.setattr(comm_overlap.TpOverlapPlan, "pieces", unpipelined)
    g, s = _run(gbps=1000.0)
    gemm_end, next_start, chunk_s, _, _ = _pipelined_rs(g, s)
    assert next_start - gemm_end != pytest.approx(chunk_s, rel=1e-9, abs=0)


def test_bulk_overlaps_run_dgrads_beside_the_regather_and_wgrads_beside_the_reduce_scatter():
    g, s = _run(gbps=0.5)
    halves = [t for t in range(len(g)) if g.kind[t] == "compute" and 0 in g.devices[t] and (g.attrs[t] or {}).get("half")]
    dgrad = [t for t in halves if g.attrs[t]["half"] == "dgrad"]
    wgrad = [t for t in halves if g.attrs[t]["half"] == "wgrad"]
    assert dgrad and len(dgrad) == len(wgrad)
    first = dgrad[0]  # the block whose backward runs first: its column linears' halves
    block_d = [t for t in dgrad if t < wgrad[0]]
    block_w = wgrad[:len(block_d)]
    regather = max(t for t in range(first) if g.kind[t] == "collective" and "allgather" in g.label[t])
    reduce = min(t for t in range(block_d[-1], len(g)) if g.kind[t] == "collective" and "reducescatter" in g.label[t])
    assert s.start[first] < s.end[regather]  # a dgrad runs beside the re-gather
    assert all(s.start[w] >= s.end[regather] for w in block_w)  # a wgrad needs the gathered input
    assert max(s.end[t] for t in block_d) <= min(s.start[t] for t in block_w)  # dgrads first, as TE's fused GEMMs
    assert s.start[block_w[0]] < s.end[reduce]  # the wgrads run beside the input gradient's reduce-scatter


@pytest.mark.parametrize("gbps", [1000.0, 0.05])
def test_representatives_equal_the_exact_build(gbps):
    assert _run(gbps, exact=True)[1].makespan == pytest.approx(_run(gbps, exact=False)[1].makespan, rel=1e-12)


def test_tp_comm_overlap_needs_sequence_parallelism():
    from triosim.errors import ConfigError

    with pytest.raises(ConfigError, match="--tp-comm-overlap needs --sequence-parallel"):
        Strategy(tp=2, tp_comm_overlap=True).validate(2)


@pytest.mark.parametrize("cp", [1, 2])
def test_the_chunked_collectives_carry_the_bytes_of_the_unchunked_ones(cp):
    """The overlap changes when TP bytes move, never how many: under context parallelism a rank's
    collectives carry its 1/cp of the tokens, chunked or not (the pipelined reduce-scatter's
    chunks once carried the whole sequence's)."""
    platform = build_platform(TP * cp, ptp_bandwidth_gbps=100.0, topology="switch", link_latency_us=0.0)

    def tp_bytes(overlap: bool) -> int:
        g = build_graph(_trace(), platform, Strategy(tp=TP, cp=cp, sequence_parallel=True, tp_comm_overlap=overlap))
        return g.meta["hybrid"]["collectives_dp0_tp0"]["tp"]["payload_bytes"]

    assert tp_bytes(True) == tp_bytes(False)
