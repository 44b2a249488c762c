"""Megatron-Core's pipeline layouts (triosim.graph.pipeline.layer_layout): the account-for flags,
uneven first/last stages and the layout string place exactly Megatron-Core's transformer layers
on each (virtual) stage; what breaks Megatron's rules is refused in one line."""

from __future__ import annotations

import itertools

import pytest

import triosim.graph.pipeline.builder as pp
import triosim.graph.pipeline.layer_layout as ll
import triosim.graph.pipeline.stages as ps
from triosim import build_platform
from triosim.errors import ConfigError
from triosim.graph.pipeline.layer_layout import (
    LayerSplit,
    auto_split,
    layout_text,
    megatron_layers_per_stage,
    parse_layout,
)
from triosim.graph.pipeline.schedules import FORWARD
from triosim.graph.pipeline.summary import layer_facts
from triosim.graph.strategy import Strategy
from triosim.trace.layers import forward_layers

from ..cli_capture import run

# --------------------------------------------------------------- Megatron-Core's rules, restated
# Written from Megatron-Core's get_num_layers_to_build (megatron/core/transformer/transformer_block.py)
# and get_transformer_layer_offset (megatron/core/transformer/transformer_layer.py), per pipeline
# rank p and virtual stage v, independently of triosim's stage-order implementation.


def megatron_num_layers_to_build(L, P, V, p, v, e=False, loss=False, first=None, last=None):
    if first is not None or last is not None:
        rest, left = L, P
        if first is not None:
            rest, left = rest - first, left - 1
        if last is not None:
            rest, left = rest - last, left - 1
        per_rank = rest // left if left > 0 else 0
        if p == 0 and first is not None:
            per_rank = first
        if p == P - 1 and last is not None:
            per_rank = last
    else:
        per_rank = (L + e + loss) // P
    n = per_rank // V if V > 1 else per_rank
    if e and v == 0 and p == 0:
        n -= 1
    if loss and v == V - 1 and p == P - 1:
        n -= 1
    return n


def megatron_layer_offset(L, P, V, p, v, e=False, loss=False, first=None, last=None):
    if first is not None or last is not None:
        middle_stages = P - (first is not None) - (last is not None)
        f, la = first or 0, last or 0
        middle_layers = L - f - la
        middle_rank = p if first is None else p - 1
        if V > 1:
            f_chunk, l_chunk, m_chunk = f // V, la // V, middle_layers // V
            total = f_chunk + m_chunk + l_chunk
            return v * total if p == 0 else v * total + f_chunk + middle_rank * (m_chunk // middle_stages)
        per = middle_layers // middle_stages if middle_stages > 0 else 0
        return 0 if p == 0 else middle_rank * per + f
    total = L + e + loss
    per_rank = total // P
    if V > 1:
        offset = v * (total // V) + p * (per_rank // V)
    else:
        offset = p * per_rank
    if e and not (v == 0 and p == 0):
        offset -= 1
    return offset


CASES = [  # (layers, P, V, split)
    (126, 16, 8, LayerSplit(True, True)),  # the issue's: 128 stages, the first and last hold no transformer layer
    (126, 8, 8, LayerSplit(True, True)),  # the Llama 3.1 405B recipe
    (126, 2, 1, LayerSplit(True, True)),
    (31, 4, 2, LayerSplit(False, True)),
    (31, 4, 1, LayerSplit(True, False)),
    (30, 4, 2, LayerSplit(True, True)),
    (24, 4, 3, LayerSplit()),
    (10, 4, 1, LayerSplit(first_stage_layers=1, last_stage_layers=3)),
    (20, 4, 2, LayerSplit(first_stage_layers=2, last_stage_layers=6)),
    (16, 4, 2, LayerSplit(first_stage_layers=4)),
    (61, 8, 1, LayerSplit(last_stage_layers=5)),
]


def check_against_megatron(layers_per_stage) -> None:
    """Per stage c = v·P + p: Megatron's layers to build, and Megatron's layer offset equal to the
    layers of the stages before it."""
    for L, P, V, s in CASES:
        counts = layers_per_stage(L, P, V, s)
        kw = dict(e=s.account_for_embedding, loss=s.account_for_loss, first=s.first_stage_layers,
                  last=s.last_stage_layers)
        assert len(counts) == P * V and sum(counts) == L, (L, P, V, s)
        for v, p in itertools.product(range(V), range(P)):
            c = v * P + p
            assert counts[c] == megatron_num_layers_to_build(L, P, V, p, v, **kw), (L, P, V, s, c)
            assert sum(counts[:c]) == megatron_layer_offset(L, P, V, p, v, **kw), (L, P, V, s, c)


def test_layers_per_stage_are_megatron_cores():
    check_against_megatron(megatron_layers_per_stage)


def test_the_closed_form_catches_a_planted_bug():
    """The embedding's place taken from rank 0's last virtual stage instead of its first."""
    def planted(L, P, V, s):
        counts = list(megatron_layers_per_stage(L, P, V, s))
        if s.account_for_embedding:
            counts[0] += 1
            counts[(V - 1) * P] -= 1
        return tuple(counts)

    with pytest.raises(AssertionError):
        check_against_megatron(planted)


def test_the_issue_layout_126_layers_on_128_stages():
    counts = megatron_layers_per_stage(126, 16, 8, LayerSplit(True, True))
    assert counts == (0,) + (1,) * 126 + (0,)
    assert layout_text(counts) == "E|(t|)*126L"
    assert layout_text(megatron_layers_per_stage(126, 8, 8, LayerSplit(True, True))) == "Et|(tt|)*62tL"


def test_a_layout_string_round_trips_and_parses_megatrons_example():
    # PipelineParallelLayerLayout.parse_str_to_list's own example
    stages = parse_layout("Ettt|(tt|)*29,m|L")
    assert stages == (("E", "t", "t", "t"),) + (("t", "t"),) * 29 + (("m",), ("L",))
    assert parse_layout("Et*3|(tt|)*29,m|L") == stages
    for L, P, V, s in CASES:
        counts = megatron_layers_per_stage(L, P, V, s)
        if all(counts[1:-1]):
            assert megatron_layers_per_stage(L, P, V, LayerSplit(layout=layout_text(counts))) == counts


def test_auto_takes_the_account_for_split_only_where_the_layers_do_not_divide():
    assert auto_split(128, 8, 8) == LayerSplit()
    assert auto_split(126, 16, 8) == LayerSplit(True, True)
    assert auto_split(8, 3, 1) == LayerSplit(False, True)  # 8 + 1 over 3: the loss alone
    assert auto_split(8, 7, 1) is None


@pytest.mark.parametrize("args, needle", [
    ((126, 6, 1, LayerSplit(True, True)), "126 + 2 = 128 pipeline layers (the embedding and the loss counted "
                                          "as one layer each) do not divide over --pp 6"),
    ((126, 8, 3, LayerSplit(True, True)), "--virtual-stages 3 does not divide the 16 layers of pipeline rank 0"),
    ((3, 3, 2, LayerSplit()), "--virtual-stages 2 does not divide the 1 layer of pipeline rank 0"),
    ((10, 4, 1, LayerSplit(True, False, 2)), "cannot be combined"),
    ((10, 4, 1, LayerSplit(first_stage_layers=3, last_stage_layers=4)), "the 3 layers left over do not divide over "
                                                                        "the 2 other pipeline stages"),
    ((4, 2, 1, LayerSplit(layout="Et|t|tL")), "3 stages, not a multiple of --pp 2"),
    ((4, 2, 2, LayerSplit(layout="Et|tL")), "2 stages = --pp 2 × 1 virtual stage, but the run has 4"),
    ((4, 2, 1, LayerSplit(layout="tEt|ttL")), "E (the embedding) must come first, once"),
    ((4, 2, 1, LayerSplit(layout="Ett|tLm")), "L (the loss) must come last, once"),
    ((4, 2, 1, LayerSplit(layout="Ett|tmL")), "places 1 multi-token-prediction layer (m), the model has none"),
    ((4, 2, 1, LayerSplit(layout="Ett|tL")), "places 3 transformer layers (t), the model has 4"),
    ((4, 4, 1, LayerSplit(layout="Ett||ttL|")), "stage 1 is empty"),
    ((4, 2, 1, LayerSplit(layout="Ett|tx")), "'x' is not a layer letter"),
])
def test_refusals_name_the_rule(args, needle):
    with pytest.raises(ConfigError) as info:
        megatron_layers_per_stage(*args)
    assert needle in str(info.value) and "\n" not in str(info.value)


# --------------------------------------------------------------- placed on a model card's trace

LAYERS = 8


def plan(trace, gpus: int, virtual: int = 1, partition: str = "auto", **flags):
    schedule = "interleaved" if virtual > 1 else "1f1b"
    strategy = Strategy(case=4, micro_batch_size=1, partition=partition, schedule=schedule, virtual_stages=virtual,
                        **flags)
    micro = max(2, gpus) if virtual > 1 else 2  # interleaved: a multiple of the pipeline's GPUs
    return pp.plan_stages(trace, build_platform(gpus), strategy, [1 / micro] * micro)


def megatron_stages(P, V, split) -> dict[int, int]:
    """Megatron-Core's stage of each transformer layer: for the flags, virtual stage v of rank r
    holds the layers from its offset on; for a layout, its stages' ``t`` in order
    (PipelineParallelLayerLayout.get_layer_offset / get_num_layers_to_build)."""
    if split.layout is not None:
        counts = [stage.count("t") for stage in parse_layout(split.layout)]
        return {k: c for c, n in enumerate(counts) for k in range(sum(counts[:c]), sum(counts[:c]) + n)}
    kw = dict(e=split.account_for_embedding, loss=split.account_for_loss, first=split.first_stage_layers,
              last=split.last_stage_layers)
    where = {}
    for v, r in itertools.product(range(V), range(P)):
        start = megatron_layer_offset(LAYERS, P, V, r, v, **kw)
        for k in range(start, start + megatron_num_layers_to_build(LAYERS, P, V, r, v, **kw)):
            where[k] = v * P + r
    return where


def check_placement(trace, p, P, V, split) -> None:
    """Layer k on Megatron-Core's stage for it; the embedding on stage 0, the final norm, head and
    loss on the last."""
    where = megatron_stages(P, V, split)
    layers = forward_layers(trace)
    for k, unit in enumerate(layers):
        assert {p.stage[i] for i in unit} == {where[k]}, f"layer {k}"
    forward = [i for i, phase in enumerate(p.phase) if phase == FORWARD]
    assert all(p.stage[i] == 0 for i in forward if i < layers[0][0])
    assert all(p.stage[i] == p.num_stages - 1 for i in forward if i > layers[-1][-1])
    # the embedding's backward runs where the embedding does (a stage of its own under --account-for-embedding)
    embedding_backward = [op.index for op in trace.ops if op.name.endswith("EmbeddingBackward0")]
    assert embedding_backward and {p.stage[i] for i in embedding_backward} == {0}, "an embedding's backward is off its stage"
    assert ps.stage_layer_counts(trace, p) == p.layer_counts


@pytest.mark.parametrize("P, V, split", [
    (2, 5, LayerSplit(True, True)),  # 10 stages of one layer: the first holds only the embedding, the last the loss
    (3, 1, LayerSplit(False, True)),
    (3, 1, LayerSplit(True, False)),
    (3, 2, LayerSplit(first_stage_layers=2, last_stage_layers=2)),
    (3, 1, LayerSplit(first_stage_layers=2, last_stage_layers=2)),
    (2, 2, LayerSplit(layout="Et|ttt|ttt|tL")),
])
def test_a_plan_places_megatrons_layers(card_trace, P, V, split):
    flags = dict(account_for_embedding_in_pipeline_split=split.account_for_embedding,
                 account_for_loss_in_pipeline_split=split.account_for_loss,
                 decoder_first_pipeline_num_layers=split.first_stage_layers,
                 decoder_last_pipeline_num_layers=split.last_stage_layers,
                 pipeline_model_parallel_layout=split.layout)
    p = plan(card_trace, P, V, **flags)
    assert p.partition == "layers" and p.layer_split.endswith("(as given)")
    check_placement(card_trace, p, P, V, split)


@pytest.mark.parametrize("P, V", [(2, 5), (5, 1)])
def test_llamas_embedding_backward_runs_on_the_embeddings_stage(llama_card_trace, P, V):
    """Its EmbeddingBackward reads no forward op's output and no weight, only the token ids (which
    the embedding alone read): it went with the backward op before it, layer 0's, so onto stage 1
    when the embedding has a stage of its own."""
    split = LayerSplit(True, True)
    p = plan(llama_card_trace, P, V, account_for_embedding_in_pipeline_split=True,
             account_for_loss_in_pipeline_split=True)
    check_placement(llama_card_trace, p, P, V, split)


def test_auto_picks_the_account_for_split_and_says_so(card_trace):
    p = plan(card_trace, 3)  # 8 layers over 3 stages: only with the loss counted
    assert p.partition == "layers" and p.layer_counts == (3, 3, 2)
    assert p.layer_split == ("auto: 8 transformer layers do not divide over 3 stages, with the loss counted as one "
                             "layer they do (--account-for-loss-in-pipeline-split, as Megatron-Core)")
    check_placement(card_trace, p, 3, 1, LayerSplit(False, True))
    assert layer_facts(p) == {"layers_per_stage": [3, 3, 2], "layout": "Ettt|ttt|ttL",
                                 "layer_split": p.layer_split}


def test_a_plan_catches_a_planted_bug(card_trace, monkeypatch):
    """The loss's place taken from the first stage instead of the last."""
    def planted(L, P, V, s, leading=0, mtp=0):
        counts = list(ll.megatron_layers_per_stage(L, P, V, s, leading, mtp))
        if s.account_for_loss:
            counts[-1], counts[0] = counts[-1] + 1, counts[0] - 1
        return tuple(counts)

    monkeypatch.setattr(ps, "megatron_layers_per_stage", planted)
    p = plan(card_trace, 3, 1, account_for_loss_in_pipeline_split=True)
    with pytest.raises(AssertionError):
        check_placement(card_trace, p, 3, 1, LayerSplit(False, True))


def test_stage_layer_counts_of_a_searched_plan(card_trace):
    p = plan(card_trace, 3, partition="count")
    counts = ps.stage_layer_counts(card_trace, p)
    assert sum(counts) == LAYERS and len(counts) == 3 and not p.layer_counts


# --------------------------------------------------------------- the command line

CARD = ["run", "--model", "gpt3-175b", "--num-layers", "8", "--gpu", "h100-sxm", "--topology", "switch",
        "--global-batch", "8", "--micro-batch-size", "1", "-q"]


@pytest.mark.parametrize("argv, needle", [
    (["--pp", "3", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
     "8 + 2 = 10 pipeline layers (the embedding and the loss counted as one layer each) do not divide over --pp 3"),
    (["--pp", "2", "--account-for-loss-in-pipeline-split", "--partition", "optimal"],
     "places Megatron-Core's layers per stage: use --partition auto or layers, not optimal"),
    (["--pp", "2", "--pipeline-model-parallel-layout", "Et*3|t*4L", "--decoder-first-pipeline-num-layers", "3"],
     "places every layer itself"),
    (["--pp", "2", "--pipeline-model-parallel-layout", "Et*3|(t|)*3tL"], "has 5 stages, not a multiple of --pp 2"),
    (["--pp", "2", "--schedule", "1f1b", "--pipeline-model-parallel-layout", "Et|tt|ttt|ttL"],
     "has 4 stages = --pp 2 × 2 virtual stages, but the run has 2: use --schedule interleaved --virtual-stages 2"),
    (["--pp", "4", "--schedule", "interleaved", "--virtual-stages", "3"],
     "--pp 4 × --virtual-stages 3 = 12 stages is more than the model's 8 transformer layers"),
])
def test_cli_refusals_are_one_line(argv, needle):
    code, out, err = run([*CARD, *argv])
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert needle in err


def test_cli_runs_a_layout_and_reports_it(tmp_path):
    path = tmp_path / "r.json"
    code, out, err = run([*CARD, "--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2",
                          "--pipeline-model-parallel-layout", "Et|ttt|ttt|tL", "--json", str(path)])
    assert code == 0, err
    import json

    hybrid = json.loads(path.read_text())["hybrid"]
    assert hybrid["layers_per_stage"] == [1, 3, 3, 1] and hybrid["layout"] == "Et|ttt|ttt|tL"
    assert hybrid["layer_split"] == "--pipeline-model-parallel-layout 'Et|ttt|ttt|tL' (as given)"


def test_a_layout_gives_the_virtual_stages_as_in_megatron(tmp_path):
    """Megatron derives V from the layout's stages; so do the native flag and --megatron-args."""
    layout = ["--pipeline-model-parallel-layout", "Et|ttt|ttt|tL"]
    explicit = run([*CARD, "--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2", *layout])
    derived = run([*CARD, "--pp", "2", *layout])
    pasted = run([*CARD, "--megatron-args", "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
                  "Et|ttt|ttt|tL"])
    assert explicit[0] == 0 and explicit == derived == pasted


@pytest.mark.slow
def test_the_issue_command_form_runs_as_written():
    argv = ("run --model llama3-405b --gpu h100-sxm --topology-file topologies/dgx-h100-superpod.yaml "
            "--dp 8 --tp 8 --pp 8 --cp 2 --schedule interleaved --virtual-stages 8 "
            "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
            "--global-batch 512 -micro-batch-size 1 --seq-len 8192 --dtype fp8 -q").split()
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    argv[argv.index("topologies/dgx-h100-superpod.yaml")] = str(root / "topologies" / "dgx-h100-superpod.yaml")
    code, out, err = run(argv)
    assert code == 0 and err == "", err
    assert float(out) > 0


def test_plan_takes_a_layout_flag_as_a_pin():
    # (plan refused the layout flags before it searched layouts; tests/plan/test_plan_moe_cli.py has more)
    code, out, err = run(["plan", "--model", "gpt3-175b", "--num-layers", "8", "--gpu", "h100-sxm", "--gpus", "8",
                          "--global-batch", "8", "--account-for-loss-in-pipeline-split", "--top", "0", "-q"])
    assert code == 0, err
    assert out.rstrip().endswith("--account-for-loss-in-pipeline-split")


def test_layers_per_virtual_stage_count_the_embedding_and_loss_as_megatron_does():
    """--num-layers-per-virtual-pipeline-stage N: V = (L + accounted) / (P · N) (Megatron's arguments.py)."""
    base = ["run", "--model", "gpt3-175b", "--gpu", "h100-sxm", "--topology", "switch", "--global-batch", "8", "-q"]
    flags = "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"
    pasted = run([*base, "--megatron-args", f"--num-layers 6 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
                  f"--num-layers-per-virtual-pipeline-stage 2 {flags}"])
    native = run([*base, "--num-layers", "6", "--pp", "2", "-micro-batch-size", "1", "--schedule", "interleaved",
                  "--virtual-stages", "2", *flags.split()])
    assert native[0] == 0 and pasted == native


def test_layout_flags_without_a_pipeline_are_named_as_unused():
    code, out, err = run([*CARD, "--tp", "2", "--account-for-loss-in-pipeline-split"])
    assert code == 0
    assert err == ("triosim: note: the layer cuts are the pipeline's, and there is one stage: "
                   "--account-for-loss-in-pipeline-split not used\n")


# --------------------------------------------------------------- leading dense layers and MTP (DeepSeek-V3)

def test_megatron_counts_the_leading_dense_layers_and_places_mtp_last():
    """DeepSeek-V3's recipe layout for PP 16: 61 decoder layers (3 dense, then 58 repeated MoE
    ones) and one MTP layer. The dense layers come off the first stage's count."""
    layout = LayerSplit(layout="Et*4|(t*4|)*14,tmL")
    assert megatron_layers_per_stage(58, 16, 1, layout, leading=3, mtp=1) == (1, *(4,) * 14, 1)
    assert ll.megatron_decoder_layers(61, 16, 1, layout, mtp=1) == (4, *(4,) * 14, 1)
    # the other rules count them too: 61 + 1 (the loss) = 62 layers over 2 ranks
    assert megatron_layers_per_stage(58, 2, 1, LayerSplit(False, True), leading=3) == (28, 30)
    assert auto_split(58, 2, 1, leading=3) == LayerSplit(False, True)
    assert auto_split(58, 2) == LayerSplit()  # counted without them, 58 would divide


def test_layout_text_shows_the_leading_layers_and_mtp():
    text = layout_text((1, *(4,) * 14, 1), leading=3, mtp=1)
    assert text == "Et*4|(t*4|)*14tmL"
    stages = parse_layout(text)
    assert [s.count("t") for s in stages] == [4, *(4,) * 14, 1] and stages[-1] == ("t", "m", "L")


@pytest.mark.parametrize("layout, leading, mtp, needle", [
    ("Et*4|(t*4|)*14,tL", 3, 1, "places 0 multi-token-prediction layers (m), the model has 1 (--mtp-layers)"),
    ("Et*4|(t*4|)*14,tmL", 3, 0, "places 1 multi-token-prediction layer (m), the model has none"),
    ("Et*4|(t*4|)*13,t*4m|tL", 3, 1, "m on stage 14; triosim runs the multi-token-prediction layers after the loss"),
    ("Et*4|(t*4|)*14,mtL", 3, 1, "a t after m"),
    ("E|t*4|(t*4|)*13,t*5mL", 3, 1, "the first stage gets 0 decoder layers, but the model's first 3"),
    ("Et|(t*4|)*14,tmL", 3, 1, "places 58 transformer layers (t), the model has 61"),
])
def test_layout_refusals_with_leading_layers_and_mtp(layout, leading, mtp, needle):
    with pytest.raises(ConfigError) as err:
        megatron_layers_per_stage(58, 16, 1, LayerSplit(layout=layout), leading=leading, mtp=mtp)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_uneven_flags_count_the_leading_layers():
    with pytest.raises(ConfigError, match="the first stage gets 2 decoder layers, but the model's first 3"):
        megatron_layers_per_stage(58, 2, 1, LayerSplit(first_stage_layers=2), leading=3)
    assert megatron_layers_per_stage(58, 2, 1, LayerSplit(first_stage_layers=31), leading=3) == (28, 30)


DEEPSEEK = ["run", "--model", "deepseek-v3", "--num-layers", "7", "--gpu", "h100-sxm", "--seq-len", "256",
            "--global-batch", "4", "--micro-batch-size", "1", "--pp", "2", "-q"]


def test_cli_runs_deepseeks_layout_as_megatron_types_it(tmp_path):
    """7 decoder layers (3 dense + 4 MoE) and the MTP layer; the dense layers, before the first
    repeated one, on the first stage, the MTP ops (after the loss) on the last."""
    import json

    path = tmp_path / "r.json"
    code, out, err = run([*DEEPSEEK, "--pipeline-model-parallel-layout", "Et*4|tttmL", "--json", str(path)])
    assert code == 0, err
    hybrid = json.loads(path.read_text())["hybrid"]
    assert hybrid["layers_per_stage"] == [4, 3] and hybrid["layout"] == "Et*4|tttmL"
    code, out, err = run([*DEEPSEEK, "--pipeline-model-parallel-layout", "Et*3|ttttmL"])
    assert code == 0, err
    code, out, err = run([*DEEPSEEK, "--pipeline-model-parallel-layout", "Ett|t*5mL"])
    assert code == 2 and "the first stage gets 2 decoder layers, but the model's first 3" in err


def test_deepseeks_dense_layers_and_mtp_sit_on_the_first_and_last_stage():
    from triosim.config.build import configure

    flags = {"model": "deepseek-v3", "num-layers": 7, "gpu": "h100-sxm", "seq-len": 256, "global-batch": 4,
             "micro-batch-size": 1, "pp": 2, "pipeline-model-parallel-layout": "Et*3|ttttmL"}
    trace, platform, strategy = configure(flags)
    p = pp.plan_stages(trace, platform, strategy, [1 / 4] * 4)
    assert p.layer_counts == (0, 4) and (p.leading_layers, p.mtp_layers) == (3, 1)
    layers = forward_layers(trace)
    forward = [i for i, phase in enumerate(p.phase) if phase == FORWARD]
    before = [i for i in forward if i < layers[0][0]]
    assert len(before) > 3 * 4 and all(p.stage[i] == 0 for i in before)  # the embedding and 3 dense layers
    assert all(p.stage[i] == 1 for i in forward if i > layers[-1][-1])  # head, loss, MTP
    # the MTP module's embedding lookup and concatenation come after the last repeated layer
    after = {trace.ops[i].name for i in forward if i > layers[-1][-1]}
    assert {"aten::embedding", "aten::cat"} <= after


@pytest.mark.parametrize("layout", ["Et*999999999999|t*4L", "E(t|)*99999999t*4L"])
def test_a_huge_repeat_is_one_line_not_a_memory_error(layout):
    """Unrolled, 't*10^12' took all memory (MemoryError traceback); it is refused before."""
    with pytest.raises(ConfigError, match="unrolls to more than the limit of 10,000 layers"):
        ll.parse_layout(layout)
    assert len(ll.parse_layout("E(tt|)*4999tL")) == 5000  # the limit still takes real layouts


ONE_STAGE = ["run", "--model", "llama3-8b", "--num-layers", "8", "--seq-len", "1024", "--gpu", "h100", "-q"]


@pytest.mark.parametrize("flags, needle", [
    # a "not used" note came first, then the error refusing the same flag
    (["--pp", "1", "--decoder-last-pipeline-num-layers", "3"], "need --pp 2 or more"),
    (["--dp", "2", "--decoder-first-pipeline-num-layers", "3"], "need --pp 2 or more"),
    # and the error named --schedule interleaved, which nobody typed
    (["--pp", "1", "--pipeline-model-parallel-layout", "Et*4|t*4L"], "--pipeline-model-parallel-layout 'Et*4|t*4L' "
                                                                      "lays out 2 stages, but there is one"),
])
def test_layer_cuts_refused_on_one_stage_in_one_line(flags, needle):
    code, out, err = run([*ONE_STAGE, "--global-batch", "2", *flags])
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err


def test_a_layout_on_case_4_takes_its_stages_from_the_gpus():
    """-case 4 -GPUnumber 2 is two stages: the layout was read as one stage's, V = 2."""
    code, out, err = run([*ONE_STAGE, "--case", "4", "--gpus", "2", "--batch-size-sim", "2", "--micro-batch-size", "1",
                          "--pipeline-model-parallel-layout", "Et*4|t*4L"])
    assert code == 0, err
    code, even, _ = run([*ONE_STAGE, "--case", "4", "--gpus", "2", "--batch-size-sim", "2", "--micro-batch-size", "1",
                         "--partition", "layers"])
    assert code == 0 and out == even  # 4 + 4 layers: the even cut
