"""Megatron-Core's pipeline layouts: how many transformer layers each (virtual) pipeline stage
builds when the stages are cut at layers (``--partition layers``, or ``auto`` on a model card).

Stages are numbered as the schedules number them: virtual stage v of pipeline rank p is stage
c = v·P + p (P ranks, V virtual stages per rank, S = P·V stages), Megatron's order of model
chunks. The rules, as Megatron-Core applies them (``get_num_layers_to_build`` in
``megatron/core/transformer/transformer_block.py``, ``get_transformer_layer_offset`` in
``transformer_layer.py``, ``PipelineParallelLayerLayout`` in
``pipeline_parallel_layer_layout.py``; the argument checks of ``megatron/training/arguments.py``):

- **equal** (no flag): L layers, L/P per rank, L/(P·V) per stage; P must divide L and V the
  layers of a rank.
- **account for the embedding / the loss** (``--account-for-embedding-in-pipeline-split``,
  ``--account-for-loss-in-pipeline-split``): the embedding (the loss) counts as one layer in the
  split, so L + 1 (or L + 2) layers divide as above and the first (last) stage builds one
  transformer layer fewer. 126 layers on P = 16, V = 8: 128 stages of 1, the first holding only
  the embedding and the last only the final norm, the output layer and the loss.
- **uneven first/last stages** (``--decoder-first-pipeline-num-layers F``,
  ``--decoder-last-pipeline-num-layers K``): rank 0 holds F layers and rank P−1 K, the others
  share the rest equally; under the interleaved schedule every rank's layers divide by V.
  Not together with the account-for flags (Megatron-Core asserts it).
- **layout string** (``--pipeline-model-parallel-layout``): Megatron's syntax, one stage per
  ``|`` in stage order: ``E`` the embedding, ``t`` a transformer layer, ``L`` the loss, ``x*n``
  and ``(…)*n`` repeat, commas are cosmetic. ``"Et*3|(tt|)*29,m|L"`` is Megatron's own example.
  The layout has P·V stages, ``E`` first and ``L`` last once each, and exactly L ``t``; ``m``
  places the multi-token-prediction modules (``--mtp-layers``): exactly that many, after every
  ``t``, all on one stage.

Megatron counts every decoder layer. A model card whose first layers differ from the repeated
ones (DeepSeek-V3's 3 dense layers before 58 MoE layers) has them in its trace before the
first repeated layer, where the embedding is: the rules count them (61 layers for DeepSeek-V3)
and they must fall on the first stage. The MTP modules run after the loss, on the last stage;
a layout that puts ``m`` on another stage (Megatron's standalone MTP) is refused.

Which rule a run takes is :func:`choose_split`'s: the flags when given, else the equal split,
else (``--partition auto`` on a model card) the account-for split that makes the layers divide
(:func:`auto_split`). What comes before the first transformer layer runs on stage 0, what comes after the last one
(final norm, output layer, loss) on the last stage. triosim needs every stage to hold some op,
so a stage with no layer at all (possible in a Megatron layout) is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from ...limits import MAX_LAYERS

EMBEDDING, DECODER, LOSS, MTP = "E", "t", "L", "m"
LAYOUT_FLAG = "--pipeline-model-parallel-layout"
EMBEDDING_FLAG = "--account-for-embedding-in-pipeline-split"
LOSS_FLAG = "--account-for-loss-in-pipeline-split"
FIRST_FLAG = "--decoder-first-pipeline-num-layers"
LAST_FLAG = "--decoder-last-pipeline-num-layers"


@dataclass(frozen=True)
class LayerSplit:
    """A run's layout flags (Megatron-Core's names): which rule cuts the layers into stages."""

    account_for_embedding: bool = False
    account_for_loss: bool = False
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    layout: str | None = None

    @classmethod
    def of(cls, options: Any) -> LayerSplit:
        """The split of a Strategy (or of parsed flags): its Megatron-named fields."""
        return cls(bool(getattr(options, "account_for_embedding_in_pipeline_split", False)),
                   bool(getattr(options, "account_for_loss_in_pipeline_split", False)),
                   getattr(options, "decoder_first_pipeline_num_layers", None),
                   getattr(options, "decoder_last_pipeline_num_layers", None),
                   getattr(options, "pipeline_model_parallel_layout", None))

    @property
    def given(self) -> bool:
        """Whether any layout flag is set (otherwise: equal layers per stage)."""
        return self != LayerSplit()

    def flags(self) -> str:
        """The flags as typed, e.g. ``--account-for-embedding-in-pipeline-split``."""
        out = [EMBEDDING_FLAG] * self.account_for_embedding + [LOSS_FLAG] * self.account_for_loss
        if self.first_stage_layers is not None:
            out.append(f"{FIRST_FLAG} {self.first_stage_layers}")
        if self.last_stage_layers is not None:
            out.append(f"{LAST_FLAG} {self.last_stage_layers}")
        if self.layout is not None:
            out.append(f"{LAYOUT_FLAG} {self.layout!r}")
        return " ".join(out)

    def counted(self) -> str:
        """What the account-for flags count as layers, e.g. ``the embedding and the loss counted as
        one layer each``."""
        what = [w for w, on in (("the embedding", self.account_for_embedding), ("the loss", self.account_for_loss))
                if on]
        return f"{' and '.join(what)} counted as one layer" + (" each" if len(what) > 1 else "")

    def check(self) -> None:
        """The combinations Megatron-Core refuses, as one-line errors."""
        uneven = self.first_stage_layers is not None or self.last_stage_layers is not None
        for flag, value in ((FIRST_FLAG, self.first_stage_layers), (LAST_FLAG, self.last_stage_layers)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{flag} must be a positive integer, got {value!r}")
        if uneven and (self.account_for_embedding or self.account_for_loss):
            raise ConfigError(f"{FIRST_FLAG}/{LAST_FLAG} cannot be combined with {EMBEDDING_FLAG}/{LOSS_FLAG} "
                              "(Megatron-Core: no standalone embedding or loss stage with uneven pipeline stages)")
        if self.layout is not None and (uneven or self.account_for_embedding or self.account_for_loss):
            raise ConfigError(f"{LAYOUT_FLAG} places every layer itself: leave out {FIRST_FLAG}, {LAST_FLAG}, "
                              f"{EMBEDDING_FLAG} and {LOSS_FLAG}")


# Letters and stage marks of an unrolled layout: every layer, its stage's '|', E, L and m.
MAX_LAYOUT_LETTERS = 2 * MAX_LAYERS + 16


def parse_layout(text: str) -> tuple[tuple[str, ...], ...]:
    """Megatron's layout string as its stages in order, each the tuple of its layer letters
    (``PipelineParallelLayerLayout.parse_str_to_list``'s syntax)."""
    flat = str(text).replace(",", "")

    def unroll(m: re.Match) -> str:
        # a layout places each layer once: a repeat past the layer limit is a typo, and unrolled
        # it would take the machine's memory
        if len(m.group(1)) * int(m.group(2)) > MAX_LAYOUT_LETTERS:
            raise ConfigError(f"{LAYOUT_FLAG} {text!r}: {m.group(0)!r} unrolls to more than the limit of "
                              f"{MAX_LAYERS:,} layers")
        return m.group(1) * int(m.group(2))

    # (…)*n first, then x*n, as Megatron unrolls them
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        flat = re.sub(pattern, unroll, flat)
        if len(flat) > MAX_LAYOUT_LETTERS:
            raise ConfigError(f"{LAYOUT_FLAG} {text!r} unrolls to more than the limit of {MAX_LAYERS:,} layers")
    stages = []
    for part in flat.split("|"):
        bad = sorted(set(part) - {EMBEDDING, DECODER, LOSS, MTP})
        if bad:
            raise ConfigError(f"{LAYOUT_FLAG} {text!r}: {bad[0]!r} is not a layer letter (E embedding, t transformer "
                              "layer, L loss, m multi-token prediction; x*n and (...)*n repeat, | ends a stage)")
        stages.append(tuple(part))
    return tuple(stages)


def _stage_name(c: int, ranks: int, virtual: int) -> str:
    return f"stage {c}" + (f" (virtual stage {c // ranks} of rank {c % ranks})" if virtual > 1 else "")


def _layout_counts(layout: str, num_layers: int, ranks: int, virtual: int, leading: int = 0,
                   mtp: int = 0) -> tuple[int, ...]:
    """Decoder layers (``t``) per stage of a layout string, checked as Megatron-Core checks it
    (``PipelineParallelLayerLayout.__init__`` and ``validate_layer_layout``)."""
    stages = parse_layout(layout)
    if len(stages) % ranks:
        raise ConfigError(f"{LAYOUT_FLAG} {layout!r} has {_count(len(stages), 'stage')}, not a multiple of --pp {ranks} "
                          "(Megatron-Core: the layout's length must be divisible by the pipeline size)")
    if len(stages) != ranks * virtual:
        v = len(stages) // ranks
        hint = "leave out --schedule interleaved" if v == 1 else f"use --schedule interleaved --virtual-stages {v}"
        raise ConfigError(f"{LAYOUT_FLAG} {layout!r} has {_count(len(stages), 'stage')} = --pp {ranks} × "
                          f"{_count(v, 'virtual stage')}, "
                          f"but the run has {ranks * virtual}: {hint}")
    flat = [x for s in stages for x in s]
    if flat.count(EMBEDDING) != 1 or flat[0] != EMBEDDING:
        raise ConfigError(f"{LAYOUT_FLAG} {layout!r}: E (the embedding) must come first, once")
    if flat.count(LOSS) != 1 or flat[-1] != LOSS:
        raise ConfigError(f"{LAYOUT_FLAG} {layout!r}: L (the loss) must come last, once")
    if flat.count(MTP) != mtp:
        has = f"{mtp} (--mtp-layers)" if mtp else "none"
        raise ConfigError(f"{LAYOUT_FLAG} {layout!r} places {_count(flat.count(MTP), 'multi-token-prediction layer')} "
                          "(m), the "
                          f"model has {has}")
    if mtp:
        where = [c for c, s in enumerate(stages) if MTP in s]
        if where != [len(stages) - 1]:
            raise ConfigError(f"{LAYOUT_FLAG} {layout!r}: m on {_stage_name(where[0], ranks, virtual)}; triosim runs "
                              "the multi-token-prediction layers after the loss, on the last stage (Megatron's "
                              "standalone MTP on another stage is not modelled)")
        if DECODER in flat[flat.index(MTP):]:
            raise ConfigError(f"{LAYOUT_FLAG} {layout!r}: a t after m (Megatron-Core: decoder layers must be placed "
                              "before MTP layers)")
    counts = tuple(s.count(DECODER) for s in stages)
    if sum(counts) != num_layers + leading:
        what = (f"{num_layers + leading} ({leading} before the repeated layers, {num_layers} repeated)" if leading
                else f"{num_layers}")
        raise ConfigError(f"{LAYOUT_FLAG} {layout!r} places {sum(counts)} transformer layers (t), the model has "
                          f"{what}")
    for c, s in enumerate(stages):
        if not s:
            raise ConfigError(f"{LAYOUT_FLAG} {layout!r}: {_stage_name(c, ranks, virtual)} is empty; every pipeline "
                              "stage needs at least one layer")
    return counts


def _uneven_rank_layers(num_layers: int, ranks: int, split: LayerSplit) -> list[int]:
    """Transformer layers per pipeline rank with uneven first/last stages (Megatron-Core's
    ``get_num_layers_to_build``: the middle ranks share what the first and last leave)."""
    if ranks < 2:
        raise ConfigError(f"{FIRST_FLAG}/{LAST_FLAG} need --pp 2 or more (one stage is both first and last)")
    first, last = split.first_stage_layers, split.last_stage_layers
    rest = num_layers - (first or 0) - (last or 0)
    middle = ranks - (first is not None) - (last is not None)
    if rest < 0 or (middle == 0 and rest != 0):
        raise ConfigError(f"{split.flags()}: the first and last stages' layers do not add up with the model's "
                          f"{num_layers} transformer layers over --pp {ranks}")
    if middle and rest % middle:
        raise ConfigError(f"{split.flags()}: the {rest} layers left over do not divide over the {middle} other "
                          f"pipeline stages (Megatron-Core: with uneven pipelining the left over layers must be "
                          "divisible by left over stages)")
    per = rest // middle if middle else 0
    out = [per] * ranks
    if first is not None:
        out[0] = first
    if last is not None:
        out[-1] = last
    return out


def megatron_layers_per_stage(num_layers: int, ranks: int, virtual: int = 1, split: LayerSplit = LayerSplit(),
                              leading: int = 0, mtp: int = 0) -> tuple[int, ...]:
    """Repeated transformer layers each of the ``ranks × virtual`` stages builds (stage c =
    v·P + p), by Megatron-Core's rules (module docstring) over the model's ``leading +
    num_layers`` decoder layers, the ``leading`` ones (before the repeated layers) taken off the
    first stage; ``mtp``: the model's multi-token-prediction layers (a layout string's ``m``). A
    one-line ConfigError naming the rule a split breaks."""
    split.check()
    decoder = megatron_decoder_layers(num_layers + leading, ranks, virtual, split, mtp)
    if decoder[0] < leading:
        rule = split.flags() if split.given else "the equal split"
        raise ConfigError(f"{rule}: the first stage gets {decoder[0]} decoder layers, but the model's first "
                          f"{leading} (the ones before its repeated layers) run there with the embedding; give the "
                          f"first stage at least {leading}")
    return (decoder[0] - leading, *decoder[1:])


def megatron_decoder_layers(num_layers: int, ranks: int, virtual: int = 1, split: LayerSplit = LayerSplit(),
                            mtp: int = 0) -> tuple[int, ...]:
    """Decoder layers each of the ``ranks × virtual`` stages builds (stage c = v·P + p) by
    Megatron-Core's rules for a model of ``num_layers`` decoder layers (module docstring); a
    one-line ConfigError naming the rule a split breaks."""
    n = ranks * virtual
    if split.layout is not None:
        return _layout_counts(split.layout, num_layers, ranks, virtual, 0, mtp)
    if split.first_stage_layers is not None or split.last_stage_layers is not None:
        per_rank = _uneven_rank_layers(num_layers, ranks, split)
        rule = f"{split.flags()}: "
    else:
        total = num_layers + split.account_for_embedding + split.account_for_loss
        counted = (f"{num_layers} + {total - num_layers} = {total} pipeline layers ({split.counted()})"
                   if total != num_layers else f"{num_layers} transformer layers")
        if total % ranks:
            hint = "" if split.given else (f"; {EMBEDDING_FLAG} and/or {LOSS_FLAG} count them as one layer each, "
                                           "or use --partition optimal")
            raise ConfigError(f"{counted} do not divide over --pp {ranks} (Megatron-LM: the number of layers must "
                              f"be divisible by the pipeline-model-parallel size){hint}")
        per_rank = [total // ranks] * ranks
        rule = ""
    for p, layers in enumerate(per_rank):
        if layers % virtual:
            raise ConfigError(f"{rule}--virtual-stages {virtual} does not divide the {layers} "
                              f"layer{'s' if layers != 1 else ''} of pipeline rank "
                              f"{p} (Megatron-Core: layers per pipeline rank must be divisible by the virtual "
                              "pipeline size)")
    counts = [per_rank[c % ranks] // virtual for c in range(n)]
    if split.account_for_embedding:
        counts[0] -= 1  # the embedding takes the first stage's place of a layer
    if split.account_for_loss:
        counts[-1] -= 1  # the loss takes the last stage's
    for c, k in enumerate(counts):
        alone = (c == 0 and split.account_for_embedding) or (c == n - 1 and split.account_for_loss)
        if k < 0 or (k == 0 and not alone):
            raise ConfigError(f"{rule or split.flags() + ': ' if split.given else ''}{_stage_name(c, ranks, virtual)} "
                              "gets no transformer layer; every pipeline stage needs at least one layer")
    return tuple(counts)


def auto_split(num_layers: int, ranks: int, virtual: int = 1, leading: int = 0) -> LayerSplit | None:
    """The split ``--partition auto`` takes on a model card: equal layers when they divide, else
    the embedding and the loss counted as layers when that makes them divide, else the loss alone
    (the output layer and loss weigh more than the embedding lookup), else the embedding alone;
    None when none does. ``leading``: decoder layers before the repeated ones (on the first stage)."""
    for split in (LayerSplit(), LayerSplit(True, True), LayerSplit(False, True), LayerSplit(True, False)):
        try:
            megatron_layers_per_stage(num_layers, ranks, virtual, split, leading)
        except ConfigError:
            continue
        return split
    return None


def choose_split(options: Any, ranks: int, virtual: int, num_layers: int, partition: str,
                 card: bool, leading: int = 0) -> tuple[LayerSplit | None, str | None]:
    """The rule that cuts a trace's ``num_layers`` repeated layers into stages, and a line saying
    which: the layout flags of ``options`` (a Strategy) when given; for ``partition`` ``layers``
    (what ``--partition`` resolved to) the equal split; with ``--partition auto`` on a model card
    (``card``) whose layers do not divide equally, the account-for split that makes them
    (:func:`auto_split`). (None, None): not cut at layers. ``leading``: decoder layers before
    the repeated ones, which Megatron's rules count too."""
    split = LayerSplit.of(options)
    if split.given:
        if not num_layers:
            raise ConfigError(f"{split.flags()}: the trace has no repeated transformer layers to place")
        return split, f"{split.flags()} (as given)"
    if partition == "layers":
        return split, None
    if getattr(options, "partition", None) != "auto" or not card or not num_layers:
        return None, None
    auto = auto_split(num_layers, ranks, virtual, leading)
    if auto is None or not auto.given:
        return None, None
    return auto, (f"auto: {num_layers + leading} transformer layers do not divide over {ranks * virtual} stages, with "
                  f"{auto.counted()} they do ({auto.flags()}, as Megatron-Core)")


def layout_text(counts: tuple[int, ...] | list[int], leading: int = 0, mtp: int = 0) -> str:
    """The stages as a Megatron layout string (E on the first, L on the last; repeats folded),
    e.g. ``Et|(tt|)*62tL`` for 126 layers over 64 stages with both account-for flags, or ``E|(t|)*126L``.
    ``counts``: repeated layers per stage; ``leading`` decoder layers more on the first stage and
    ``mtp`` multi-token-prediction layers (``m``) on the last, before the loss."""
    counts = [k + (leading if c == 0 else 0) for c, k in enumerate(counts)]
    stages = ["t" * k if k < 4 else f"t*{k}" for k in counts]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + MTP * mtp + "L"
    out: list[str] = []
    i = 0
    while i < len(stages):
        j = i  # a run of equal stages, the last stage always on its own (it ends without "|")
        while j + 2 < len(stages) and stages[j + 1] == stages[i]:
            j += 1
        run = j - i + 1
        tail = "" if j == len(stages) - 1 else "|"
        out.append(f"({stages[i]}|)*{run}" if run > 2 else "|".join(stages[i:j + 1]) + tail)
        i = j + 1
    return "".join(out)



def _count(n: int, noun: str) -> str:
    """``1 stage``, ``3 stages``: a count in a message."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"

__all__ = ["LayerSplit", "auto_split", "choose_split", "layout_text", "megatron_decoder_layers", "megatron_layers_per_stage",
           "parse_layout"]
