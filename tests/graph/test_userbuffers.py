"""--tp-comm-overlap-cfg (triosim/graph/tensor/userbuffers.py): Transformer Engine's defaults, a
table's updates and refusals; a GEMM keeping an SM margin runs N / (N - num_sm) of its time; the
ring-exchange reduce-scatter against its closed form; each with the planted bug it catches."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_capture import run as run_cli

from triosim import build_platform, load_trace
from triosim.compute.op_time_source import GpuTiming
from triosim.config import configure
from triosim.errors import ConfigError
from triosim.graph import build_graph
from triosim.graph.pipeline import rank_program
from triosim.graph.strategy import Strategy
from triosim.graph.tensor import userbuffers
from triosim.graph.tensor.userbuffers import DEFAULT_TABLE, UserbufferSetting, userbuffer_table
from triosim.hardware.device_db import get_device
from triosim.schedule.list_scheduler import schedule
from triosim.trace.synthetic_transformer import SyntheticTransformer, write_synthetic_transformer

TP = 4
REPO = Path(__file__).resolve().parents[2]
# the Llama 3.1 405B FP8 table of Megatron-Bridge's recipes (userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192)
RING_RS = {"proj_fprop": {"method": "ring_exchange", "num_sm": 1, "set_sm_margin": True},
           "fc2_fprop": {"method": "ring_exchange", "num_sm": 1, "set_sm_margin": True}}


def test_the_default_table_is_transformer_engines():
    # initialize_ub's get_default_config: ring exchange on 1 SM without a margin, the others on 16
    # SMs with one, the pipelined method in 4 chunks
    for name in ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad"):
        assert DEFAULT_TABLE[name] == UserbufferSetting("ring_exchange", 1, False, 4)
    for name in ("proj_fprop", "fc2_fprop"):
        assert DEFAULT_TABLE[name] == UserbufferSetting("pipeline", 16, True, 4)
    for name in ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"):
        assert DEFAULT_TABLE[name] == UserbufferSetting("bulk", 16, True, 4)
    assert userbuffer_table(None).changed() == {} and userbuffer_table({}).source is None


def test_a_table_updates_the_defaults_key_by_key():
    # TE: ub_cfg = get_default_config(name); ub_cfg.update(ub_cfgs[name]): what a table leaves
    # out keeps the default of the GEMM's default method
    table = userbuffer_table({"proj_fprop": {"method": "ring_exchange"},
                              "qkv_wgrad": {"num_sm": 24, "cga_size": 2, "set_sm_margin": False}}, "t.yaml")
    assert table["proj_fprop"] == UserbufferSetting("ring_exchange", 16, True, 4)
    assert table["qkv_wgrad"] == UserbufferSetting("bulk", 24, False, 4)
    assert set(table.changed()) == {"proj_fprop", "qkv_wgrad"} and table.source == "t.yaml"
    assert table["qkv_wgrad"].margin() == 0 and table["qkv_wgrad"].comm_sms() == 24
    assert table["proj_fprop"].margin() == 16 and table["proj_fprop"].comm_sms() == 0


@pytest.mark.parametrize("entries, words", [
    ({"attn_fprop": {}}, "t.yaml: attn_fprop: not a userbuffer GEMM"),
    ({"qkv_fprop": {"num_sms": 2}}, "t.yaml: qkv_fprop: num_sms: not a userbuffer setting"),
    ({"qkv_fprop": {"method": "pipeline"}}, "t.yaml: qkv_fprop: method 'pipeline' is not modelled"),
    ({"qkv_dgrad": {"method": "ring_exchange"}}, "t.yaml: qkv_dgrad: method 'ring_exchange' is not modelled"),
    ({"qkv_fprop": {"aggregate": True}}, "t.yaml: qkv_fprop: aggregate: true is not modelled"),
    ({"proj_fprop": {"num_sm": True}}, "t.yaml: proj_fprop: num_sm: must be an integer"),
    ({"proj_fprop": {"num_splits": 0}}, "t.yaml: proj_fprop: num_splits: must be an integer from 1"),
    ({"proj_fprop": {"set_sm_margin": "yes"}}, "t.yaml: proj_fprop: set_sm_margin: must be true or false"),
    ({"proj_fprop": 4}, "t.yaml: proj_fprop: must map setting names"),
    ([1, 2], "t.yaml: must map GEMM names"),
])
def test_a_bad_table_is_refused_in_one_line_naming_the_gemm_and_key(entries, words):
    with pytest.raises(ConfigError) as err:
        userbuffer_table(entries, "t.yaml")
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


def test_a_bad_table_file_is_one_line_exit_2_naming_file_gemm_and_key(tmp_path):
    bad = tmp_path / "ub.yaml"
    bad.write_text("qkv_fprop: {method: ring_exchange}\nproj_fprop: {method: ring_exchange, num_sm: -1}\n")
    code, out, err = run_cli(["run", "--model", "llama3-8b", "--num-layers", "1", "--gpu", "h100-sxm", "--tp", "2",
                              "--sequence-parallel", "--tp-comm-overlap", "--tp-comm-overlap-cfg", str(bad), "-q"])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{bad}: proj_fprop: num_sm: must be an integer from 0 to 4096, got -1" in err


def test_a_shipped_table_is_found_by_its_bare_name():
    argv = ["run", "--model", "llama3-8b", "--num-layers", "1", "--gpu", "h100-sxm", "--tp", "2",
            "--sequence-parallel", "--tp-comm-overlap", "--tp-comm-overlap-cfg"]
    by_name = run_cli([*argv, "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192", "-q"])
    by_path = run_cli([*argv, str(REPO / "userbuffers" / "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192.yaml"), "-q"])
    assert by_name[0] == 0 and by_name[1] == by_path[1]
    code, _, err = run_cli([*argv, "userbuffers_fp8_a100", "-q"])
    assert code == 2 and "file not found (shipped tables: userbuffers_bf16_" in err
    assert "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192" in err


def test_every_shipped_table_reads_cleanly_and_changes_only_what_te_defaults_differ_in():
    from triosim.safe_yaml import load_yaml_file

    shipped = sorted((REPO / "userbuffers").glob("*.yaml"))
    assert len(shipped) == 10
    for path in shipped:
        table = userbuffer_table(load_yaml_file(path), path.name)
        # Megatron-Bridge's tables: all-gathers by ring exchange as TE, bulk overlaps without a margin
        assert all(table[n].method == "ring_exchange" for n in userbuffers.ALL_GATHER_GEMMS), path.name
        assert all(not table[n].set_sm_margin for n in userbuffers.BULK_GEMMS), path.name


def test_the_table_needs_the_overlap():
    with pytest.raises(ConfigError, match="--tp-comm-overlap-cfg needs --tp-comm-overlap"):
        Strategy(tp=2, sequence_parallel=True, tp_comm_overlap_cfg=userbuffer_table(RING_RS)).validate(None)


# ----------------------------------------------------------------------------- the SM margin


def test_the_margin_slows_by_n_over_n_minus_num_sm_where_sms_are_shared():
    def trace_on(gpu):
        return SimpleNamespace(op_time=SimpleNamespace(gpu=GpuTiming(get_device(gpu), "roofline", "bf16")))

    _, slow = userbuffers.gemm_slowdown(trace_on("h100-sxm"), Strategy())
    assert slow(16) == 132 / 116 and slow(1) == 132 / 131 and slow(0) == 1.0
    assert userbuffers.gemm_slowdown(trace_on("l40s"), Strategy())[1](16) == 1.0  # no SM sharing there
    assert userbuffers.gemm_slowdown(SimpleNamespace(op_time=None), Strategy())[1](16) == 1.0  # no --gpu
    assert userbuffers.gemm_slowdown(trace_on("h100-sxm"), Strategy(), "exclusive")[1](16) == 1.0  # no SM sharing


def _card_gemm(op: int, overlap: bool, **extra) -> list[float]:
    """Seconds of op ``op``'s compute tasks (micro-batch 0, GPU 0) on a one-layer llama3-8b, TP 2."""
    trace, platform, strategy = configure({"model": "llama3-8b", "num-layers": 1, "gpu": "h100-sxm", "seq-len": 2048,
                                           "tp": 2, "sequence-parallel": True, "exact": True,
                                           **({"tp-comm-overlap": True} if overlap else {}), **extra})
    g = build_graph(trace, platform, strategy)
    return [g.duration[t] for t in range(len(g)) if g.kind[t] == "compute" and 0 in g.devices[t]
            and (g.attr_rows[t] or {}).get("op") == op and g.attr_rows[t].get("microbatch") == 0]


def test_a_pipelined_gemm_with_te_default_margin_runs_132_over_116_of_its_time(tmp_path):
    # linear#9 (op 8) is the attention block's row GEMM (proj_fprop), 4 chunks; op 24 a column
    # linear's backward, split in a dgrad and a wgrad half (qkv_dgrad, qkv_wgrad)
    no_margin = tmp_path / "no-margin.yaml"
    no_margin.write_text("proj_fprop: {set_sm_margin: false}\n")
    chunks = _card_gemm(8, overlap=True)
    plain = _card_gemm(8, overlap=True, **{"tp-comm-overlap-cfg": str(no_margin)})
    assert len(chunks) == len(plain) == 4
    assert all(c == pytest.approx(q * 132 / 116, rel=1e-12) for c, q in zip(chunks, plain))
    (whole,) = _card_gemm(24, overlap=False)
    halves = _card_gemm(24, overlap=True)
    assert len(halves) == 2 and all(h == pytest.approx(whole / 2 * 132 / 116, rel=1e-12) for h in halves)


def test_the_margin_catches_a_planted_bug(monkeypatch):
    """Bug: the margin is forgotten (the GEMM keeps every SM)."""
    (whole,) = _card_gemm(24, overlap=False)
    monkeypatch.setattr(rank_program, "gemm_slowdown", lambda trace, strategy, network: (None, lambda m: 1.0))
    assert _card_gemm(24, overlap=True)[0] != pytest.approx(whole / 2 * 132 / 116, rel=1e-12)


# ----------------------------------------------------------------------------- ring-exchange reduce-scatter


def _trace():
    model = SyntheticTransformer(layers=1, batch_size=2, seq_len=64, hidden=64, heads=4, seed=3,
                                 min_us=200.0, max_us=400.0)
    with tempfile.TemporaryDirectory() as tmp:
        return load_trace(write_synthetic_transformer(tmp, model), batch_size=model.batch_size)


def _ring_rs(gbps: float, exact: bool = False):
    """The first forward ring-exchange reduce-scatter on GPU 0: (start of the GEMM's chunk 0, the
    GEMM's seconds, one send's seconds, the sum's start)."""
    platform = build_platform(TP, ptp_bandwidth_gbps=gbps, topology="switch", link_latency_us=0.0)
    g = build_graph(_trace(), platform, Strategy(tp=TP, sequence_parallel=True, tp_comm_overlap=True, exact=exact,
                                                 tp_comm_overlap_cfg=userbuffer_table(RING_RS)))
    s = schedule(g)
    sums = [t for t in range(len(g)) if g.kind[t] == "compute" and 0 in g.devices[t]
            and "tp_sum" in (g.attr_rows[t] or {})]
    op = g.attr_rows[sums[0]]["tp_sum"]
    chunks = [t for t in range(len(g)) if g.kind[t] == "compute" and 0 in g.devices[t]
              and (g.attr_rows[t] or {}).get("op") == op and "chunk" in g.attr_rows[t]][:TP]
    sends = [t for t in range(len(g)) if g.kind[t] == "transfer" and " send" in g.label[t]
             and g.devices[t][0] == 0 and (g.attr_rows[t] or {}).get("op_index") == op][:TP - 1]
    assert len(chunks) == TP and len(sends) == TP - 1 and g.duration[sums[0]] == 0.0  # no device: no sum time
    send = g.duration[sends[0]]
    assert all(g.duration[t] == send for t in sends)
    return s.start[chunks[0]], sum(g.duration[t] for t in chunks), send, s.start[sums[0]]


def _closed_form_holds(gbps: float, exact: bool = False) -> bool:
    # the sends go one after another, each after its chunk; the last chunk is the rank's own:
    # the sum starts max(G, G/n + (n - 1)·S) after the GEMM
    t0, gemm, send, start = _ring_rs(gbps, exact)
    return start == pytest.approx(t0 + max(gemm, gemm / TP + (TP - 1) * send), rel=1e-12, abs=0)


@pytest.mark.parametrize("exact", [False, True])
def test_a_fully_hidden_ring_exchange_reduce_scatter_exposes_only_its_sum(exact):
    t0, gemm, send, start = _ring_rs(1000.0, exact)
    assert send < gemm / TP and start == pytest.approx(t0 + gemm, rel=1e-12, abs=0)


@pytest.mark.parametrize("exact", [False, True])
def test_a_bandwidth_bound_ring_exchange_reduce_scatter_exposes_its_sends_beyond_the_first_chunk(exact):
    _, gemm, send, _ = _ring_rs(0.05, exact)
    assert send > gemm / TP and _closed_form_holds(0.05, exact)


def test_ring_exchange_reduce_scatter_catches_a_planted_bug(monkeypatch):
    """Bug: the sum does not wait for the sends (the partial chunks summed before they arrive)."""
    assert _closed_form_holds(0.05)
    monkeypatch.setattr(rank_program, "chunk_senders", lambda group, built, sent: {gpu: [] for _, gpu in built})
    assert not _closed_form_holds(0.05)


def test_the_sum_reads_every_partial_chunk_once_at_the_device_roofline():
    h100 = get_device("h100-sxm")
    chunk = 16 << 20
    got = userbuffers.partial_sum_seconds(chunk, 8, h100)
    moved = 9 * chunk
    assert got == pytest.approx(moved / (h100.hbm_bytes_per_s * h100.memory_efficiency.at(moved))
                                + h100.launch_floor_s, rel=1e-12)
    assert userbuffers.partial_sum_seconds(chunk, 8, None) == 0.0
