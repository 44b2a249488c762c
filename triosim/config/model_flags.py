"""The model-card flags of a run: ``--model NAME`` (a shipped card), ``--model-file FILE.yaml``
(your own) and ``--seq-len N`` (the card's sequence, overridden), and the trace they stand for.

A card run needs no trace directory: the training step's trace is built from the card's shapes
(:mod:`triosim.trace.synthetic_card`) with a few layers, repeated to the card's depth (or
``--num-layers``) as ``trace repeat`` does, and timed on the GPU of ``--gpu``/``--gpu-file``
(the trace holds no measured times, so ``--op-time-source`` must be roofline or auto). It is
built at the batch one pipeline stage computes at a time: ``-micro-batch-size`` when given, else
``-batch-size-sim``, else one sequence. Parameters, gradients and activations are in the run's
``--dtype`` (16-bit when none is given: bf16, or fp16 on a GPU without bf16).

The built trace is cached, keyed by everything it depends on (the card's shapes, the sequence,
the batch, the element size, the generator's version), under ``$TRIOSIM_CACHE_DIR``, else
``$XDG_CACHE_HOME/triosim``, else ``~/.cache/triosim``; each entry is written into a temporary
directory and renamed into place, so a run never reads half an entry.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ConfigError, TraceError
from ..trace.model_card import COUNT_FIELDS, ModelCard, get_card, read_card_file
from ..trace.synthetic_card import CARD_TRACE_VERSION, CardTraceSpec, write_card_trace

# dest -> default of the card flags: a run's configuration block records them only when set, so
# a run of a trace writes the block it always wrote.
MODEL_FLAG_DEFAULTS = {"model": None, "model_file": None, "seq_len": None, "mtp_layers": None}
TRACED_LAYERS = 2  # layers written; find_layers needs the layer at least twice to repeat it
# Bytes of parameters, gradients and activations per --dtype. auto (no --dtype): 16-bit, which
# the roofline runs as bf16, or as fp16 on a GPU without bf16 (a V100). fp8 math keeps 16-bit tensors.
ELEMENT_BYTES = {"auto": 2, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}


def add_model_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--model", default=None, metavar="NAME",
                   help="simulate a model card instead of a trace (`triosim models` lists them): the training "
                        "step is built from its shapes; needs --gpu")
    g.add_argument("--model-file", default=None, metavar="FILE.yaml",
                   help="a model card of your own (the fields of docs/models.md) instead of --model")
    g.add_argument("--seq-len", type=int, default=None, metavar="N",
                   help="with --model/--model-file: the training sequence length instead of the card's")
    g.add_argument("--mtp-layers", type=int, default=None, metavar="N",
                   help="with --model/--model-file: multi-token-prediction modules (Megatron's --mtp-num-layers) "
                        "instead of the card's (deepseek-v3: 1; 0 leaves them out)")


def model_given(args: argparse.Namespace) -> bool:
    return getattr(args, "model", None) is not None or getattr(args, "model_file", None) is not None


def check_model_flags(args: argparse.Namespace) -> None:
    """The flag combinations a card run refuses, before anything is read or built."""
    model, model_file, seq = getattr(args, "model", None), getattr(args, "model_file", None), getattr(args, "seq_len", None)
    for flag, value in (("--model", model), ("--model-file", model_file)):
        if value is not None and not str(value).strip():
            raise ConfigError(f"{flag} is empty; give a name or leave the flag out")
    if not model_given(args):
        if seq is not None:
            raise ConfigError("--seq-len sets a model card's sequence: give --model NAME or --model-file FILE")
        if getattr(args, "mtp_layers", None) is not None:
            raise ConfigError("--mtp-layers sets a model card's prediction modules: give --model NAME or --model-file FILE")
        return
    if model is not None and model_file is not None:
        raise ConfigError("--model and --model-file exclude each other: name a shipped card or give your own file")
    flag = "--model" if model is not None else "--model-file"
    if getattr(args, "trace_dir", None) is not None:
        raise ConfigError(f"{flag} builds the trace from the card: leave out -trace-dir (or leave out {flag})")
    if getattr(args, "batch_size", None) is not None:
        raise ConfigError(f"-batch-size is the batch a trace was recorded at; {flag} builds its trace at "
                          "-micro-batch-size (or -batch-size-sim): leave -batch-size out")
    if getattr(args, "gpu", None) is None and getattr(args, "gpu_file", None) is None:
        raise ConfigError(f"{flag} needs the GPU to time the card's ops on: give --gpu NAME (`triosim gpus` lists "
                          "them) or --gpu-file FILE")
    source = getattr(args, "op_time_source", "auto")
    if source not in ("auto", "roofline"):
        raise ConfigError(f"--op-time-source {source}: a model card's trace holds no measured times; use roofline "
                          "(or leave the flag out)")
    if getattr(args, "trace_gpu", None) is not None:
        raise ConfigError(f"--trace-gpu names the GPU a trace was timed on; {flag}'s trace was timed on none")
    if seq is not None and not 1 <= seq <= COUNT_FIELDS["seq_len"]:
        raise ConfigError(f"--seq-len must be between 1 and {COUNT_FIELDS['seq_len']:,}, got {seq}")


def load_card(args: argparse.Namespace) -> ModelCard:
    """The card of ``--model``/``--model-file``, at ``--seq-len`` when given."""
    model_file = getattr(args, "model_file", None)
    if model_file is not None:
        try:
            card = read_card_file(model_file)
        except ConfigError as exc:
            raise ConfigError(f"--model-file {exc}") from None
    else:
        card = get_card(args.model)
    mtp = getattr(args, "mtp_layers", None)
    if mtp is not None:
        if not 0 <= mtp <= 16:
            raise ConfigError(f"--mtp-layers must be a whole number from 0 to 16, got {mtp}")
        card = replace(card, mtp_layers=mtp)
    seq = getattr(args, "seq_len", None)
    if seq is None or seq == card.seq_len:
        return card
    if card.position == "learned" and seq > card.seq_len:
        raise ConfigError(f"--seq-len {seq}: {card.name} learns one position embedding per position, "
                          f"{card.seq_len} of them (use at most {card.seq_len})")
    return card.with_seq_len(seq)


def check_card_moe_flags(args: argparse.Namespace, card: ModelCard) -> None:
    """The MoE switches a card's shape rules out, as Megatron-Core's ``TransformerConfig`` checks
    them: the shared-expert overlap only with an all-to-all dispatcher, the expert-parallel
    all-to-all overlap with at most one multi-token-prediction layer."""
    dispatcher = getattr(args, "moe_token_dispatcher", "alltoall")
    if (getattr(args, "moe_shared_expert_overlap", False) and card.moe is not None and card.moe.shared_experts
            and dispatcher not in ("alltoall", "flex")):
        raise ConfigError(f"--moe-shared-expert-overlap needs --moe-token-dispatcher alltoall or flex, got {dispatcher} "
                          "(Megatron-Core overlaps the shared experts only with those dispatchers)")
    if getattr(args, "moe_a2a_overlap", False) and card.mtp_layers > 1:
        raise ConfigError(f"--moe-a2a-overlap runs at most one multi-token-prediction layer (Megatron-Core), the run "
                          f"has {card.mtp_layers}: give --mtp-layers 0 or 1")


def check_card_sequence_split(args: argparse.Namespace, card: ModelCard) -> None:
    """Sequence parallelism splits each context rank's tokens over the tensor-parallel ranks, as
    Megatron-Core's ``scatter_to_sequence_parallel_region`` does: it asserts that they divide."""
    tp, cp = getattr(args, "tp", None) or 1, getattr(args, "cp", None) or 1
    if not getattr(args, "sequence_parallel", False) or tp <= 1 or card.seq_len % cp:
        return  # nothing split (tp 1), or the context-parallel check names the sequence
    tokens = card.seq_len // cp
    if tokens % tp:
        held = f"each of the --cp {cp} context ranks' {tokens:,}" if cp > 1 else f"the sequence's {tokens:,}"
        raise ConfigError(f"--sequence-parallel splits {held} tokens over --tp {tp}: not a multiple (Megatron-Core "
                          f"requires it; use a --seq-len that is a multiple of {math.lcm(tp * cp, 2 * cp if cp > 1 else 1)})")


def sliding_window_layers(card: ModelCard, depth: int) -> bool:
    """Whether any of the run's ``depth`` layers attends through a sliding window."""
    window = card.sliding_window
    return window is not None and any(window.is_sliding(layer) for layer in range(depth))


def check_card_ring_attention(args: argparse.Namespace, card: ModelCard, depth: int) -> None:
    """Transformer Engine's ring attention (``--cp-comm-type p2p``) refuses sliding-window
    attention ("The context parallel running configs cannot support sliding window attention"):
    only the all-to-all and all-gather exchanges run it."""
    if (getattr(args, "cp", None) or 1) > 1 and str(getattr(args, "cp_comm_type", "p2p")) == "p2p" \
            and sliding_window_layers(card, depth):
        raise ConfigError(f"--cp {args.cp} with --cp-comm-type p2p: {card.name}'s sliding-window attention layers "
                          "do not run as ring attention (Transformer Engine refuses them): use --cp-comm-type a2a "
                          "or allgather")


def model_batch(args: argparse.Namespace) -> int:
    """Sequences per op in the built trace: the micro-batch, else the simulated batch, else 1."""
    for dest in ("micro_batch_size", "batch_size_sim"):
        value = getattr(args, dest, None)
        if value not in (None, -1):
            if not 1 <= value <= 2**31:
                flag = "-micro-batch-size" if dest == "micro_batch_size" else "-batch-size-sim"
                raise ConfigError(f"{flag} must be a positive integer, got {value}")
            return int(value)
    return 1


def model_depth(args: argparse.Namespace, card: ModelCard) -> int:
    """Layers simulated: ``--num-layers`` when given, else the card's."""
    layers = getattr(args, "num_layers", None)
    return card.layers if layers is None else layers


@dataclass(frozen=True)
class ModelTrace:
    """A card run's trace: its directory, the batch it was built at, and the depth to repeat
    its layers to (None: the directory already has every layer)."""

    trace_dir: Path
    batch: int
    repeat_to: int | None
    card: ModelCard


def cache_root() -> Path:
    """``$TRIOSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/triosim``, else ``~/.cache/triosim``."""
    given = os.environ.get("TRIOSIM_CACHE_DIR")
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "triosim"


def _entry_name(spec: CardTraceSpec) -> str:
    """The cache entry's directory name: the card's name made a safe file name (whatever the
    name holds, never a path out of the cache), then a hash of everything the trace depends on,
    the name included (meta.json records it)."""
    key = json.dumps({"card": spec.card.shape_key(), "name": spec.card.name, "batch": spec.batch_size,
                      "element_bytes": spec.element_bytes, "layers": spec.layers, "generator": CARD_TRACE_VERSION},
                     sort_keys=True)
    safe = re.sub(r"[^a-z0-9._+-]+", "_", spec.card.name.lower()).strip("._")[:40] or "card"
    return f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def cached_card_trace(spec: CardTraceSpec) -> Path:
    """The directory holding ``spec``'s trace, built (atomically) on first use."""
    root = cache_root() / "model-traces"
    final = root / _entry_name(spec)
    if (final / "meta.json").is_file():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    except OSError as exc:
        raise ConfigError(f"cannot write the model-trace cache {root} ({exc.strerror or exc}); set TRIOSIM_CACHE_DIR "
                          "to a writable directory") from None
    try:
        write_card_trace(tmp, spec)
        os.rename(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if (final / "meta.json").is_file():  # another process built the same entry first
            return final
        raise ConfigError(f"cannot write the model-trace cache {root} ({exc.strerror or exc}); set TRIOSIM_CACHE_DIR "
                          "to a writable directory") from None
    return final


def card_flag(args: argparse.Namespace) -> str | None:
    """How the run named its card, for errors: ``--model NAME`` or ``--model-file FILE`` (None:
    a trace run)."""
    if getattr(args, "model_file", None) is not None:
        return f"--model-file {args.model_file}"
    if getattr(args, "model", None) is not None:
        return f"--model {args.model}"
    return None


def card_trace_error(exc: TraceError, card: str, trace_dir: str | os.PathLike, layers: int | None) -> ConfigError:
    """A check that the trace built from a card failed, said of the card: the cached trace's
    ``tensor.csv:117`` means nothing to the user, the card's sizes and the flags do."""
    try:
        meta = json.loads((Path(trace_dir) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = {}
    seq, batch = meta.get("seq_len"), meta.get("batch_size")
    depth = layers if layers is not None else meta.get("traced_layers")  # None: not repeated, as built
    sizes = ", ".join(part for part in (
        f"sequence {seq:,}" if isinstance(seq, int) else "",
        f"{batch:,} sequence{'s' if batch != 1 else ''} per op" if isinstance(batch, int) else "",
        f"{depth:,} layers" if isinstance(depth, int) else "") if part)
    return ConfigError(f"{card}: the training step built from the card ({sizes}) is refused: {exc.message} "
                       "(a shorter --seq-len, a smaller -micro-batch-size or -batch-size-sim, or fewer --num-layers "
                       "make it smaller)")


def model_trace(args: argparse.Namespace, dtype: str) -> ModelTrace:
    """The trace of a card run (built and cached on first use); ``dtype`` is the run's --dtype."""
    card = load_card(args)
    check_card_moe_flags(args, card)
    check_card_sequence_split(args, card)
    depth = model_depth(args, card)
    if depth < 1:
        raise ConfigError(f"--num-layers must be a positive integer, got {depth}")
    check_card_ring_attention(args, card, depth)
    # layers of several kinds (dense and MoE, sliding and full attention) are each written:
    # repeating needs every layer alike
    traced = min(depth, TRACED_LAYERS) if card.uniform_layers else depth
    spec = CardTraceSpec(card, model_batch(args), ELEMENT_BYTES[dtype], traced)
    return ModelTrace(cached_card_trace(spec), spec.batch_size, depth if depth > traced else None, card)


__all__ = ["MODEL_FLAG_DEFAULTS", "ModelTrace", "add_model_flags", "cache_root", "cached_card_trace", "card_flag",
           "card_trace_error", "check_card_moe_flags", "check_card_ring_attention", "check_card_sequence_split",
           "check_model_flags", "load_card", "model_batch", "model_given", "model_trace", "sliding_window_layers"]
