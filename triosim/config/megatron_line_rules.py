"""Rules of a pasted Megatron-LM line that span several of its words (``--megatron-args``):
Megatron-Core's CPU offloading, a switch with a layer count, and the per-layer list of
context-parallel exchanges."""

from __future__ import annotations

from ..errors import ConfigError
from .megatron_card import _flag_value, _remove_flag

CP_COMM_TYPE = "--cp-comm-type"


def one_cp_comm_type(tokens: list[str], where: str) -> list[str]:
    """``tokens`` with Megatron's ``--cp-comm-type`` list (``nargs='+'``: one type per layer, or
    one for all) as one value: the words repeat one type, else one line (triosim runs one type
    for every layer)."""
    out, i = [], 0
    while i < len(tokens):
        out.append(tokens[i])
        if tokens[i] != CP_COMM_TYPE:
            i += 1
            continue
        j = i + 1
        while j < len(tokens) and not tokens[j].startswith("--"):
            j += 1
        words = tokens[i + 1:j]
        if len(set(words)) > 1:
            raise ConfigError(f"{where}{CP_COMM_TYPE} {' '.join(words)}: one exchange per layer is not modelled; "
                              "give one type for every layer")
        out.extend(words[:1])
        i = j
    return out


def finish_cpu_offloading(tokens: list[str], out: list[str], start: int, no_effect: list[str]) -> None:
    """Megatron-Core offloads only with ``--cpu-offloading`` on, and refuses it with pipeline
    parallelism (``TransformerConfig``: "Currently there is no support for Pipeline parallelism
    with CPU offloading"). ``out[start:]`` is the line's translation, where
    ``--cpu-offloading-num-layers N`` became ``--offload-activations N``; ``no_effect``: the
    note's list."""
    switch = "--cpu-offloading" in tokens
    count = _flag_value(tokens, "--cpu-offloading-num-layers")
    if not switch and count is None:
        return
    pp = _flag_value(out, "--pp")
    if switch and pp is not None and pp != "1":
        raise ConfigError(f"--megatron-args: --cpu-offloading with --pp {pp} (--pipeline-model-parallel-size): Megatron-Core "
                          "refuses CPU offloading with pipeline parallelism (triosim's own --offload-activations "
                          "offloads each pipeline chunk's first layers)")
    if switch and count not in (None, "0"):
        return  # --offload-activations N
    # the count read only under the switch, or the switch with Megatron's default of 0 layers
    line = out[start:]
    _remove_flag(line, "--offload-activations")
    out[start:] = line
    no_effect.extend(name for name in ("--cpu-offloading", "--cpu-offloading-num-layers") if name in tokens
                     or any(t.startswith(name + "=") for t in tokens))


__all__ = ["finish_cpu_offloading", "one_cp_comm_type"]
