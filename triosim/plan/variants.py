"""The settings between none, selective and full that a plan searches where they can matter:
partial recomputation (Megatron-Core's ``recompute_method`` block with ``recompute_num_layers``
N: the first N layers of each model chunk re-run whole, the others keep everything) and larger
module sets of selective recomputation (``recompute_modules``).

They only add work to the candidate they refine (re-runs; the forward pass is the same), so each is slower than its *parent* and saves memory: worth estimating only for a parent
that does not fit in memory and whose estimate could beat the best DAG time (below it plus
:data:`~triosim.plan.estimate.TIME_OVER_BOUND`; :func:`triosim.plan.search.refine_and_time`).
For such a parent

- without recomputation: block recomputation of N layers a chunk, N from 1 to the chunk's layers
  − 1 (all of them is full recomputation, already searched); memory falls as N grows, time
  rises, so the plan estimates the largest N (chunk layers − 1), then, where it fits, the N that
  halve the range until it has the smallest N that fits (about log2 of the chunk's layers
  estimates); none where full recomputation of the same candidate does not fit (it holds less
  than any block setting) or where re-running one layer a chunk cannot stay below the limit
  (:func:`block_may_help`);
- without recomputation, also activation offload (``--offload-activations N``: the first N
  layers of each chunk copy their activations to host memory), not under ZeRO-3: N from 1 to the
  chunk's layers − 1, memory falls and time rises as N grows, the smallest N that fits found as
  for block recomputation; where the GPU's device file gives no host link, none;
- with selective recomputation of the attention core: core_attn with mlp, and with mlp and
  layernorm, the largest first and the other only where it fits, none where full recomputation
  of the same candidate does not fit (:data:`MODULE_SETS`; Megatron-Core's ``core_attn`` is its default, ``mlp`` the
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


def offloaded(c: Candidate, n: int) -> Candidate:
    return replace(c, offload=str(n))


def may_offload(c: Candidate) -> bool:
    """Whether the search tries activation offload on ``c`` (a parent without recomputation):
    not under ZeRO-3, whose unit gathers the estimate's copies do not follow
    (:mod:`triosim.plan.offload_profile`), nor with expert parallelism's token exchanges, which
    the copies run beside in the DAG and not in the estimate (+2.7 … +5.7 % above the DAG)."""
    return c.recompute == "none" and c.zero < 3 and c.ep == 1 and c.etp == 1


def module_variants(c: Candidate, fits: Callable[[Candidate], bool],
                    refused: frozenset[str] = frozenset()) -> list[Candidate]:
    """The larger module sets of a selective candidate, in the order tried: the largest first,
    and nothing more when it does not fit (a subset holds more); none with a ``refused`` module
    (delayed FP8 scaling's)."""
    tried = []
    for m in MODULE_SETS[::-1]:
        if refused & set(m):
            continue
        tried.append(replace(c, recompute_modules=m))
        if not fits(tried[-1]):
            break
    return tried


def smallest_fitting(c: Candidate, layers: int, make: Callable[[Candidate, int], Candidate],
                     fits: Callable[[Candidate], bool]) -> list[Candidate]:
    """The settings ``make(c, N)`` of ``c`` (no recomputation: :func:`block`) tried while halving 1 … chunk layers − 1 for the smallest N that fits
    (``fits``: estimates a candidate, True when it fits), in the order tried: the largest N
    first, and nothing more when it does not fit."""
    lo, hi = 1, chunk_layers(c, layers) - 1
    if hi < lo:
        return []
    tried = [make(c, hi)]
    if not fits(tried[0]):
        return tried
    hi -= 1
    while lo <= hi:
        n = (lo + hi) // 2
        v = make(c, n)
        tried.append(v)
        if fits(v):
            hi = n - 1
        else:
            lo = n + 1
    return tried


# Of the time full recomputation adds per layer, the least a block setting is taken to add per
# layer it re-runs (some re-runs hide behind a block's wait for its input, as full
# recomputation's do; a safety margin, not a proven bound).
BLOCK_SHARE = 0.5


def block_may_help(parent, full, layers: int, limit_s: float) -> bool:
    """Whether a block setting of ``parent`` (a row without recomputation) can fit and be faster
    than ``limit_s``, by its sibling ``full`` (the same candidate with full recomputation):
    full recomputation holds less than any block setting, so none fits where it does not; and
    re-running one layer a chunk adds at least :data:`BLOCK_SHARE` of 1 / (chunk layers) of
    what full recomputation adds."""
    if not full.feasible or full.estimate is None:
        return False
    added = max(0.0, full.estimate.time_s - parent.estimate.time_s)
    return parent.estimate.time_s + BLOCK_SHARE * added / chunk_layers(parent.candidate, layers) < limit_s


def is_parent(c: Candidate) -> bool:
    """Whether the search may refine ``c``: none or plain selective, nothing pinned or offloaded."""
    return not c.detailed and c.recompute in ("none", "selective")


__all__ = ["BLOCK_SHARE", "MODULE_SETS", "block", "block_may_help", "chunk_layers", "is_parent", "may_offload",
           "module_variants", "offloaded", "rewrite_key", "smallest_fitting"]

