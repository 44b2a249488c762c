"""FP8 training's scaling recipe as a searched axis: with ``--dtype fp8`` and no ``--fp8-recipe``,
every candidate is also tried with each other recipe the GPU runs (Transformer Engine's
delayed, current and blockwise scaling; MXFP8 on Blackwell). A recipe changes the cast
kernels' bytes (amax passes, per-block scales) and the FP8 copies a GPU holds, so each one has
its own trace sizes and op times: its own profile, built once, and its own memo of stage times.

Megatron-Core's rules hold: delayed scaling does not re-run norms or expert activations in FP8
(no ``layernorm``/``moe_act`` recomputation with it), and ``--fp8-param-gather`` is not
modelled with MXFP8 (Megatron-Core gathers those through the gradient buffer)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..trace.fp8 import DELAYED_REFUSED_MODULES
from .candidates import Candidate
from .profile import ModelProfile


def other_recipes(precision: object, device: object, pinned: bool) -> tuple[str, ...]:
    """The recipes a plan tries beside the run's own: none without FP8 training or when the
    user gave ``--fp8-recipe`` (a pin); MXFP8 not with ``--fp8-param-gather``."""
    fp8 = getattr(precision, "fp8", None)
    if fp8 is None or pinned or device is None:
        return ()
    return tuple(r for r in device.fp8_recipes if r != fp8.recipe and not (r == "mxfp8" and fp8.param_gather))


def run_recipe(profile: ModelProfile) -> str | None:
    """The run's own recipe (None: not FP8 training)."""
    fp8 = getattr((profile.parent or profile).precision, "fp8", None)
    return None if fp8 is None else fp8.recipe


def recipe_of(c: Candidate, profile: ModelProfile) -> str | None:
    """The recipe ``c`` trains with: its own where the plan tries another, else the run's."""
    return c.fp8_recipe or run_recipe(profile)


def refused_modules(recipe: str | None) -> frozenset[str]:
    """The modules selective recomputation may not re-run under ``recipe``."""
    return frozenset(DELAYED_REFUSED_MODULES) if recipe == "delayed" else frozenset()


def with_recipes(candidates: Sequence[Candidate], recipes: Sequence[str]) -> list[Candidate]:
    """``candidates``, then each of them with every recipe of ``recipes`` where Megatron-Core
    allows it (recipe by recipe, in enumeration order)."""
    out = list(candidates)
    for recipe in recipes:
        refused = refused_modules(recipe)
        out += [replace(c, fp8_recipe=recipe) for c in candidates
                if not (c.recompute == "selective" and refused & set(c.recompute_modules))]
    return out


def recipe_profile(profile: ModelProfile, recipe: str) -> ModelProfile:
    """The plan's profile with FP8 ``recipe`` instead of the run's: its own sizes and cast
    kernels, built once (kept in the root profile's memo)."""
    root = profile.parent or profile
    key = ("fp8 recipe", recipe)
    hit = root.memo.get(key)
    if hit is None:
        precision = replace(root.precision, fp8=replace(root.precision.fp8, recipe=recipe))
        hit = root.memo[key] = ModelProfile(root.raw, root.platform, root.reference_compat, precision,
                                            moe=root.moe, overlaps=root.overlaps)
    return hit


__all__ = ["other_recipes", "recipe_of", "recipe_profile", "refused_modules",
           "run_recipe", "with_recipes"]
