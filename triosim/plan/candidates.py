"""The configurations a plan searches: every valid composition of tensor, pipeline, context and
data parallelism on N GPUs with a micro-batch size, a pipeline schedule, a ZeRO stage, an
activation recomputation mode and sequence parallelism on or off. Axes the user pins (``--tp``,
``--pp``, ``--cp``, ``--dp``) keep their degree; the others are searched.

Rules (Megatron-LM's): tp divides the attention heads (megatron splits whole heads) and, by
default, the GPUs of a node (a TP group's all-reduces stay on NVLink); pp divides the layers;
dp = N / (tp · pp · cp) divides the global batch; the micro-batch divides the per-replica batch; the
interleaved schedule needs pp ≥ 2, V · pp dividing the layers and the micro-batches a multiple
of pp. Sequence parallelism needs tp ≥ 2, ZeRO ≥ 1 needs dp ≥ 2 (otherwise it is ZeRO-0 again).
Recomputation modes are searched only when the strategy has a ``recompute`` field.

Context parallelism (ring attention, ``--cp-comm-type p2p``) cuts each sequence into 2 · cp
chunks, so 2 · cp divides the sequence of the trace's fused attention ops; a trace without them
(no sequence to split) has cp 1 only. A searched cp also leaves each chunk
:data:`MIN_CP_CHUNK` tokens or more: shorter chunks make the ring's exchanges longer than the
partial attentions they hide behind (a pinned ``--cp`` may go below).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

from ..errors import ConfigError
from ..graph.layer_count import count_layers
from ..graph.pipeline.layer_layout import (
    EMBEDDING_FLAG,
    FIRST_FLAG,
    LAST_FLAG,
    LAYOUT_FLAG,
    LOSS_FLAG,
    LayerSplit,
    megatron_layers_per_stage,
)
from ..graph.pipeline.stages import card_layer_extras, trace_layers
from ..graph.rank_map import RankMap
from ..graph.recompute_spec import DEFAULT_MODULES, RecomputeSpec
from ..graph.strategy import AXES, Strategy, with_context_axis
from ..graph.tensor.megatron import attention_heads
from ..trace import Trace

SCHEDULES = ("1f1b", "interleaved")
VIRTUAL_STAGES = (2, 3, 4)
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE_MODES = ("none", "selective", "full")
MIN_CP_CHUNK = 1024  # tokens of each of the 2 · cp chunks of a sequence, for a searched cp


def strategy_has(name: str) -> bool:
    """Whether the simulator's Strategy has the optional field ``name`` (features added later)."""
    return any(f.name == name for f in fields(Strategy))


@dataclass(frozen=True)
class Candidate:
    """One configuration; ``virtual`` is 1 unless ``schedule`` is interleaved."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    schedule: str = "1f1b"
    virtual: int = 1
    zero: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    cp: int = 1  # context-parallel degree (ring attention); GPUs = tp · pp · cp · dp
    # full recomputation's detail (Megatron-Core's recompute_method / recompute_num_layers): uniform
    # groups of N layers, or the first N layers of each model chunk (block)
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    recompute_modules: tuple[str, ...] = DEFAULT_MODULES  # selective: the parts of each layer re-run
    offload: str | None = None  # --offload-activations (N layers or a fraction of each chunk's); recompute none
    # expert parallelism of an MoE model (parallel folding): the experts on etp × ep × edp over the
    # tp · cp · dp GPUs of a stage (graph.expert.plan)
    ep: int = 1
    etp: int = 1
    # the pipeline layout (Megatron-Core's flags): equal layers per stage unless given
    split: LayerSplit = LayerSplit()
    # the token dispatcher when the plan tries another than the run's own (None: the run's)
    dispatcher: str | None = None
    # --rank-order (the run's, a plan-wide setting): tp innermost, cp (if named) right after it
    rank_order: tuple[str, ...] = AXES
    # Megatron-Core's data-parallel overlaps when the plan tries them beside a run without them:
    # --overlap-grad-reduce, and --overlap-param-gather under ZeRO 1/2 (False: the run's own flags)
    overlaps: bool = False
    # FP8 training's scaling recipe when the plan tries another than the run's own (None: the run's)
    fp8_recipe: str | None = None

    @property
    def recompute_spec(self) -> RecomputeSpec:
        return RecomputeSpec(self.recompute, self.recompute_method, self.recompute_num_layers, self.recompute_modules)

    @property
    def recompute_label(self) -> str:
        """``none``, ``selective``, ``full``, ``full (block, 2 layers a chunk)``, ``selective
        (core_attn+mlp)``, ``offload 2``."""
        if self.offload is not None:
            return f"offload {self.offload}"
        return self.recompute_spec.label

    @property
    def detailed(self) -> bool:
        """Whether the recomputation goes beyond a plain none/selective/full (a method, a layer
        count, modules) or activations are offloaded."""
        return (self.offload is not None or self.recompute_method != "uniform" or self.recompute_num_layers != 1
                or self.recompute_modules != DEFAULT_MODULES)

    @property
    def mesh(self) -> str:
        cp = f"×cp{self.cp}" if self.cp > 1 else ""
        ep = (f"×ep{self.ep}" if self.ep > 1 else "") + (f"×etp{self.etp}" if self.etp > 1 else "")
        dispatcher = f" {self.dispatcher}" if self.dispatcher else ""
        overlaps = " +overlap" if self.overlaps else ""
        recipe = f" fp8-{self.fp8_recipe}" if self.fp8_recipe else ""
        return f"dp{self.dp}{cp}×tp{self.tp}×pp{self.pp}{ep}{dispatcher}{overlaps}{recipe}"

    @property
    def data(self) -> int:
        """Data ranks: dp × cp GPUs reduce gradients together and share ZeRO's shards."""
        return self.dp * self.cp

    @property
    def ranks(self) -> RankMap:
        """The GPU of every coordinate, as the run numbers them (:func:`triosim.graph.rank_map.rank_map`)."""
        order = with_context_axis(self.rank_order) if self.cp > 1 else tuple(a for a in self.rank_order if a != "cp")
        return RankMap(self.dp, self.tp, self.pp, order, self.cp)

    @property
    def stage_stride(self) -> int:
        """GPUs between a GPU and its peer on the next pipeline stage."""
        return self.ranks.rank(0, 0, 1) if self.pp > 1 else self.tp * self.cp

    @property
    def schedule_label(self) -> str:
        return f"interleaved V{self.virtual}" if self.schedule == "interleaved" else self.schedule

    def run_flags(self, global_batch: int, global_flag: bool = True) -> list[str]:
        """The ``triosim run`` flags of this configuration (without the trace and platform's); the
        batch as ``--global-batch`` (``global_flag``) or as one replica's ``--batch-size-sim``."""
        batch = ["--global-batch", str(global_batch)] if global_flag else \
            ["--batch-size-sim", str(global_batch // self.dp)]
        flags = ["--dp", str(self.dp), "--tp", str(self.tp), "--pp", str(self.pp),
                 *(["--cp", str(self.cp)] if self.cp > 1 else []),
                 *(["--ep", str(self.ep)] if self.ep > 1 else []), *(["--etp", str(self.etp)] if self.etp > 1 else []),
                 *batch,
                 "--micro-batch-size", str(self.micro_batch), "--schedule", self.schedule]
        if self.schedule == "interleaved":
            flags += ["--virtual-stages", str(self.virtual)]
        if self.zero:
            flags += ["--zero", str(self.zero)]
        if self.sequence_parallel:
            flags.append("--sequence-parallel")
        if self.recompute != "none":
            flags += ["--recompute", self.recompute]
        if self.recompute == "full" and (self.recompute_method != "uniform" or self.recompute_num_layers != 1):
            flags += ["--recompute-method", self.recompute_method, "--recompute-num-layers",
                      str(self.recompute_num_layers)]
        if self.recompute == "selective" and self.recompute_modules != DEFAULT_MODULES:
            flags += ["--recompute-modules", ",".join(self.recompute_modules)]
        if self.offload is not None:
            flags += ["--offload-activations", self.offload]
        if self.dispatcher:
            flags += ["--moe-token-dispatcher", self.dispatcher]
        if self.overlaps:
            flags += ["--overlap-grad-reduce", *(["--overlap-param-gather"] if self.gathers_overlapped else [])]
        if self.fp8_recipe:
            flags += ["--fp8-recipe", self.fp8_recipe]
        return flags + split_flags(self.split)

    @property
    def gathers_overlapped(self) -> bool:
        """Whether the plan's overlaps include ``--overlap-param-gather`` (ZeRO 1/2: the updated
        parameters gathered during the next forward; Megatron-Core needs the distributed optimizer)."""
        return self.overlaps and self.zero in (1, 2)

    @property
    def layout_label(self) -> str:
        """The layout in words: ``equal``, ``E+1``/``L+1`` (the embedding/loss counted as a
        layer), ``first 3, last 2``, or the layout string."""
        return split_label(self.split)


def split_flags(split: LayerSplit) -> list[str]:
    """The ``triosim run`` flags of a layout (none for the equal split)."""
    out = [EMBEDDING_FLAG] * split.account_for_embedding + [LOSS_FLAG] * split.account_for_loss
    if split.first_stage_layers is not None:
        out += [FIRST_FLAG, str(split.first_stage_layers)]
    if split.last_stage_layers is not None:
        out += [LAST_FLAG, str(split.last_stage_layers)]
    if split.layout is not None:
        out += [LAYOUT_FLAG, split.layout]
    return out


def split_label(split: LayerSplit) -> str:
    if split.layout is not None:
        return split.layout
    parts = [w for w, on in (("E+1", split.account_for_embedding), ("L+1", split.account_for_loss)) if on]
    parts += [f"{w} {n}" for w, n in (("first", split.first_stage_layers), ("last", split.last_stage_layers))
              if n is not None]
    return ", ".join(parts) or "equal"


@dataclass(frozen=True)
class SearchSpace:
    """What may vary. ``heads`` None: a trace without attention heads (any tp dividing the
    node); ``max_tp`` caps tp (default: the GPUs of a node)."""

    gpus: int
    global_batch: int
    layers: int
    heads: int | None
    gpus_per_node: int
    max_tp: int | None = None
    zero_stages: Sequence[int] = ZERO_STAGES
    schedules: Sequence[str] = SCHEDULES
    recompute_modes: Sequence[str] | None = None  # None: all when the strategy supports them
    sequence_parallel: Sequence[bool] = (False, True)
    micro_batches: Sequence[int] | None = None  # None: every divisor of the per-replica batch
    # Axes the user pinned (--tp/--pp/--cp/--dp), as (axis, degree) pairs; the rest is searched. A
    # new parallel axis (ep) joins by its name here and in mesh_shapes.
    pinned: tuple[tuple[str, int], ...] = ()
    # tokens of the sequence the fused attention ops see (None: no fused attention, cp 1 only)
    sequence: int | None = None
    # A recomputation setting the user pinned (--recompute-method with --recompute-num-layers:
    # full; --recompute-modules: selective), as (granularity, method, layers, modules), or an
    # --offload-activations value: every candidate has it. None: searched.
    recompute_pin: tuple[str, str, int, tuple[str, ...]] | None = None
    offload_pin: str | None = None
    # the routed experts of an MoE model (None: dense, ep and etp 1); etp above 1 only with the
    # alltoall dispatcher (as run accepts)
    experts: int | None = None
    etp_allowed: bool = True
    # pipeline layouts: the one the user pinned (layout flags), or whether to search Megatron-Core's
    # account-for splits beside the equal one (a model card's layers cut by --partition auto)
    split_pin: LayerSplit | None = None
    search_splits: bool = False
    # a model card's decoder layers before its repeated ones (counted in ``layers``, run on the
    # first stage) and its multi-token-prediction layers (a layout string's m)
    leading_layers: int = 0
    mtp_layers: int = 0
    # --moe-a2a-overlap (Megatron-Core's combined 1F1B): every candidate has ep above 1, no full
    # recomputation, and under pp above 1 the interleaved schedule (as run accepts)
    combined: bool = False
    # --rank-order: how the run numbers the GPUs (tp innermost; cp, if named, right after it)
    rank_order: tuple[str, ...] = AXES

    def pin(self, axis: str) -> int | None:
        return dict(self.pinned).get(axis)


def layer_facts(trace: Trace) -> tuple[int, str, int | None]:
    """(layers, their unit, attention heads or None): what the search space splits. A model
    card's trace counts Megatron's decoder layers, as the simulation's pipeline rules do: its
    repeated layers and the ones before them (DeepSeek-V3's dense layers)."""
    layers = count_layers(trace)
    heads = attention_heads(trace) if layers.unit == "transformer layers" else None
    units = trace_layers(trace) if trace.info.get("model_card") else ()
    if units:
        return len(units) + card_layer_extras(trace)[0], "transformer layers", heads
    return layers.count, layers.unit, heads


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending (pairs up to √n: a batch of 10^8 has 81)."""
    low, high = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            low.append(d)
            if d * d != n:
                high.append(n // d)
        d += 1
    return low + high[::-1]


def context_degrees(space: SearchSpace, gpus: int) -> list[int]:
    """The cp degrees to try on ``gpus`` GPUs (those left after tp and pp): 1, and where the
    trace's attention has a sequence to split, every divisor cutting it into 2 · cp chunks of
    :data:`MIN_CP_CHUNK` tokens or more (a pinned cp: of any length)."""
    pin = space.pin("cp")
    seq = space.sequence
    out = []
    for cp in divisors(gpus):
        if pin is not None and cp != pin:
            continue
        if cp > 1 and (seq is None or seq % (2 * cp) or (pin is None and seq // (2 * cp) < MIN_CP_CHUNK)):
            continue
        out.append(cp)
    return out


# the account-for variants: the embedding and the loss, the loss alone, the embedding alone (auto_split's order)
ACCOUNT_FOR = (LayerSplit(True, True), LayerSplit(False, True), LayerSplit(True, False))


def _counts(space: SearchSpace, pp: int, virtual: int, split: LayerSplit) -> tuple[int, ...] | None:
    """Transformer layers per stage under ``split``, or None where Megatron-Core refuses it."""
    lead = space.leading_layers  # decoder layers before the repeated ones (on the first stage)
    try:
        return megatron_layers_per_stage(space.layers - lead, pp, virtual, split, lead, space.mtp_layers)
    except ConfigError:
        return None


def layer_splits(space: SearchSpace, pp: int, virtual: int) -> list[LayerSplit]:
    """The layouts of ``pp`` ranks × ``virtual`` stages: the pinned one where it fits; else the
    equal split where the layers divide and, where the search takes them (a pipeline: the first
    stage carries the embedding, the last the loss), Megatron-Core's account-for splits that
    make the layers divide and cut them otherwise than a split before them (48 layers over 2
    ranks with the embedding and the loss counted: 24 and 24, the equal split again)."""
    if space.split_pin is not None:
        return [space.split_pin] if _counts(space, pp, virtual, space.split_pin) is not None else []
    equal = space.layers % (pp * virtual) == 0 and (not space.leading_layers or
                                                     _counts(space, pp, virtual, LayerSplit()) is not None)
    out = [LayerSplit()] if equal else []
    if space.search_splits and pp > 1:
        seen = {_counts(space, pp, virtual, s) for s in out}
        for split in ACCOUNT_FOR:
            counts = _counts(space, pp, virtual, split)
            if counts is not None and counts not in seen:
                seen.add(counts)
                out.append(split)
    return out


def mesh_shapes(space: SearchSpace) -> list[tuple[int, int, int, int]]:
    """Every (tp, pp, dp, cp) with tp · pp · cp · dp = GPUs that the rules allow."""
    cap = space.max_tp if space.max_tp is not None else space.gpus_per_node
    pin_tp, pin_pp, pin_dp = space.pin("tp"), space.pin("pp"), space.pin("dp")
    out = []
    for tp in divisors(space.gpus):
        # a pinned tp may leave the node (the user asked for it); a searched one stays on NVLink
        if (tp > cap and pin_tp is None) or (space.heads is not None and space.heads % tp):
            continue
        if pin_tp is not None and tp != pin_tp:
            continue
        for pp in divisors(space.gpus // tp):
            if pin_pp is not None and pp != pin_pp:
                continue
            if not layer_splits(space, pp, 1) and not (pp >= 2 and any(layer_splits(space, pp, v)
                                                                          for v in VIRTUAL_STAGES)):
                continue
            for cp in context_degrees(space, space.gpus // (tp * pp)):
                dp = space.gpus // (tp * pp * cp)
                if space.global_batch % dp or (pin_dp is not None and dp != pin_dp):
                    continue
                out.append((tp, pp, dp, cp))
    return out


def expert_degrees(space: SearchSpace, tp: int, folded: int) -> list[tuple[int, int]]:
    """The (ep, etp) pairs of a mesh whose stage has ``folded`` = tp · cp · dp GPUs: etp 1 and tp
    (the common choices; a pinned one as given) and every ep dividing the routed experts with
    etp · ep dividing ``folded`` (Megatron-Core's parallel folding, as ``run`` checks it); (1, 1)
    on a dense model."""
    if not space.experts:
        return [(1, 1)]
    pin_ep, pin_etp = space.pin("ep"), space.pin("etp")
    if space.offload_pin is not None:  # offload copies beside token exchanges: not estimated (plan.variants)
        return [(1, 1)]
    etps = [pin_etp] if pin_etp is not None else sorted({1, tp} if space.etp_allowed else {1})
    out = []
    for etp in etps:
        for ep in divisors(space.experts):
            if folded % (ep * etp) or (pin_ep is not None and ep != pin_ep):
                continue
            out.append((ep, etp))
    return out


def enumerate_candidates(space: SearchSpace) -> Iterator[Candidate]:
    """Every configuration of ``space``, in a fixed order (mesh, micro-batch, schedule, ZeRO,
    recomputation, sequence parallel)."""
    recompute = space.recompute_modes
    if recompute is None:
        recompute = RECOMPUTE_MODES if strategy_has("recompute") else ("none",)
    settings: list[dict] = [{"recompute": rc} for rc in recompute]
    if space.recompute_pin is not None:
        granularity, method, layers, modules = space.recompute_pin
        settings = [{"recompute": granularity, "recompute_method": method, "recompute_num_layers": layers,
                     "recompute_modules": modules}]
    elif space.offload_pin is not None:  # Megatron-Core offloads only without recomputation
        settings = [{"recompute": "none", "offload": space.offload_pin}]
    for tp, pp, dp, cp in mesh_shapes(space):
        batch = space.global_batch // dp
        for mb in divisors(batch):
            if space.micro_batches is not None and mb not in space.micro_batches:
                continue
            m = batch // mb
            schedules: list[tuple[str, int, LayerSplit]] = []
            for sched in space.schedules:
                if sched != "interleaved":
                    schedules += [(sched, 1, split) for split in layer_splits(space, pp, 1)]
                elif pp >= 2 and m % pp == 0:
                    schedules += [(sched, v, split) for v in VIRTUAL_STAGES for split in layer_splits(space, pp, v)]
            zeros = [z for z in space.zero_stages if z == 0 or dp * cp > 1]  # ZeRO shards over dp × cp
            if space.offload_pin is not None:  # not under ZeRO-3 (plan.offload_profile)
                zeros = [z for z in zeros if z < 3]
            sps = [s for s in space.sequence_parallel if not s or tp > 1]
            experts = expert_degrees(space, tp, tp * cp * dp)
            for sched, v, split in schedules:
                for z in zeros:
                    for ep, etp in experts:
                        # FSDP of experts split over tp, ep or etp: not modelled (run refuses it)
                        if z == 3 and space.experts and (tp > 1 or ep > 1 or etp > 1):
                            continue
                        for rc in settings:
                            if space.combined and (ep < 2 or rc.get("recompute") == "full"
                                                   or (pp > 1 and sched != "interleaved")):
                                continue
                            for sp in sps:
                                if ep > 1 and tp > 1 and not sp:  # Megatron-Core refuses it (as run does)
                                    continue
                                yield Candidate(tp, pp, dp, mb, sched, v, z, sequence_parallel=sp, cp=cp, ep=ep,
                                                etp=etp, split=split, rank_order=space.rank_order, **rc)


__all__ = ["MIN_CP_CHUNK", "RECOMPUTE_MODES", "SCHEDULES", "Candidate", "SearchSpace", "context_degrees", "divisors",
           "enumerate_candidates", "expert_degrees", "layer_splits", "split_flags", "split_label", "layer_facts", "mesh_shapes", "strategy_has"]
