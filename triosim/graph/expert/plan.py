"""What one expert-parallel rank runs and holds, and the closed forms of its token exchange.

With ``--ep N`` (Megatron-Core's ``--expert-model-parallel-size``) and *parallel folding*
(Liu et al. 2025, "MoE Parallel Folding"; expert tensor parallelism 1), the GPUs of a pipeline
stage are numbered twice: the attention and dense layers on ``tp × cp × dp``, the experts on
``ep × edp`` over the same ``tp·cp·dp`` GPUs (flattened rank x = t + tp·d, tp innermost):

- **expert-parallel group**: the N consecutive flattened ranks; each holds E/N of every MoE
  layer's experts (weights, gradients, optimizer state 1/N), and the tokens its own attention
  produced are sent to the ranks holding their experts (*dispatch*) and back (*combine*);
- **expert-data-parallel group** (edp = tp·cp·dp / N): the ranks holding the same experts; the
  expert gradients are reduced there, and ZeRO / the distributed optimizer shards expert state
  over it (dense gradients and state as before, over dp × cp).

Token exchange (``--moe-token-dispatcher``), per MoE layer, on the rank's T·k permuted rows of
``h`` elements (the trace's ``moe::permute`` output, R bytes on the rank):

- ``alltoall``: an all-to-all of R before the first grouped GEMM (dispatch) and of the second
  GEMM's output, R, after it (combine); backward the same two of the gradients, mirrored. Under
  balance each rank keeps R/N and sends R·(N−1)/N (:func:`alltoall_wire_bytes`).
- ``allgather``: the un-permuted tokens (X bytes, ``[b, s, h]``) all-gathered over the group
  (each rank then picks the rows of its experts) and the expert outputs reduce-scattered back:
  payload N·X each way.
- ``flex`` (DeepEP's hierarchical dispatch): an all-to-all inside each node of the group over
  NVLink, then one between the nodes over the NICs with each token sent once per destination
  node (:func:`flex_node_fraction` of R instead of R·(nodes−1)/nodes): two all-to-alls each way.

Grouped GEMMs: under balance every expert gets T·k/E rows, so an expert rank does the same FLOPs
as one GPU holding every expert (T·k rows over its E/N experts), reading 1/N of the weights.
``--moe-imbalance F`` gives the busiest expert F times the mean (the others sharing what is left
evenly): the busiest rank's rows, and the tokens sent to it, are :func:`busiest_rank_factor`
times the mean; every rank waits for it at the combine, so the DAG runs every rank at that load.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...compute.fp8_linears import find_fp8_linears
from ...compute.op_kinds import base_name
from ...errors import ConfigError
from ...trace import Trace
from ...trace.fp8 import Fp8Training, saved_input_elements
from ..data.zero import BufferRoles, zero_divisor
from ..tensor.per_op import optimizer_state_of

DISPATCHERS = ("alltoall", "allgather", "flex")
FORWARD, BACKWARD = "forward", "backward"


# ----------------------------------------------------------------------------- closed forms


def busiest_rank_factor(experts: int, ep: int, imbalance: float) -> float:
    """Rows on the busiest expert rank / rows under balance: its E/N experts hold the busiest one
    at F·m and the rest at m·(E − F)/(E − 1) (tokens are conserved); 1 at F = 1."""
    local = experts // ep
    if experts == 1 or imbalance == 1.0:
        return 1.0
    rest = (experts - imbalance) / (experts - 1)
    return (imbalance + (local - 1) * rest) / local


def alltoall_wire_bytes(routed_bytes: int, ep: int) -> float:
    """Bytes one rank sends in one uniform all-to-all of its ``routed_bytes``: (N−1)/N of them."""
    return routed_bytes * (ep - 1) / ep if ep > 1 else 0.0


def flex_node_fraction(top_k: int, nodes: int) -> float:
    """DeepEP's inter-node bytes / R: a token goes once to each other node among its k experts'
    nodes. With the experts spread evenly over ``nodes`` nodes, each other node is reached with
    probability 1 − (1 − 1/nodes)^k, so a rank sends T·h·(nodes − 1)·(1 − (1 − 1/nodes)^k) bytes
    between nodes, of R = T·k·h."""
    if nodes < 2:
        return 0.0
    return (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** top_k) / top_k


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class ExpertOp:
    """A grouped-GEMM op with a token exchange before (``"before"``) or after it (``"after"``):
    ``routed`` the T·k-row buffer exchanged, ``tokens`` the layer's un-permuted ``[b, s, h]``
    buffer (the all-gather dispatcher's payload)."""

    index: int
    phase: str
    when: str
    routed: str
    tokens: str
    source: int | None = None  # the op that writes ``routed`` (a dispatch may start right after it)


@dataclass(frozen=True)
class ExpertPlan:
    """The MoE layers of a trace under ``degree`` expert-parallel ranks."""

    degree: int
    dispatcher: str
    imbalance: float
    experts: int
    top_k: int
    factor: float  # busiest_rank_factor
    ops: dict[int, ExpertOp]
    params: frozenset[str]  # every expert parameter (weights and biases of the grouped GEMMs)
    edp: int  # expert-data-parallel ranks
    etp: int = 1  # expert-tensor-parallel ranks (each holds 1/etp of every local expert's width)
    shared_overlap: bool = False  # a dispatch starts after its permutation, beside the shared expert
    delay_wgrad: bool = False  # the experts' weight gradients beside the backward's combine (delay_wgrad_compute)
    # FP8 training: a buffer an FP8 linear reads holds the FP8 copy it saves (and ``kept`` bytes
    # an element of the bf16 tensor when another op reads that too), but the tokens travel in
    # ``width`` bytes an element and are quantized after the exchange (Megatron-Core's
    # dispatchers send bf16: ``moe_dispatch_fwd_dtype``'s default). ``rows_kept`` and
    # ``tokens_kept``: None where the dispatched rows or the un-permuted tokens are no FP8 input.
    fp8: Fp8Training | None = None
    rows_kept: int | None = None
    tokens_kept: int | None = None
    width: int = 2

    def wire_bytes(self, e: ExpertOp, stored: int, tokens: bool = False) -> int:
        """Bytes of ``e``'s exchanged rows (``tokens``: its un-permuted tokens) as they travel,
        from their ``stored`` bytes."""
        kept = self.tokens_kept if tokens else self.rows_kept
        if self.fp8 is None or kept is None or e.phase != FORWARD or e.when != "before":
            return stored
        return saved_input_elements(stored, self.fp8, kept) * self.width


def _writer(trace: Trace) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, ks in enumerate(trace.writes):
        for k in ks:
            out.setdefault(k, i)
    return out


def expert_ops(trace: Trace) -> tuple[dict[int, ExpertOp], frozenset[str]]:
    """The grouped GEMMs that exchange tokens, and the expert parameters."""
    names = [base_name(op.name) for op in trace.ops]
    writer, consumers, params = _writer(trace), trace.consumers, set(trace.parameters)
    ops: dict[int, ExpertOp] = {}
    expert_params: set[str] = set()
    for i, name in enumerate(names):
        reads = [k for k in trace.ops[i].inputs if k not in params]
        if name == "_grouped_mm":
            expert_params.update(k for k in trace.ops[i].inputs if k in params)
            src = writer.get(reads[0]) if reads else None
            if src is not None and names[src] == "moe::permute":
                ops[i] = ExpertOp(i, FORWARD, "before", reads[0], trace.ops[src].inputs[0], src)
            out = trace.ops[i].outputs[0]
            after = [c for c in consumers.get(out, ()) if names[c] == "moe::unpermute"]
            if after:
                ops[i] = ExpertOp(i, FORWARD, "after", out, trace.ops[after[0]].outputs[0])
        elif name == "GroupedMmBackward0" and reads:
            src = writer.get(reads[0])
            if src is not None and names[src] == "MoeUnpermuteBackward0":
                ops[i] = ExpertOp(i, BACKWARD, "before", reads[0], trace.ops[src].inputs[0], src)
            out = trace.ops[i].outputs[0]
            after = [c for c in consumers.get(out, ()) if names[c] == "MoePermuteBackward0"]
            if after:
                ops[i] = ExpertOp(i, BACKWARD, "after", out, trace.ops[after[0]].outputs[0])
    return ops, frozenset(expert_params)


def expert_buffers(trace: Trace, params: frozenset[str]) -> set[str]:
    """The expert parameters, their gradients and optimizer state."""
    grads = {k for i, op in enumerate(trace.ops) if base_name(op.name) == "GroupedMmBackward0"
             for k in trace.writes[i] if k in trace.batch_invariant and k not in trace.parameters}
    return set(params) | grads | optimizer_state_of(trace, set(params))


def check_ep(ep: int, experts: int, folded: int, etp: int = 1) -> None:
    """Megatron-Core's conditions on ``--ep`` and ``--etp``: ep divides the experts, etp × ep the
    tp·cp·dp GPUs of a stage they are folded over."""
    if experts % ep:
        raise ConfigError(f"--ep {ep} must divide the {experts} routed experts of the model")
    if folded % (ep * etp):
        with_etp = f" x --etp {etp}" if etp > 1 else ""
        raise ConfigError(f"--ep {ep}{with_etp} must divide the tp x cp x dp = {folded} GPUs of a pipeline stage "
                          "(expert parallelism is folded over them)")


def moe_shape(trace: Trace, ops: dict[int, ExpertOp], params: frozenset[str]) -> tuple[int, int]:
    """(routed experts, experts per token) of the trace's MoE layers: the grouped GEMMs' weights
    are [experts, N, K]; a dispatch's T·k rows over the layer's T tokens is k."""
    experts = max(trace.tensors[p].shape[0] for p in params if len(trace.tensors[p].shape or ()) == 3)
    first = next((e for e in ops.values() if e.phase == FORWARD and e.when == "before"), None)
    if first is None:
        return experts, 1
    return experts, max(1, trace.tensors[first.routed].numel // max(1, trace.tensors[first.tokens].numel))


def expert_split(trace: Trace, tpp, ep: int, data: int, zero: int, roles: BufferRoles, dispatcher: str,
                 imbalance: float, etp: int = 1, shared_overlap: bool = False) -> tuple[object, ExpertPlan | None]:
    """``tpp`` for one expert rank (expert buffers 1/ep, ZeRO-sharded expert state over edp, the
    grouped GEMMs at the busiest rank's load) and the plan of its exchanges; ``(tpp, None)`` for
    a model without experts at ``ep`` 1. At ``ep`` 1 under tensor parallelism the experts are
    whole on every GPU, each TP rank routing its own tokens (sequence parallelism): no exchange,
    but the expert gradients meet over tp × cp × dp GPUs."""
    ops, params = expert_ops(trace)
    if not params:
        if ep > 1 or etp > 1:
            flag = f"--ep {ep}" if ep > 1 else f"--etp {etp}"
            raise ConfigError(f"{flag}: the model has no mixture-of-experts layer (no grouped expert GEMM)")
        return tpp, None
    if zero == 3:  # FSDP would gather each expert over its own group: not modelled
        raise ConfigError("--zero 3 (FSDP) with a mixture-of-experts model under --tp, --ep or --etp is not modelled; "
                          "use --zero 1 or 2 (the distributed optimizer)")
    if ep == 1 and etp == 1:
        ops = {}
    if etp > 1 and dispatcher != "alltoall":
        raise ConfigError(f"--etp {etp} with --moe-token-dispatcher {dispatcher} is not modelled (use alltoall)")
    experts, top_k = moe_shape(trace, *expert_ops(trace))
    tp = tpp.degree
    folded = tp * data
    check_ep(ep, experts, folded, etp)
    edp = folded // (ep * etp)
    factor = busiest_rank_factor(experts, ep, imbalance)
    divisor = dict(tpp.shard_divisor)
    owned = expert_buffers(trace, params)
    for k in owned:
        # The memory plan multiplies in ZeRO's divisor over data ranks; an expert buffer sharded
        # by ZeRO is really split over ep·edp = tp·data GPUs: its divisor is tp, else ep.
        sharded = zero_divisor(roles, k, zero, data) > 1
        divisor[k] = max(1, (etp * ep * edp) // data) if sharded else ep * etp
    scale = list(tpp.time_scale)
    names = [base_name(op.name) for op in trace.ops]
    for i, name in enumerate(names):
        if name in ("_grouped_mm", "GroupedMmBackward0"):
            scale[i] *= factor
    # The optimizer's share: the state this rank updates. ZeRO's / data is applied to the whole op
    # later, so an expert parameter counts / (ep·edp / data) under ZeRO, / ep without it.
    opt_div = max(1, (etp * ep * edp) // data) if zero and data > 1 else ep * etp
    total = trace.parameter_bytes or 1
    kept = sum(trace.tensors[p].bytes / (opt_div if p in params else tpp.shard_divisor.get(p, 1))
               for p in trace.parameters)
    for i, op in enumerate(trace.ops):
        if op.stage == "optimizer":
            scale[i] = kept / total
    plan = ExpertPlan(ep, dispatcher, imbalance, experts, top_k, factor, ops, params, edp, etp, shared_overlap,
                      **_dispatch_precision(trace, ops))
    return replace(tpp, time_scale=tuple(scale), shard_divisor=divisor), plan


def _dispatch_precision(trace: Trace, ops: dict[int, ExpertOp]) -> dict:
    """The plan's FP8 fields, from what the training precision made of the forward dispatch's
    buffers."""
    p = trace.precision
    first = next((e for e in ops.values() if e.phase == FORWARD and e.when == "before"), None)
    if p is None or p.fp8 is None or first is None:
        return {}
    inputs = find_fp8_linears(trace).inputs

    def kept(buffer: str) -> int | None:
        if trace.base(buffer) not in inputs:
            return None
        return 0 if trace.tensors[buffer].each_byte == 1 else p.weight_bytes

    return {"fp8": p.fp8, "rows_kept": kept(first.routed), "tokens_kept": kept(first.tokens), "width": p.weight_bytes}


__all__ = ["DISPATCHERS", "ExpertOp", "ExpertPlan", "alltoall_wire_bytes", "busiest_rank_factor", "check_ep",
           "expert_buffers", "expert_ops", "expert_split", "flex_node_fraction", "moe_shape"]
