"""How many layers a trace's model has, for the check that every pipeline stage gets one.

A pipeline of P stages cuts the model between layers, so ``--pp`` cannot exceed the layer count.
The count is the first of these the trace has:

1. **transformer layers**: the attention blocks the Megatron detection finds
   (:func:`triosim.graph.tensor.megatron.find_blocks`), one per layer;
2. **layers with weights**: forward ops that read a parameter of two or more dimensions
   (a linear, convolution or embedding; biases and norm scales are 1-D and do not count),
   or any parameter when the trace records no shapes;
3. **forward ops**: the fallback for a trace without parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..trace import Trace


@dataclass(frozen=True)
class LayerCount:
    """A trace's layer count and what was counted (``"transformer layers"``, …)."""

    count: int
    unit: str


def _weight_layers(trace: Trace) -> int:
    params = set(trace.parameters)

    def matrix(k: str) -> bool:
        shape = trace.tensors[k].shape
        return shape is None or len(shape) >= 2  # no shape recorded: count it

    return sum(1 for i, op in enumerate(trace.ops)
               if op.stage == "forward" and any(k in params and matrix(k) for k in trace.reads[i]))


def count_layers(trace: Trace) -> LayerCount:
    """The model's layers by the first rule of the module docstring that finds any."""
    from .tensor.megatron import (
        find_blocks,  # imported here: the detection is only needed for this check
    )

    attention = sum(1 for b in find_blocks(trace) if b.kind == "attention")
    if attention:
        return LayerCount(attention, "transformer layers")
    weighted = _weight_layers(trace)
    if weighted:
        return LayerCount(weighted, "layers with weights")
    return LayerCount(sum(1 for op in trace.ops if op.stage == "forward"), "forward ops")


def check_pipeline_depth(trace: Trace, pp: int, virtual: int = 1, strategy: object | None = None) -> None:
    """One-line ConfigError when the pipeline's stages (``--pp`` × ``--virtual-stages``) are more
    than the model's layers (each stage needs one). Counting the embedding and the loss as layers
    (``strategy``'s layout flags, or what ``--partition auto`` picks on a model card) gives two
    more: then Megatron-Core's rules decide (:mod:`triosim.graph.pipeline.layer_layout`)."""
    stages = pp * virtual
    if stages <= 1:
        return
    if _layer_split_decides(trace, pp, virtual, strategy):
        return
    layers = count_layers(trace)
    if stages > layers.count:
        what = f"--pp {pp}" if virtual == 1 else f"--pp {pp} × --virtual-stages {virtual} = {stages} stages"
        raise ConfigError(f"{what} is more than the model's {layers.count} {layers.unit}: every pipeline "
                          f"stage needs at least one{_account_for_hint(trace, pp, virtual)}")


def _account_for_hint(trace: Trace, pp: int, virtual: int) -> str:
    """Where counting the embedding and/or the loss as layers would give every stage one."""
    from .pipeline.layer_layout import auto_split
    from .pipeline.stages import card_layer_extras, trace_layers

    layers = len(trace_layers(trace))
    split = auto_split(layers, pp, virtual, card_layer_extras(trace)[0]) if layers else None
    if split is None or not split.given:
        return ""
    return f" (Megatron-Core's {split.flags()} count the embedding/loss as layers and make them divide)"


def _layer_split_decides(trace: Trace, pp: int, virtual: int, strategy: object | None) -> bool:
    """Whether the stages are cut by a layer split other than the equal one: the layout flags
    (checked here, by Megatron-Core's rules, with their one-line errors), or ``--partition auto``'s
    account-for split on a model card whose layers do not divide equally."""
    if strategy is None:
        return False
    from .pipeline.layer_layout import LayerSplit, auto_split, megatron_layers_per_stage
    from .pipeline.stages import card_layer_extras, trace_layers  # the layers the partition cuts at

    split = LayerSplit.of(strategy)
    leading, mtp = card_layer_extras(trace)
    if split.given:
        layers = len(trace_layers(trace))
        if not layers:
            raise ConfigError(f"{split.flags()}: the trace has no repeated transformer layers to place")
        megatron_layers_per_stage(layers, pp, virtual, split, leading, mtp)
        return True
    if getattr(strategy, "partition", None) != "auto" or not trace.info.get("model_card"):
        return False
    layers = len(trace_layers(trace))
    auto = auto_split(layers, pp, virtual, leading) if layers else None
    return auto is not None and auto.given


def check_virtual_stages(trace: Trace, pp: int, virtual: int, partition: str, strategy: object | None = None) -> None:
    """On a model card's trace cut at equal layers (``--partition auto`` or ``layers``), refuse
    a ``--virtual-stages`` V that does not divide each pipeline stage's transformer layers, as
    Megatron-LM asserts (layers per pipeline stage % V == 0). Left alone: V = 1, a trace that
    is not a card's, a layer count ``--pp`` does not divide, other partitions, and a run whose
    layers are cut by a layout flag or by ``auto``'s account-for split (checked with it)."""
    if virtual <= 1 or partition not in ("auto", "layers") or not trace.info.get("model_card"):
        return
    if _layer_split_decides(trace, pp, virtual, strategy):
        return
    from .pipeline.stages import card_layer_extras, trace_layers  # the layers the partition cuts at

    layers = len(trace_layers(trace)) + card_layer_extras(trace)[0]  # Megatron counts every decoder layer
    if not layers or layers % pp:
        return
    per_stage = layers // pp
    if per_stage % virtual:
        legal = [v for v in range(1, per_stage + 1) if per_stage % v == 0]
        shown = ", ".join(map(str, legal[:-1])) + f" or {legal[-1]}" if len(legal) > 1 else str(legal[0])
        raise ConfigError(
            f"--virtual-stages {virtual} does not divide the {per_stage} transformer layers of each of the "
            f"--pp {pp} pipeline stages ({layers} layers; Megatron-LM requires layers per pipeline stage % "
            f"virtual stages == 0): use --virtual-stages {shown}"
        )


__all__ = ["LayerCount", "check_pipeline_depth", "check_virtual_stages", "count_layers"]
