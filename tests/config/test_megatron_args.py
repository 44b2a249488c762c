"""Megatron-LM's argument names (:mod:`triosim.config.megatron_args`): each alias gives the bytes
of its native flag, ``--megatron-args`` reads a pasted line, unknown and unmodelled flags are one
line, and the architecture arguments make the card Megatron would build."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_capture import run

from triosim.config.megatron_args import translate_argv
from triosim.errors import ConfigError
from triosim.trace.model_card import read_card_file

CARD = ["--model", "llama3-8b", "--num-layers", "4", "--gpu", "h100-sxm"]



def json_bytes(argv: list[str]) -> str:
    code, out, err = run(["run", *argv, "--json", "-"])
    assert code == 0, err
    return out


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRIOSIM_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("alias,native", [
    (["--tensor-model-parallel-size", "2"], ["--tp", "2"]),
    (["--pipeline-model-parallel-size", "2"], ["--pp", "2"]),
    (["--global-batch-size", "8"], ["--global-batch", "8"]),
    (["--seq-length", "1024"], ["--seq-len", "1024"]),
    (["--use-distributed-optimizer"], ["--zero", "1"]),
    (["--bf16"], ["--dtype", "bf16"]),
    (["--fp16"], ["--dtype", "fp16"]),
    (["--fp8-format", "hybrid"], ["--dtype", "fp8"]),
    (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"], ["--dtype", "fp8", "--fp8-recipe", "current"]),
    (["--fp8-format", "e4m3", "--use-distributed-optimizer", "--fp8-param-gather"],
     ["--dtype", "fp8", "--zero", "1", "--fp8-param-gather"]),
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
     ["--recompute", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]),
    (["--recompute-activations"], ["--recompute", "selective"]),
    (["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"],
     ["--recompute", "full", "--recompute-method", "block", "--recompute-num-layers", "1"]),
    (["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"],
     ["--recompute", "selective", "--recompute-modules", "core_attn,mlp"]),
    (["--virtual-pipeline-model-parallel-size", "2"], ["--schedule", "interleaved", "--virtual-stages", "2"]),
    (["--num-virtual-stages-per-pipeline-rank", "2"], ["--schedule", "interleaved", "--virtual-stages", "2"]),
    (["--num-layers-per-virtual-pipeline-stage", "1"], ["--schedule", "interleaved", "--virtual-stages", "2"]),
    (["--context-parallel-size", "1"], ["--cp", "1"]),
    (["--context-parallel-size", "2", "--cp-comm-type", "a2a"], ["--cp", "2", "--cp-comm-type", "a2a"]),
    # Megatron-LM turns overlap_p2p_comm off outside the interleaved schedule (arguments.py), and
    # Megatron-Core's 1F1B refuses it: the base here is 1F1B
    (["--overlap-p2p-comm"], []),
    (["--overlap-p2p-comm", "--virtual-pipeline-model-parallel-size", "2"],
     ["--schedule", "interleaved", "--virtual-stages", "2", "--pipeline-send", "overlapped"]),
    # Megatron-Core refuses CPU offloading with pipeline parallelism: one stage here
    (["--cpu-offloading", "--cpu-offloading-num-layers", "1", "--pipeline-model-parallel-size", "1"],
     ["--offload-activations", "1", "--pp", "1"]),
    (["--overlap-p2p-communication"], []),
    (["--no-overlap-p2p-communication"], ["--pipeline-send", "blocking"]),
    (["--no-scatter-gather-tensors-in-pipeline"], []),
])
def test_each_alias_gives_the_bytes_of_its_native_flag(alias: list[str], native: list[str]) -> None:
    base = {"--tp": "2", "--pp": "2", "--dp": "2", "--global-batch": "8"}
    for flag in [*alias, *native]:
        base.pop(flag, None)
    if "--global-batch-size" in alias:
        base.pop("--global-batch", None)
    common = [*CARD, *[tok for kv in base.items() for tok in kv]]
    if "--recompute-modules" not in alias:  # Megatron's word list reads as such only in --megatron-args
        assert json_bytes([*common, *alias]) == json_bytes([*common, *native])
    wrapped = json_bytes([*common, "--megatron-args", " ".join(alias)]) if alias else None
    if wrapped is not None:
        assert wrapped == json_bytes([*common, *native])


# Korthikanti et al. 2022's 22B run as Megatron-LM's arguments, as a user pastes them.
PASTED_22B = ("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --num-layers 48 --hidden-size 6144 "
              "--num-attention-heads 64 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 4 "
              "--global-batch-size 4 --lr 0.00015 --train-iters 500000 --lr-decay-style cosine --min-lr 1.0e-5 "
              "--weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01 --fp16 --sequence-parallel "
              "--recompute-activations --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt "
              "--data-path my-gpt2_text_document --split 949,50,1 --log-interval 100 --save-interval 10000 "
              "--eval-interval 1000 --eval-iters 10")


def test_overlap_flags_are_simulated_not_only_noted() -> None:
    line = "--tp-comm-overlap --sequence-parallel --overlap-grad-reduce --overlap-param-gather --defer-embedding-wgrad-compute"
    result = translate_argv(["run", "--megatron-args", line])
    assert result.not_modelled == ["--defer-embedding-wgrad-compute"]
    for native in ("--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather"):
        assert native in result.argv
    common = [*CARD, "--tp", "2", "--dp", "2", "--zero", "1", "--global-batch", "8"]
    assert json_bytes([*common, "--megatron-args", line.replace(" --defer-embedding-wgrad-compute", "")]) == \
        json_bytes([*common, *line.replace(" --defer-embedding-wgrad-compute", "").split()])
    assert json_bytes([*common, "--sequence-parallel"]) != json_bytes([*common, *line.split()[:-1]])


def test_a_pasted_tp_comm_overlap_cfg_runs_as_the_native_flag() -> None:
    line = ("--tp-comm-overlap --sequence-parallel --tp-comm-overlap-cfg "
            "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192")
    result = translate_argv(["run", "--megatron-args", line])
    assert result.argv[result.argv.index("--tp-comm-overlap-cfg") + 1] == "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192"
    common = [*CARD, "--tp", "2", "--dp", "2"]
    assert json_bytes([*common, "--megatron-args", line]) == json_bytes([*common, *line.split()])


def test_a_pasted_megatron_line_runs_the_published_model() -> None:
    code, out, err = run(["run", "--gpu", "a100-80gb", "--num-layers", "2", "-GPUnumber", "8",
                          "--megatron-args", PASTED_22B.replace("--num-layers 48", "--num-layers 2"), "-q"])
    assert code == 0, err
    assert "no effect on one iteration's time or memory: --lr --train-iters" in err
    translated = translate_argv(["run", "--megatron-args", PASTED_22B]).argv
    card = read_card_file(translated[translated.index("--model-file") + 1])
    # Megatron's GPT defaults: 4h MLP, GPT-2's vocabulary padded to 128 x tp, LayerNorm, GELU, tied
    assert (card.layers, card.hidden, card.heads, card.kv_heads, card.ffn, card.vocab, card.seq_len) == \
        (48, 6144, 64, 64, 24576, 51200, 2048)
    assert (card.activation, card.norm, card.tied_embeddings, card.position, card.bias) == \
        ("gelu", "layernorm", True, "learned", True)
    for native in ("--tp", "--pp", "--global-batch", "--micro-batch-size", "--sequence-parallel"):
        assert native in translated
    assert translated[translated.index("--recompute") + 1] == "selective"
    assert translated[translated.index("--dtype") + 1] == "fp16"


def test_architecture_flags_replace_a_cards_fields() -> None:
    translated = translate_argv(["run", "--model", "llama3-8b", "--hidden-size", "2048",
                                 "--num-attention-heads", "16", "--num-query-groups", "4",
                                 "--group-query-attention"]).argv
    assert "--model" not in translated
    card = read_card_file(translated[translated.index("--model-file") + 1])
    assert (card.hidden, card.heads, card.kv_heads, card.ffn, card.activation) == (2048, 16, 4, 14336, "swiglu")


def test_swiglu_mlp_width_and_vocab_padding_follow_megatron() -> None:
    translated = translate_argv(["run", "--megatron-args", "--num-layers 2 --hidden-size 4096 --num-attention-heads 32 "
                                 "--seq-length 4096 --swiglu --vocab-size 32000 --tensor-model-parallel-size 8"]).argv
    card = read_card_file(translated[translated.index("--model-file") + 1])
    assert card.ffn == int(4 * 4096 * 2 / 3 / 64) * 64 == 10880
    assert card.vocab == 32768  # 32000 up to a multiple of 128 x 8


@pytest.mark.parametrize("argv,message", [
    (["--megatron-args", "--tensor-model-parallel-size 2 --no-such-flag 3"],
     "--megatron-args: --no-such-flag is not a Megatron-LM flag triosim knows"),
    (["--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p"],
     "--cp-comm-type a2a+p2p (hierarchical context parallelism) is not modelled"),
    (["--tp", "2", "--recompute-granularity", "selective", "--recompute-method", "block", "--recompute-num-layers", "2"],
     "--recompute-method/--recompute-num-layers need --recompute full"),
    (["--tp", "2", "--megatron-args", "--recompute-granularity selective --recompute-modules core_attn moe_act"],
     "--recompute-modules moe_act needs mixture-of-experts layers"),
    (["--megatron-args", "pretrain_gpt.py --tensor-model-parallel-size 2"], "is not a flag"),
    (["--megatron-args"], "--megatron-args needs a value"),
    (["--megatron-args", "--bf16 --fp8-format e5m2"], "--fp8-format must be e4m3 or hybrid, got 'e5m2'"),
    (["--num-layers-per-virtual-pipeline-stage", "3", "--pp", "2"], "not a whole number of virtual stages"),
    (["--megatron-args", "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 "
      "--decoder-first-pipeline-num-layers 2"], "uneven pipeline stages need --num-virtual-stages-per-pipeline-rank"),
    (["--pp", "2", "--num-layers-per-virtual-pipeline-stage", "1", "--pipeline-model-parallel-layout", "Et|t|t|tL"],
     "--num-layers-per-virtual-pipeline-stage and --pipeline-model-parallel-layout exclude each other"),
])
def test_refusals_are_one_line(argv: list[str], message: str) -> None:
    code, out, err = run(["run", *CARD, *argv])
    assert code == 2 and err.count("\n") == 1, err
    assert message in err


def test_megatron_names_are_in_the_help() -> None:
    code, out, _ = run(["run", "--help"])
    assert code == 0 and "--megatron-args" in out and "--tensor-model-parallel-size" in out


def test_a_native_flag_is_left_to_the_parser() -> None:
    argv = ["run", "--tp", "2", "--num-layers", "4", "--micro-batch-size", "2", "--sequence-parallel"]
    assert translate_argv(argv).argv == argv
    assert json.loads(json_bytes([*CARD, "--tensor-model-parallel-size", "2", "--global-batch", "2"]))["parallel"]["tp"] == 2


@pytest.mark.parametrize("line", ["--fp8-format hybrid --bf16", "--bf16 --fp8-format hybrid",
                                  "--fp8-format e4m3 --fp16"])
def test_fp8_format_wins_over_the_16_bit_switch_in_either_order(line: str) -> None:
    # Megatron-LM trains in FP8 with --fp8-format whatever the order of --bf16/--fp16 beside it
    argv = translate_argv(["run", "--megatron-args", line]).argv
    assert [argv[i + 1] for i, tok in enumerate(argv) if tok == "--dtype"][-1] == "fp8", argv  # the parser's last


@pytest.mark.parametrize("line", ["--recompute-method uniform --recompute-num-layers 1", "--recompute-num-layers 2",
                                  "--recompute-modules core_attn mlp"])
def test_recompute_details_without_a_granularity_recompute_nothing(line: str) -> None:
    # Megatron-Core reads recompute_method, recompute_num_layers and recompute_modules only under a
    # recompute_granularity: without one the line trains without recomputation
    result = translate_argv(["run", "--megatron-args", line])
    assert not any(tok.startswith("--recompute") for tok in result.argv), result.argv
    assert result.no_effect == [tok for tok in line.split() if tok.startswith("--")]
    granularity = "--recompute-granularity selective " if "modules" in line else \
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2 "
    with_granularity = translate_argv(["run", "--megatron-args", granularity + line]).argv
    assert with_granularity[with_granularity.index("--recompute") + 1] == granularity.split()[1]
    assert all(tok in with_granularity for tok in line.split() if tok.startswith("--recompute-"))


@pytest.mark.parametrize("line, missing", [
    ("--recompute-granularity full", "--recompute-method and --recompute-num-layers"),
    ("--recompute-granularity full --recompute-num-layers 2", "--recompute-method"),
    ("--recompute-granularity full --recompute-method block", "--recompute-num-layers"),
])
def test_full_recomputation_without_its_method_and_layers_is_refused_as_megatron_core(line: str, missing: str) -> None:
    with pytest.raises(ConfigError, match=f"--recompute-granularity full needs {missing} "):
        translate_argv(["run", "--megatron-args", line])


def test_gradients_reduced_in_bf16_as_megatron_derives_it() -> None:
    # --grad-reduce-in-bf16 is Megatron-LM's switch; --main-grads-dtype bf16 under --bf16 leaves
    # accumulate_allreduce_grads_in_fp32 off (arguments.py), so the gradients are reduced in bf16 too
    for line in ("--bf16 --grad-reduce-in-bf16",
                 "--bf16 --use-precision-aware-optimizer --main-grads-dtype bf16"):
        argv = translate_argv(["run", "--megatron-args", line]).argv
        assert argv[argv.index("--grad-reduce-dtype") + 1] == "bf16", argv
    assert "--grad-reduce-dtype" not in translate_argv(["run", "--megatron-args", "--bf16"]).argv
    code, out, err = run(["run", *CARD, "--megatron-args", "--bf16 --use-precision-aware-optimizer "
                          "--main-grads-dtype bf16 --accumulate-allreduce-grads-in-fp32"])
    assert code == 2 and err.count("\n") == 1 and "--main-grads-dtype bf16" in err, err


def test_the_flags_of_megatron_lms_own_recipes_are_read() -> None:
    # flags of Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh and examples/mixtral (2025-26)
    # that change nothing in one iteration's time or memory, or that triosim does not model
    line = ("--apply-layernorm-1p --decoupled-lr 5.0e-4 --decoupled-min-lr 4.5e-5 --calculate-per-token-loss "
            "--manual-gc --no-mmap-bin-files --profile --profile-step-start 4 --profile-step-end 6 "
            "--tiktoken-pattern v2 --no-position-embedding --bf16 --grad-reduce-in-bf16")
    result = translate_argv(["run", "--megatron-args", line])
    assert result.no_effect == ["--apply-layernorm-1p", "--decoupled-lr", "--decoupled-min-lr",
                                "--calculate-per-token-loss", "--manual-gc", "--no-mmap-bin-files", "--profile",
                                "--profile-step-start", "--profile-step-end", "--tiktoken-pattern"]
    assert result.not_modelled == ["--no-position-embedding"]
    assert result.argv == ["run", "--dtype", "bf16", "--grad-reduce-dtype", "bf16", "--tp", "1"]


def test_distributed_saved_activations_are_named_as_not_modelled() -> None:
    # Megatron-LM splits full recomputation's kept layer inputs over the tensor-parallel ranks with
    # it: less memory, so "no effect on one iteration's time or memory" would be wrong
    result = translate_argv(["run", "--megatron-args", "--recompute-granularity full --recompute-method uniform "
                             "--recompute-num-layers 1 --distribute-saved-activations"])
    assert result.not_modelled == ["--distribute-saved-activations"] and not result.no_effect


def test_a_pasted_line_without_parallel_sizes_is_megatrons_data_parallel_run() -> None:
    # Megatron-LM's sizes default to 1, the rest of the world is data parallel: the line runs as
    # it would with --tensor-model-parallel-size 1 typed
    line = "--global-batch-size 4 --micro-batch-size 1 --bf16 --use-distributed-optimizer"
    common = [*CARD, "--seq-len", "512", "-GPUnumber", "2"]
    out = json_bytes([*common, "--megatron-args", line])
    assert out == json_bytes([*common, "--megatron-args", line + " --tensor-model-parallel-size 1"])
    assert json.loads(out)["parallel"]["dp"] == 2
    assert "--tp" not in translate_argv(["plan", "--megatron-args", line]).argv  # plan searches the sizes


@pytest.mark.parametrize("line, needle", [
    # Megatron-Core's TransformerConfig: "no support for Pipeline parallelism with CPU offloading"
    ("--cpu-offloading --cpu-offloading-num-layers 1 --pipeline-model-parallel-size 2",
     "--cpu-offloading with --pp 2 (--pipeline-model-parallel-size): Megatron-Core refuses"),
    ("--cpu-offloading --pipeline-model-parallel-size 2", "Megatron-Core refuses CPU offloading with pipeline"),
    # a per-layer list of exchanges: one type for all layers is what triosim runs
    ("--context-parallel-size 2 --cp-comm-type p2p a2a", "one exchange per layer is not modelled"),
])
def test_pasted_offload_and_cp_lines_megatron_refuses(line: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        translate_argv(["run", "--megatron-args", line])


def test_offload_count_without_the_switch_offloads_nothing() -> None:
    """Megatron-Core reads cpu_offloading_num_layers only with --cpu-offloading on (it offloaded)."""
    for line in ("--cpu-offloading-num-layers 2", "--cpu-offloading", "--cpu-offloading --cpu-offloading-num-layers 0"):
        result = translate_argv(["run", "--megatron-args", line])
        assert "--offload-activations" not in result.argv and result.no_effect, line
    result = translate_argv(["run", "--megatron-args", "--cpu-offloading --cpu-offloading-num-layers 2"])
    i = result.argv.index("--offload-activations")
    assert result.argv[i + 1] == "2" and not result.no_effect


def test_a_per_layer_cp_comm_type_list_of_one_type_is_that_type() -> None:
    result = translate_argv(["run", "--megatron-args", "--context-parallel-size 2 --cp-comm-type a2a a2a a2a"])
    i = result.argv.index("--cp-comm-type")
    assert result.argv[i + 1] == "a2a" and result.argv.count("a2a") == 1
