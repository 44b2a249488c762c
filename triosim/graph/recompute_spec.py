"""One activation-recomputation setting with Megatron-Core's names (granularity, method, number
of layers, modules), checked; what each re-runs is :mod:`triosim.graph.recompute_units`."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

GRANULARITIES = ("none", "selective", "full")
METHODS = ("uniform", "block")
# Megatron-Core's recompute_modules; the MoE and MLA ones need layers this trace does not have.
MODULES = ("core_attn", "mlp", "layernorm", "moe_act", "mla_up_proj")
UNMODELLED_MODULES = ("moe", "shared_experts")
DEFAULT_MODULES = ("core_attn",)


@dataclass(frozen=True)
class RecomputeSpec:
    """One recomputation setting (see the module docstring): ``granularity`` none, selective or
    full; ``method``/``num_layers`` for full; ``modules`` for selective."""

    granularity: str = "none"
    method: str = "uniform"
    num_layers: int = 1
    modules: tuple[str, ...] = DEFAULT_MODULES

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ConfigError(f"--recompute must be none, selective or full, got {self.granularity!r}")
        if self.method not in METHODS:
            raise ConfigError(f"--recompute-method must be uniform or block, got {self.method!r}")
        if not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise ConfigError(f"--recompute-num-layers must be a positive integer, got {self.num_layers!r}")
        for m in self.modules:
            if m in UNMODELLED_MODULES:
                raise ConfigError(f"--recompute-modules {m}: recomputing that module is not modelled; modelled: "
                                  f"{', '.join(MODULES)}")
            if m not in MODULES:
                raise ConfigError(f"--recompute-modules: unknown module {m!r}; Megatron-Core's are "
                                  f"{', '.join(MODULES + UNMODELLED_MODULES)}")
        if not self.modules:
            raise ConfigError("--recompute-modules needs at least one module")

    @property
    def partial(self) -> bool:
        """Whether the re-run layers depend on the pipeline cuts (per-chunk blocks or groups)."""
        return self.granularity == "full" and (self.method == "block" or self.num_layers > 1)

    @property
    def label(self) -> str:
        """Short text: ``full``, ``full (block, 2 layers a chunk)``, ``selective (core_attn+mlp)``."""
        if self.granularity == "full":
            if self.method == "block":
                return f"full (block, {self.num_layers} layer{'s' if self.num_layers > 1 else ''} a chunk)"
            return "full" if self.num_layers == 1 else f"full (uniform, groups of {self.num_layers} layers)"
        if self.granularity == "selective" and self.modules != DEFAULT_MODULES:
            return f"selective ({'+'.join(self.modules)})"
        return self.granularity

    def facts(self) -> dict:
        """JSON-ready settings."""
        out: dict = {"granularity": self.granularity}
        if self.granularity == "full":
            out.update(method=self.method, num_layers=self.num_layers)
        elif self.granularity == "selective":
            out["modules"] = list(self.modules)
        return out


def as_spec(mode: str | RecomputeSpec) -> RecomputeSpec:
    return mode if isinstance(mode, RecomputeSpec) else RecomputeSpec(granularity=mode)



__all__ = ["DEFAULT_MODULES", "GRANULARITIES", "METHODS", "MODULES", "UNMODELLED_MODULES", "RecomputeSpec", "as_spec"]
