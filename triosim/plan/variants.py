"""The settings between none, selective and full that a plan searches where they can matter:
activation offload, partial recomputation (Megatron-Core's ``recompute_method`` block with ``recompute_num_layers``
N: the first N layers of each model chunk re-run whole, the others keep everything) and larger
module sets of selective recomputation (``recompute_modules``).

They only add work to the candidate they refine (re-runs; the forward pass is the same), so
each is slower than its *parent* and saves memory: worth estimating only for a parent that does
not fit in memory and whose estimate beats the candidates that fit (the K-th fastest of them,
K the rows the plan DAG-times). For such a parent

- without recomputation: block recomputation of N layers a chunk, N from 1 to the chunk's layers
  − 1 (all of them is full recomputation, already searched); memory falls as N grows, time
  rises, so the plan estimates the N that halve the range until it has the smallest N that fits
  (about log2 of the chunk's layers estimates);
- without recomputation and below ZeRO-3, on a GPU whose device file gives its host link: activation offload of
  N layers a chunk (``--offload-activations N``: Megatron-Core's CPU offloading of the first N
  layers, never the chunk's last), N found the same way (the copies to host and back cost time
  where the compute beside them does not hide them);
- with selective recomputation of the attention core: core_attn with mlp, and with mlp and
  layernorm (:data:`MODULE_SETS`; Megatron-Core's ``core_attn`` is its default, ``mlp`` the
  part of a dense layer whose activations weigh most, ``layernorm`` the rest). Other sets
  (``layernorm`` without ``mlp``, ``mlp`` alone) are timed when pinned with
  ``--recompute-modules``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..graph.recompute_spec import RecomputeSpec
from .candidates import Candidate

MODULE_SETS = (("core_attn", "mlp"), ("core_attn", "layernorm", "mlp"))


def rewrite_key(spec: RecomputeSpec, cuts: frozenset[int] = frozenset()) -> str | tuple:
    """What names a recomputation setting's rewrite of the trace: the granularity alone for none,
    selective of the attention core and full of every layer (one checkpoint each), else the
    whole setting, with the chunks' cuts where the re-run layers depend on them."""
    if spec.label == spec.granularity:
        return spec.granularity
    return (spec.granularity, spec.method, spec.num_layers, tuple(sorted(spec.modules)),
            tuple(sorted(cuts)) if spec.partial else ())


def chunk_layers(c: Candidate, layers: int) -> int:
    """Transformer layers of each model chunk (pp · V chunks of equal layers)."""
    return max(1, layers // (c.pp * c.virtual))


def block(c: Candidate, n: int) -> Candidate:
    return replace(c, recompute="full", recompute_method="block", recompute_num_layers=n)


def module_variants(c: Candidate) -> list[Candidate]:
    """The larger module sets of a selective candidate."""
    return [replace(c, recompute_modules=m) for m in MODULE_SETS]


def offloaded(c: Candidate, n: int) -> Candidate:
    return replace(c, offload=str(n))


def smallest_fitting(c: Candidate, layers: int, make: Callable[[Candidate, int], Candidate],
                     fits: Callable[[Candidate], bool]) -> list[Candidate]:
    """The settings ``make(c, N)`` of ``c`` (no recomputation: :func:`block` or
    :func:`offloaded`) tried while halving 1 … chunk layers − 1 for the smallest N that fits
    (``fits``: estimates a candidate, True when it fits), in the order tried."""
    lo, hi = 1, chunk_layers(c, layers) - 1
    tried = []
    while lo <= hi:
        n = (lo + hi) // 2
        v = make(c, n)
        tried.append(v)
        if fits(v):
            hi = n - 1
        else:
            lo = n + 1
    return tried


def can_offload(c: Candidate) -> bool:
    """Offload is searched without recomputation and below ZeRO-3 (:mod:`triosim.plan.offload_profile`)."""
    return c.recompute == "none" and not (c.zero == 3 and c.data > 1)


def is_parent(c: Candidate) -> bool:
    """Whether the search may refine ``c``: none or plain selective, nothing pinned or offloaded."""
    return not c.detailed and c.recompute in ("none", "selective")


__all__ = ["MODULE_SETS", "block", "can_offload", "chunk_layers", "is_parent", "module_variants", "offloaded", "rewrite_key",
           "smallest_fitting"]
