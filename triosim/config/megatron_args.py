"""Megatron-LM's argument names, read as triosim's own flags.

Published recipes are written as Megatron-LM command lines. Each Megatron name is translated
into the native flag(s) it means before the command line is parsed, so an alias gives exactly the
run (and the bytes) of its native flag:

* parallel sizes: ``--tensor-model-parallel-size`` → ``--tp``, ``--pipeline-model-parallel-size``
  → ``--pp``, ``--context-parallel-size`` → ``--cp`` (with ``--cp-comm-type``, native);
  ``--virtual-pipeline-model-parallel-size V`` (``--num-virtual-stages-per-pipeline-rank V`` since
  Megatron-LM 2025) and ``--num-layers-per-virtual-pipeline-stage N`` → ``--schedule interleaved
  --virtual-stages V``; ``--expert-model-parallel-size`` → ``--ep``,
  ``--moe-token-dispatcher-type`` → ``--moe-token-dispatcher``, ``--mtp-num-layers`` →
  ``--mtp-layers``, ``--expert-tensor-parallel-size`` → ``--etp``; the MoE architecture (``--num-experts``,
  ``--moe-router-topk``, ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size``,
  ``--moe-layer-freq``, ``--moe-router-score-function``, ``--moe-aux-loss-coeff``) and
  ``--kv-channels`` (the head width) are card fields; ``--moe-grouped-gemm``,
  ``--moe-permute-fusion`` and ``--moe-router-force-load-balancing`` (the balanced load triosim
  assumes unless ``--moe-imbalance``) change nothing;
* batch and sequence: ``--global-batch-size`` → ``--global-batch``, ``--micro-batch-size`` and
  ``--num-layers`` are native, ``--seq-length`` → ``--seq-len``;
* memory: ``--sequence-parallel`` (native), ``--use-distributed-optimizer`` → ``--zero 1``,
  ``--recompute-granularity full|selective`` and ``--recompute-activations`` → ``--recompute``;
  ``--recompute-method``, ``--recompute-num-layers`` and ``--recompute-modules`` (a space-
  separated list in Megatron, comma-separated natively) are native; in a pasted line without a
  granularity they are noted and dropped (Megatron-Core reads them only under one);
* pipeline layouts: ``--account-for-embedding-in-pipeline-split``,
  ``--account-for-loss-in-pipeline-split``, ``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers`` and ``--pipeline-model-parallel-layout`` are native (a
  layout of pp × V stages implies ``--schedule interleaved --virtual-stages V``, as Megatron
  derives V from it);
* precision: ``--bf16``, ``--fp16``, ``--fp8-format`` → ``--dtype``; ``--fp8-recipe`` (Megatron's
  ``tensorwise`` is ``current``) and ``--fp8-param-gather`` are native (Megatron-Core's own
  default recipe is ``delayed``; triosim's is current scaling, MXFP8 on Blackwell: give
  ``--fp8-recipe delayed`` to match a line that names none); ``--grad-reduce-in-bf16``, and
  ``--main-grads-dtype bf16`` in a ``--bf16`` line, → ``--grad-reduce-dtype bf16``;
  ``--accumulate-allreduce-grads-in-fp32`` in a ``--fp16`` line → ``--grad-reduce-dtype fp32``
  (without it Megatron-LM reduces fp16 gradients in fp16, triosim's default under ``--dtype
  fp16``; under ``--bf16`` it reduces in fp32 anyway: :mod:`triosim.config.megatron_grads`);
* activation offload: Megatron-Core's ``--cpu-offloading --cpu-offloading-num-layers N`` →
  ``--offload-activations N``;
* overlaps (docs/overlap.md): ``--tp-comm-overlap`` (with ``--tp-comm-overlap-cfg FILE``),
  ``--overlap-grad-reduce`` and ``--overlap-param-gather`` are native; ``--overlap-p2p-comm`` (Megatron-Core's config name) and
  ``--overlap-p2p-communication`` (Megatron-LM's flag before October 2023) → ``--pipeline-send
  overlapped`` under the interleaved schedule (outside it Megatron turns them off: noted), ``--no-overlap-p2p-communication`` (Megatron-LM's flag since) → ``--pipeline-send
  blocking``; ``--no-scatter-gather-tensors-in-pipeline`` is triosim's default (the 2021–22
  default it turns off is ``--pipeline-scatter-gather``);
* the architecture (``--hidden-size``, ``--num-attention-heads``, ``--ffn-hidden-size``,
  ``--num-query-groups``, ``--swiglu``, ``--normalization``, ...): a model card, written to the
  cache and run as ``--model-file``: the ``--model`` card with those fields replaced, or, without
  ``--model``, a card of Megatron-LM's GPT defaults (:mod:`triosim.config.megatron_card`).

``--megatron-args "..."`` takes a whole pasted argument line. In it, flags that do not change
one iteration's time or memory (learning rate, data, logging, checkpoints) are accepted and
named in a note; a flag this table does not know is a one-line error naming it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError
from .megatron_card import _flag_value
from .megatron_card import positive_int as _positive_int
from .megatron_grads import FP32_GRADS, FP32_GRADS_MARKER, bf16_main_grads, finish_fp32_grads

MEGATRON_ARGS = "--megatron-args"

# Megatron name -> native flag; the value passes unchanged.
_RENAMED = {
    "--cpu-offloading-num-layers": "--offload-activations",  # Megatron-Core's cpu_offloading_num_layers
    "--tensor-model-parallel-size": "--tp",
    "--pipeline-model-parallel-size": "--pp",
    "--context-parallel-size": "--cp",
    "--expert-model-parallel-size": "--ep",
    "--expert-tensor-parallel-size": "--etp",
    "--mtp-num-layers": "--mtp-layers",
    "--moe-token-dispatcher-type": "--moe-token-dispatcher",
    "--cp-comm-type": "--cp-comm-type",
    "--tp-comm-overlap-cfg": "--tp-comm-overlap-cfg",  # TE's userbuffer table (graph.tensor.userbuffers)
    "--global-batch-size": "--global-batch",
    "--seq-length": "--seq-len",
    "--micro-batch-size": "--micro-batch-size",
    "--num-layers": "--num-layers",
    # pipeline layouts (graph.pipeline.layer_layout): native under Megatron-Core's own names
    "--decoder-first-pipeline-num-layers": "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers": "--decoder-last-pipeline-num-layers",
    "--pipeline-model-parallel-layout": "--pipeline-model-parallel-layout",
    # the precision-aware optimizer's dtypes (config.precision): native under Megatron's names
    "--main-grads-dtype": "--main-grads-dtype",
    "--main-params-dtype": "--main-params-dtype",
    "--exp-avg-dtype": "--exp-avg-dtype",
    "--exp-avg-sq-dtype": "--exp-avg-sq-dtype",
}
_OVERLAP_P2P = "--megatron-overlap-p2p"  # a marker until the schedule is known, then --pipeline-send overlapped
# Megatron switches -> the native flags they mean.
_SWITCHES = {
    "--cpu-offloading": [],  # switched on by its layer count (--cpu-offloading-num-layers)
    "--use-distributed-optimizer": ["--zero", "1"],
    "--bf16": ["--dtype", "bf16"],
    "--fp16": ["--dtype", "fp16"],
    "--sequence-parallel": ["--sequence-parallel"],
    "--recompute-activations": ["--recompute", "selective"],
    "--fp8-param-gather": ["--fp8-param-gather"],
    "--tp-comm-overlap": ["--tp-comm-overlap"],
    "--moe-shared-expert-overlap": ["--moe-shared-expert-overlap"],
    "--overlap-moe-expert-parallel-comm": ["--moe-a2a-overlap"],
    "--delay-wgrad-compute": ["--delay-wgrad-compute"],
    "--overlap-grad-reduce": ["--overlap-grad-reduce"],
    "--overlap-param-gather": ["--overlap-param-gather"],
    # overlapped only under the interleaved schedule (_finish_overlap_p2p)
    "--overlap-p2p-comm": [_OVERLAP_P2P, "--overlap-p2p-comm"],
    "--overlap-p2p-communication": [_OVERLAP_P2P, "--overlap-p2p-communication"],
    "--no-overlap-p2p-communication": ["--pipeline-send", "blocking"],
    # Megatron-LM 2021-22's switch off of its scatter/gather default: triosim's default already
    "--no-scatter-gather-tensors-in-pipeline": [],
    "--account-for-embedding-in-pipeline-split": ["--account-for-embedding-in-pipeline-split"],
    "--account-for-loss-in-pipeline-split": ["--account-for-loss-in-pipeline-split"],
    "--use-precision-aware-optimizer": ["--use-precision-aware-optimizer"],
    "--grad-reduce-in-bf16": ["--grad-reduce-dtype", "bf16"],
    FP32_GRADS: [FP32_GRADS_MARKER],  # fp32 gradients under --fp16 only (megatron_grads.finish_fp32_grads)
}
# Megatron's --fp8-recipe values -> the native ones (tensorwise: per-tensor current scaling).
_FP8_RECIPES = {"tensorwise": "current"}
# Architecture flags: value-taking and switches (they make a model card).
ARCH_VALUES = ("--hidden-size", "--num-attention-heads", "--ffn-hidden-size", "--num-query-groups", "--vocab-size",
               "--normalization", "--position-embedding-type", "--hidden-dropout", "--attention-dropout",
               "--make-vocab-size-divisible-by", "--kv-channels", "--transformer-impl", "--max-position-embeddings",
               "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
               "--moe-layer-freq", "--moe-router-score-function", "--moe-aux-loss-coeff")
ARCH_SWITCHES = ("--swiglu", "--group-query-attention", "--untie-embeddings-and-output-weights",
                 "--disable-bias-linear", "--use-flash-attn", "--use-rotary-position-embeddings")
# Flags that change nothing in one iteration's time or memory, with how many values each takes.
_NO_EFFECT = {
    **dict.fromkeys((
        "--moe-router-load-balancing-type", "--moe-token-drop-policy",
        "--lr", "--min-lr", "--lr-decay-style", "--lr-warmup-fraction", "--lr-warmup-iters", "--lr-decay-iters",
        "--lr-warmup-samples", "--lr-decay-samples", "--lr-warmup-init", "--train-iters", "--train-samples",
        "--weight-decay", "--clip-grad", "--adam-beta1", "--adam-beta2", "--adam-eps", "--init-method-std",
        "--data-path", "--train-data-path", "--valid-data-path", "--test-data-path", "--vocab-file",
        "--merge-file", "--tokenizer-type", "--tokenizer-model", "--split", "--save", "--load", "--save-interval",
        "--eval-interval", "--eval-iters", "--log-interval", "--tensorboard-dir", "--wandb-project",
        "--wandb-exp-name", "--wandb-save-dir", "--seed", "--distributed-backend", "--num-workers",
        "--data-cache-path", "--loss-scale", "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window",
        "--hysteresis", "--ckpt-format", "--timing-log-level", "--distributed-timeout-minutes", "--exit-interval",
        "--exit-duration-in-mins", "--manual-gc-interval", "--rotary-percent", "--rotary-base", "--norm-epsilon",
        "--empty-unused-memory-level", "--tensorboard-log-interval", "--log-params-norm", "--attention-backend",
        "--object-storage-cache-path", "--dataloader-type", "--micro-batch-size-per-gpu", "--use-checkpoint-opt_param-scheduler",
        "--pipeline-model-parallel-split-rank", "--start-weight-decay", "--end-weight-decay",
        "--weight-decay-incr-style", "--logging-level",
        "--decoupled-lr", "--decoupled-min-lr", "--profile-step-start", "--profile-step-end", "--tiktoken-pattern",
    ), 1),
    "--rampup-batch-size": 3,
    **dict.fromkeys((
        "--moe-grouped-gemm", "--moe-router-force-load-balancing", "--moe-permute-fusion",
        "--use-mcore-models", "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion",
        "--no-gradient-accumulation-fusion", "--no-async-tensor-model-parallel-allreduce",
        "--apply-query-key-layer-scaling", "--attention-softmax-in-fp32",
        "--no-load-optim", "--no-load-rng", "--use-checkpoint-args", "--log-throughput",
        "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard", "--log-memory-to-tensorboard",
        "--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask", "--check-for-nan-in-loss-and-grad",
        "--mock-data", "--no-create-attention-mask-in-dataloader", "--cross-entropy-loss-fusion",
        "--no-rope-fusion", "--bias-swiglu-fusion", "--masked-softmax-fusion", "--bias-gelu-fusion",
        "--use-legacy-models", "--no-save-optim", "--no-save-rng", "--log-num-zeros-in-grad",
        "--log-batch-size-to-tensorboard", "--log-loss-scale-to-tensorboard", "--no-initialization",
        "--no-persist-layer-norm",
        "--apply-layernorm-1p", "--calculate-per-token-loss", "--manual-gc", "--no-mmap-bin-files", "--profile",
    ), 0),
}
# Flags that change the step's time on a real machine but that triosim does not model yet:
# accepted in a pasted line, named in the note so the answer is read knowing it.
_NOT_MODELLED = {
    **dict.fromkeys(("--overlap-param-gather-with-optimizer-step",
                     "--defer-embedding-wgrad-compute", "--qk-layernorm", "--first-last-layers-bf16",
                     "--fp8-dot-product-attention", "--no-position-embedding", "--distribute-saved-activations"), 0),
    **dict.fromkeys(("--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin", "--fp8-interval",
                     "--ddp-bucket-size", "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16"), 1),
}


@dataclass
class Translation:
    """A command line with every Megatron name replaced, and what the note should say."""

    argv: list[str]
    no_effect: list[str] = field(default_factory=list)
    not_modelled: list[str] = field(default_factory=list)

    def note(self) -> str | None:
        parts = []
        if self.not_modelled:
            parts.append(f"not modelled, so not simulated: {' '.join(self.not_modelled)}")
        if self.no_effect:
            parts.append(f"no effect on one iteration's time or memory: {' '.join(self.no_effect)}")
        return ("triosim: note: Megatron flags " + "; ".join(parts)) if parts else None


def _split_eq(tok: str) -> tuple[str, str | None]:
    if tok.startswith("--") and "=" in tok:
        name, value = tok.split("=", 1)
        return name, value
    return tok, None


class _Reader:
    """Walks tokens, handing out a flag's value (``--x 1`` or ``--x=1``)."""

    def __init__(self, tokens: Sequence[str], where: str) -> None:
        self.tokens, self.i, self.where = list(tokens), 0, where

    def more(self) -> bool:
        return self.i < len(self.tokens)

    def take(self) -> str:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def value(self, flag: str, inline: str | None) -> str:
        if inline is not None:
            return inline
        if not self.more() or (self.tokens[self.i].startswith("--") and not _is_number(self.tokens[self.i])):
            raise ConfigError(f"{self.where}{flag} needs a value")
        return self.take()


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def translate_argv(argv: Sequence[str]) -> Translation:
    """``argv`` (a parsed command's tokens, long flags already with two dashes) with every
    Megatron name translated and every ``--megatron-args "..."`` expanded in place."""
    from .megatron_card import CardArgs

    out: list[str] = []
    result = Translation(out)
    card = CardArgs()
    recompute: dict[str, str] = {}
    pasted = False
    reader = _Reader(argv, "")
    while reader.more():
        tok = reader.take()
        if tok == "--":
            out.append(tok)
            out.extend(reader.tokens[reader.i:])
            break
        name, inline = _split_eq(tok)
        if name == MEGATRON_ARGS:
            if inline is None and not reader.more():
                raise ConfigError(f"{MEGATRON_ARGS} needs a value: the Megatron-LM argument line, quoted")
            text = inline if inline is not None else reader.take()  # the line starts with "--"
            try:
                tokens = shlex.split(text)
            except ValueError as exc:
                raise ConfigError(f"{MEGATRON_ARGS}: cannot split the line ({exc})") from None
            _translate_megatron_tokens(tokens, out, result, card, recompute, strict=True)
            pasted = True
            continue
        consumed = _translate_one(name, inline, reader, out, result, card, recompute, strict=False)
        if not consumed:
            out.append(tok)
    _finish_recompute(recompute, out, result)
    card.emit(out)
    _finish_layers_per_virtual_stage(out)
    if not argv or argv[0] != "plan":  # plan searches the pp × V a layout's stages allow (plan.candidates)
        _finish_layout(out)
    _finish_virtual(out)
    _finish_overlap_p2p(out, result)
    finish_fp32_grads(out, result.no_effect)
    if pasted and argv[0] in ("run", "dag") and not any(
            _flag_value(out, flag) is not None for flag in ("--dp", "--tp", "--pp", "--cp", "--case")):
        # Megatron-LM's parallel sizes default to 1 and the rest of the world is data parallel:
        # a pasted line is that run, not a -case preset (plan searches the sizes instead)
        out.extend(["--tp", "1"])
    return result


def _translate_megatron_tokens(tokens: list[str], out: list[str], result: Translation, card, recompute: dict,
                               strict: bool) -> None:
    from .megatron_line_rules import finish_cpu_offloading, one_cp_comm_type

    tokens, start = one_cp_comm_type(tokens, f"{MEGATRON_ARGS}: "), len(out)
    reader = _Reader(tokens, f"{MEGATRON_ARGS}: ")
    while reader.more():
        tok = reader.take()
        name, inline = _split_eq(tok)
        if not name.startswith("--"):
            raise ConfigError(f"{MEGATRON_ARGS}: {tok!r} is not a flag (a Megatron-LM argument line is "
                              "--name value pairs; a launcher such as torchrun or pretrain_gpt.py goes outside it)")
        if not _translate_one(name, inline, reader, out, result, card, recompute, strict=strict):
            raise ConfigError(f"{MEGATRON_ARGS}: {name} is not a Megatron-LM flag triosim knows; leave it out of the "
                              "line, or give the native flag after it")
    bf16_main_grads([_split_eq(tok)[0] for tok in tokens], tokens, out, f"{MEGATRON_ARGS}: ")
    _moe_defaults(tokens, out)
    finish_cpu_offloading(tokens, out, start, result.no_effect)


def _moe_defaults(tokens: list[str], out: list[str]) -> None:
    """Megatron-LM's defaults for a pasted MoE line (``--num-experts`` or
    ``--expert-model-parallel-size``), where triosim's own differ (``arguments.py``): without
    ``--expert-tensor-parallel-size`` the experts are split over the tensor-parallel ranks (the
    TP size; triosim's ``--etp`` defaults to 1), and without ``--moe-token-dispatcher-type`` the
    tokens go by all-gather (triosim's default is alltoall, the recipes' choice)."""
    names = {_split_eq(tok)[0] for tok in tokens}
    if not names & {"--num-experts", "--expert-model-parallel-size"}:
        return
    tp = _flag_value(tokens, "--tensor-model-parallel-size")
    if "--expert-tensor-parallel-size" not in names and tp is not None and tp != "1" and _flag_value(out, "--etp") is None:
        out.extend(["--etp", tp])
    if "--moe-token-dispatcher-type" in names or _flag_value(out, "--moe-token-dispatcher") is not None:
        return
    etp = _flag_value(out, "--etp")
    if etp is not None and etp != "1":
        raise ConfigError(f"{MEGATRON_ARGS}: the line runs Megatron-LM's default token dispatcher, allgather, with "
                          f"expert tensor parallelism {etp} (--expert-tensor-parallel-size, by default the TP size), "
                          "which triosim does not model: give --moe-token-dispatcher-type alltoall (the recipes' "
                          "choice) or --expert-tensor-parallel-size 1")
    out.extend(["--moe-token-dispatcher", "allgather"])


def _translate_one(name: str, inline: str | None, reader: _Reader, out: list[str], result: Translation, card,
                   recompute: dict, strict: bool) -> bool:
    """Translate one flag (True), or leave it to the native parser (False)."""
    if name in _RENAMED:
        native = _RENAMED[name]
        if native == name and not strict:
            return False  # a native flag typed as such
        out.extend([native, reader.value(name, inline)])
        return True
    if name in _SWITCHES:
        if _SWITCHES[name] == [name] and not strict:
            return False
        if name in ("--bf16", "--fp16") and _flag_value(out, "--dtype") == "fp8":
            return True  # Megatron trains in FP8 with --fp8-format, --bf16 before or after it
        out.extend(_SWITCHES[name])
        return True
    if name == "--fp8-format":
        value = reader.value(name, inline)  # e4m3 or hybrid: both run the GEMMs at the fp8 peak
        if value not in ("e4m3", "hybrid"):
            raise ConfigError(f"{reader.where}--fp8-format must be e4m3 or hybrid, got {value!r} (Megatron-LM's choices)")
        out.extend(["--dtype", "fp8"])
        return True
    if name == "--fp8-recipe":
        value = reader.value(name, inline)
        out.extend([name, _FP8_RECIPES.get(value, value)])
        return True
    if name in ("--virtual-pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank"):
        out.extend(["--virtual-stages", str(_positive_int(name, reader.value(name, inline), reader.where)),
                    "--megatron-interleaved"])
        return True
    if name == "--num-layers-per-virtual-pipeline-stage":
        out.extend(["--megatron-layers-per-virtual-stage",
                    str(_positive_int(name, reader.value(name, inline), reader.where))])
        return True
    if name == "--recompute-granularity":
        recompute[name] = reader.value(name, inline)
        return True
    if name in ("--recompute-method", "--recompute-num-layers") and strict:
        recompute[name] = reader.value(name, inline)  # applied under a granularity (_finish_recompute)
        return True
    if name == "--recompute-modules" and strict:
        # Megatron's list is nargs='*': the words up to the next flag
        words = [inline] if inline is not None else []
        while reader.more() and not reader.tokens[reader.i].startswith("--"):
            words.append(reader.take())
        if not words:
            raise ConfigError(f"{reader.where}--recompute-modules needs at least one module")
        recompute[name] = ",".join(words)
        return True
    if name in ARCH_VALUES:
        card.set(name, reader.value(name, inline), reader.where)
        return True
    if name in ARCH_SWITCHES:
        card.set(name, None, reader.where)
        return True
    if not strict:
        return False  # outside --megatron-args, everything else is the native parser's
    for table, sink in ((_NO_EFFECT, result.no_effect), (_NOT_MODELLED, result.not_modelled)):
        if name in table:
            values = [reader.value(name, inline)] if table[name] == 1 else []
            values += [reader.take() for _ in range(table[name] - 1) if reader.more()]
            sink.append(name)
            return True
    return False


def _finish_recompute(recompute: dict[str, str], out: list[str], result: Translation) -> None:
    """Megatron's ``--recompute-granularity`` as ``--recompute`` (the method, layer count and
    modules are native flags, checked against it by the strategy). A pasted line's method, layer
    count and modules without a granularity (Megatron's or a native ``--recompute``, or
    ``--recompute-activations``) recompute nothing in Megatron-Core, which reads them only under
    one: they are noted, not passed on (alone, the native flags would imply a granularity)."""
    granularity = recompute.pop("--recompute-granularity", None)
    if granularity is not None:
        if granularity not in ("full", "selective"):
            raise ConfigError(f"--recompute-granularity must be full or selective, got {granularity!r}")
        missing = [flag for flag in ("--recompute-method", "--recompute-num-layers")
                   if flag not in recompute and _flag_value(out, flag) is None]
        if granularity == "full" and missing:
            # Megatron-Core's TransformerConfig: "Using recompute_granularity: full so recompute_method
            # must be block or uniform", and recompute_num_layers between 1 and the layers of a stage
            raise ConfigError(f"--recompute-granularity full needs {' and '.join(missing)} (Megatron-Core refuses "
                              "full recomputation without them; triosim's own --recompute full re-runs every layer)")
        out.extend(["--recompute", granularity])
    governed = granularity is not None or _flag_value(out, "--recompute") is not None
    for name, value in recompute.items():
        # Megatron-Core reads the modules under selective granularity only (its default list,
        # core_attn, is there under full too): with full they change nothing
        ignored = name == "--recompute-modules" and (granularity or _flag_value(out, "--recompute")) == "full"
        if governed and not ignored:
            out.extend([name, value])
        else:
            result.no_effect.append(name)


def _finish_layers_per_virtual_stage(out: list[str]) -> None:
    """``--num-layers-per-virtual-pipeline-stage N``: V = layers / (pp · N), as Megatron derives it."""
    from .megatron_card import _flag_value, _remove_flag

    given = _flag_value(out, "--megatron-layers-per-virtual-stage")
    if given is None:
        return
    _remove_flag(out, "--megatron-layers-per-virtual-stage")
    # Megatron-LM's arguments.py refuses both (the layout and the uneven cuts give V otherwise)
    if _flag_value(out, "--pipeline-model-parallel-layout") is not None:
        raise ConfigError("--num-layers-per-virtual-pipeline-stage and --pipeline-model-parallel-layout exclude each "
                          "other (Megatron-LM: the layout's stages give the virtual stages)")
    for uneven in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"):
        if _flag_value(out, uneven) is not None:
            raise ConfigError(f"--num-layers-per-virtual-pipeline-stage with {uneven}: uneven pipeline stages need "
                              "--num-virtual-stages-per-pipeline-rank (Megatron-LM)")
    per_virtual = int(given)
    pp = _positive_int("--pipeline-model-parallel-size", _flag_value(out, "--pp") or "1", "")
    layers_text = _flag_value(out, "--num-layers")
    if layers_text is not None:
        layers = _positive_int("--num-layers", layers_text, "")
    elif _flag_value(out, "--model-file") is not None or _flag_value(out, "--model") is not None:
        from ..trace.model_card import get_card, read_card_file

        path = _flag_value(out, "--model-file")
        layers = (read_card_file(path) if path is not None else get_card(_flag_value(out, "--model"))).layers
    else:
        raise ConfigError("--num-layers-per-virtual-pipeline-stage needs --num-layers (or --model)")
    # the embedding and the loss count as layers here too, where the flags say so (Megatron's arguments.py)
    layers += sum(flag in out for flag in ("--account-for-embedding-in-pipeline-split",
                                           "--account-for-loss-in-pipeline-split"))
    if layers % (pp * per_virtual):
        raise ConfigError(f"--num-layers-per-virtual-pipeline-stage {per_virtual}: {layers} layers over "
                          f"--pipeline-model-parallel-size {pp} is not a whole number of virtual stages of "
                          f"{per_virtual} layers")
    out.extend(["--virtual-stages", str(layers // (pp * per_virtual)), "--megatron-interleaved"])


def _finish_layout(out: list[str]) -> None:
    """``--pipeline-model-parallel-layout``: its stages over ``--pp`` give the virtual stages per
    rank, as Megatron derives them; applied where no virtual stage count or other schedule is given."""
    from ..graph.pipeline.layer_layout import parse_layout
    from .megatron_card import _flag_value

    layout = _flag_value(out, "--pipeline-model-parallel-layout")
    if layout is None or _flag_value(out, "--virtual-stages") is not None:
        return
    if _flag_value(out, "--schedule") not in (None, "auto", "interleaved"):
        return
    if _flag_value(out, "--pp") is None and _flag_value(out, "--case") is not None:
        return  # -case 4's stages are its GPUs: the layout is checked against them
    pp = _positive_int("--pipeline-model-parallel-size", _flag_value(out, "--pp") or "1", "")
    stages = len(parse_layout(layout))
    if pp == 1 and stages > 1:  # it would ask for the interleaved schedule on one stage
        raise ConfigError(f"--pipeline-model-parallel-layout {layout!r} lays out {stages} stages, but there is one "
                          "pipeline stage: give --pp (and virtual stages: the layout's stages are pp × V)")
    if stages % pp == 0 and stages // pp > 1:
        out.extend(["--virtual-stages", str(stages // pp), "--megatron-interleaved"])


def _finish_overlap_p2p(out: list[str], result: Translation) -> None:
    """``--overlap-p2p-comm`` (``--overlap-p2p-communication``) overlaps the interleaved schedule's
    sends; outside it Megatron-LM turns the switch off (``arguments.py``; Megatron-Core's 1F1B
    refuses it), so it is noted as changing nothing there."""
    if _OVERLAP_P2P not in out:
        return
    interleaved = _flag_value(out, "--schedule") == "interleaved"
    while _OVERLAP_P2P in out:
        i = out.index(_OVERLAP_P2P)
        name = out[i + 1]
        out[i:i + 2] = ["--pipeline-send", "overlapped"] if interleaved else []
        if not interleaved and name not in result.no_effect:
            result.no_effect.append(name)


def _finish_virtual(out: list[str]) -> None:
    """``--virtual-pipeline-model-parallel-size`` implies Megatron's interleaved schedule."""
    if "--megatron-interleaved" in out:
        out.remove("--megatron-interleaved")
        if "--schedule" not in out:
            out.extend(["--schedule", "interleaved"])


__all__ = ["ARCH_SWITCHES", "ARCH_VALUES", "MEGATRON_ARGS", "Translation", "translate_argv"]
