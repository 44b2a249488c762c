"""What parallelism to simulate and how: a composition of data, tensor, pipeline and context
parallel degrees (``dp × tp × pp × cp`` GPUs) and the options that shape its DAG.

The original's ``-case`` numbers are presets of the composition:

- case 0: one GPU (dp = tp = pp = 1);
- case 1: dp N with the whole gradient in one all-reduce after backward;
- case 2: dp N with DDP buckets (``--dp N`` is the same thing);
- case 3: tp N with the per-op tensor-parallel style (``--tp N --tp-style per-op``);
- case 4: pp N (``--pp N``).

Each case is a :class:`Preset` (``PRESETS``): the axis it spreads over every GPU and how that
axis is built. :mod:`triosim.graph.builder` builds every run with the composition
(:mod:`triosim.graph.composition`): a run given as ``--dp/--tp/--pp``, and a ``-case`` run as its
preset (tests compare the two), but case 0, whose one GPU is built from the trace's columns only;
``--reference-compat`` replays the original's cases 1, 3 and 4 beside it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..checks import positive
from ..errors import ConfigError
from .pipeline.layer_layout import LayerSplit
from .recompute_spec import DEFAULT_MODULES, RecomputeSpec
from .tensor.userbuffers import UserbufferTable

CASE_NAMES = {
    0: "single-GPU training",
    1: "data parallel",
    2: "distributed data parallel (DDP)",
    3: "tensor parallel",
    4: "pipeline parallel",
}
AXES = ("tp", "pp", "dp")
# Expert parallelism's token exchange (Megatron-Core's --moe-token-dispatcher-type; flex: DeepEP).
MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
# Context parallelism's exchange of keys and values (Megatron-Core's --cp-comm-type): p2p (ring
# attention), a2a (all-to-all of q/k/v and of the output, DeepSpeed-Ulysses style), allgather
# (keys and values gathered before attention); a2a+p2p (hierarchical) is refused.
CP_COMM_TYPES = ("p2p", "a2a", "allgather", "a2a+p2p")
MODELLED_CP_COMM_TYPES = ("p2p", "a2a", "allgather")


@dataclass(frozen=True)
class Preset:
    """What a ``-case`` number means: ``axis`` spread over all GPUs (None: one GPU) and, for data
    parallelism, ``gradient_sync``: ``buckets`` (DDP, overlapped with backward) or ``whole`` (one
    all-reduce of every gradient after backward)."""

    axis: str | None
    gradient_sync: str = "buckets"


PRESETS = {
    0: Preset(None),
    1: Preset("dp", gradient_sync="whole"),
    2: Preset("dp"),
    3: Preset("tp"),
    4: Preset("pp"),
}  # default rank order, innermost first
TP_STYLES = ("megatron", "per-op")
RECOMPUTE_MODES = ("none", "selective", "full")
# Pipeline stage cuts (graph.pipeline.stages.candidate_plans): auto picks layers for a model
# card's trace, optimal for any other.
PARTITIONS = ("auto", "layers", "optimal", "time", "count")
ZERO_ALIASES = {"0": 0, "1": 1, "2": 2, "3": 3, "fsdp": 3}
# --pipeline-send: auto is what Megatron-LM does (graph.pipeline.blocking): blocking sends under
# 1F1B and GPipe, overlapped under the interleaved schedule.
PIPELINE_SENDS = ("auto", "blocking", "overlapped")


def parse_zero(text: str | int) -> int:
    """``--zero`` value: 0..3, or ``fsdp`` (= 3)."""
    key = str(text).strip().lower()
    if key not in ZERO_ALIASES:
        raise ConfigError(f"--zero must be 0, 1, 2, 3 or fsdp, got {text!r}")
    return ZERO_ALIASES[key]


def parse_rank_order(text: str | tuple[str, ...]) -> tuple[str, ...]:
    """``--rank-order tp,pp,dp``: a permutation of tp, pp, dp (or of tp, cp, pp, dp), innermost
    (fastest-varying) first. Without cp in it, the context-parallel axis sits right after tp."""
    items = tuple(x.strip().lower() for x in (text.split(",") if isinstance(text, str) else text))
    if sorted(items) not in (sorted(AXES), sorted((*AXES, "cp"))):
        raise ConfigError(f"--rank-order must be a permutation of tp,pp,dp or of tp,cp,pp,dp (e.g. tp,pp,dp), "
                          f"got {text!r}")
    return items


def with_context_axis(order: tuple[str, ...]) -> tuple[str, ...]:
    """``order`` with the context-parallel axis: as given when it names cp, else right after tp
    (a cp group next to its TP group, as Megatron-Core's default order tp-cp-ep-dp-pp places it)."""
    if "cp" in order:
        return tuple(order)
    at = order.index("tp") + 1
    return (*order[:at], "cp", *order[at:])


@dataclass(frozen=True)
class Strategy:
    """The parallel composition and every option a graph builder reads.

    ``dp``/``tp``/``pp`` None means "not given": a run that gives none of them is the preset of
    ``case``; one that gives any is a hybrid run where the missing ones are 1.
    ``micro_batch_size`` None means one micro-batch of the whole (simulated) batch.
    ``collective_detail``: ``expanded`` (one transfer per ring step), ``macro`` (one task holding
    the ring's links for the closed-form time) or ``auto`` (expanded while the graph is small).
    ``zero``: 0 plain DDP, 1 optimizer state sharded over the DP group, 2 gradients too,
    3 parameters too (FSDP). ``tp_style`` None: megatron for ``--tp``, per-op for case 3.
    ``rank_order``: which axis varies fastest in the rank numbering (tp innermost by default, so
    a TP group sits inside one NVSwitch node). ``exact`` True builds every GPU, False one
    representative per distinct role, None (default) every GPU while that graph stays small.
    ``recompute``: activation recomputation (:mod:`triosim.graph.recompute`): ``none``,
    ``selective`` (the attention core re-run before its backward) or ``full`` (each layer's
    forward re-run before its backward, only layer inputs kept); ``recompute_method`` and
    ``recompute_num_layers`` (full: uniform groups of N layers, or the first N layers of each
    model chunk) and ``recompute_modules`` (selective: core_attn, mlp, layernorm), as
    Megatron-Core's (:mod:`triosim.graph.recompute_units`).

    The overlaps, with Megatron-Core's names and defaults (off; see docs/overlap.md):
    ``tp_comm_overlap`` (sequence-parallel all-gathers and reduce-scatters in chunks beside their
    GEMMs, as Transformer Engine's userbuffers), ``overlap_grad_reduce`` (each gradient bucket
    reduced as soon as backward fills it; off: every gradient after the last backward op, in one
    bucket per stage), ``overlap_param_gather`` (ZeRO 1/2: the updated parameters gathered per
    bucket before the forward ops that use them instead of after the optimizer), and
    ``pipeline_send``: ``blocking`` (a stage goes on only once its send and the matching receive
    are done, as Megatron's batched send/receive), ``overlapped`` (sends run beside compute) or
    ``auto`` (blocking under 1F1B/GPipe, overlapped under the interleaved schedule, as
    Megatron-LM runs them). ``pipeline_scatter_gather``: without sequence parallelism each TP rank
    sends 1/tp of a pipeline buffer and the receiving group all-gathers it (Megatron-LM 2021–22's
    default, gone from Megatron-Core). ``-case`` presets keep their own behaviour and take none of them.
    ``cp``: the context-parallel degree (:mod:`triosim.graph.context`): the sequence of every
    sample split over ``cp`` GPUs that exchange keys and values in attention as ``cp_comm_type``
    says; those GPUs join the data-parallel ranks in the gradient reduction and ZeRO sharding.
    """

    case: int = 0
    micro_batch_size: int | None = None
    bucket_mb: float = 25.0
    schedule: str = "gpipe"
    partition: str = "optimal"
    initial_placement: str = "gpu"
    reference_compat: bool = False
    collective_detail: str = "auto"
    virtual_stages: int = 1
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    zero: int = 0
    sequence_parallel: bool = False
    tp_style: str | None = None
    rank_order: tuple[str, ...] = AXES
    exact: bool | None = None
    recompute: str = "none"
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    recompute_modules: tuple[str, ...] = DEFAULT_MODULES
    offload_activations: str | None = None  # N layers or a fraction of each chunk's (graph.offload)
    tp_comm_overlap: bool = False
    tp_comm_overlap_cfg: UserbufferTable | None = None  # per-GEMM userbuffer settings (None: TE's defaults)
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    pipeline_send: str = "auto"
    pipeline_scatter_gather: bool = False
    # Megatron-Core's layout flags, by its names (graph.pipeline.layer_layout): the embedding and/or
    # the loss counted as a layer in the split, uneven first/last stages, or an explicit layout.
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    pipeline_model_parallel_layout: str | None = None

    @property
    def recompute_spec(self) -> RecomputeSpec:
        """The recomputation setting as one value (granularity, method, layers, modules)."""
        return RecomputeSpec(self.recompute, self.recompute_method, self.recompute_num_layers,
                             tuple(self.recompute_modules))

    @property
    def blocking_sends(self) -> bool:
        """Whether pipeline sends block their stage (a typed composition only; a ``-case`` preset
        keeps case 4's overlapped sends)."""
        if not self.hybrid:
            return False
        if self.pipeline_send == "auto":
            return self.schedule != "interleaved"
        return self.pipeline_send == "blocking"
    cp: int | None = None
    cp_comm_type: str = "p2p"
    # Expert parallelism (graph/expert): folded over the tp × cp × dp GPUs of a stage, so it
    # multiplies no GPUs; the token dispatcher and the busiest expert's load over the mean.
    ep: int | None = None
    etp: int | None = None
    moe_token_dispatcher: str = "alltoall"
    moe_imbalance: float = 1.0
    moe_shared_expert_overlap: bool = False
    moe_a2a_overlap: bool = False  # the steady state's forward and backward blocks run together
    delay_wgrad_compute: bool = False  # the experts' weight gradients beside the backward's combine

    @property
    def context_degree(self) -> int:
        """The context-parallel degree (1 without ``--cp``)."""
        return self.cp or 1

    @property
    def expert_degree(self) -> int:
        """The expert-parallel degree (1 without ``--ep``)."""
        return self.ep or 1

    @property
    def expert_tensor_degree(self) -> int:
        """The expert-tensor-parallel degree (1 without ``--etp``)."""
        return self.etp or 1

    @property
    def preset(self) -> Preset:
        """The composition ``case`` stands for (what a run given without degrees builds)."""
        return PRESETS[self.case]

    @property
    def hybrid(self) -> bool:
        """True when the run was given as degrees (``--dp/--tp/--pp``) rather than a case."""
        return any(x is not None for x in (self.dp, self.tp, self.pp, self.cp))

    def degrees(self, num_gpus: int) -> tuple[int, int, int]:
        """(dp, tp, pp) on ``num_gpus`` GPUs; a case preset spreads its one axis over all of them.
        The context-parallel degree is :attr:`context_degree` (``dp × tp × pp × cp`` GPUs)."""
        if self.hybrid:
            return (self.dp or 1, self.tp or 1, self.pp or 1)
        axis = PRESETS[self.case].axis if self.case in PRESETS else None
        n = max(1, num_gpus)
        return (n if axis == "dp" else 1, n if axis == "tp" else 1, n if axis == "pp" else 1)

    @property
    def effective_tp_style(self) -> str:
        if self.tp_style is not None:
            return self.tp_style
        return "per-op" if not self.hybrid else "megatron"

    def validate(self, num_gpus: int | None = None) -> None:
        if self.case not in CASE_NAMES:
            raise ConfigError(f"-case must be one of 0..4, got {self.case}")
        if self.micro_batch_size is not None and self.micro_batch_size <= 0:
            raise ConfigError(f"-micro-batch-size must be a positive integer, got {self.micro_batch_size}")
        positive(self.bucket_mb, "--bucket-mb")  # NaN would otherwise mean one endless bucket
        if self.schedule not in ("gpipe", "1f1b", "interleaved"):
            raise ConfigError(f"--schedule must be gpipe, 1f1b or interleaved, got {self.schedule!r}")
        if self.partition not in PARTITIONS:
            raise ConfigError(f"--partition must be auto, layers, optimal, time or count, got {self.partition!r}")
        split = LayerSplit.of(self)
        split.check()
        if split.given and self.partition not in ("auto", "layers"):
            raise ConfigError(f"{split.flags()} places Megatron-Core's layers per stage: use --partition auto or "
                              f"layers, not {self.partition}")
        if split.given and self.reference_compat:
            raise ConfigError(f"{split.flags()} has no --reference-compat form (the original splits by op count)")
        if self.schedule == "interleaved":
            if self.virtual_stages < 2:
                raise ConfigError(f"--schedule interleaved needs --virtual-stages 2 or more, got {self.virtual_stages}")
            if self.reference_compat:
                raise ConfigError("--schedule interleaved has no --reference-compat form (the original runs GPipe)")
        elif self.virtual_stages != 1:
            raise ConfigError(f"--virtual-stages {self.virtual_stages} needs --schedule interleaved "
                              f"(got --schedule {self.schedule})")
        if self.initial_placement not in ("gpu", "remote"):
            raise ConfigError(f"--initial-placement must be gpu or remote, got {self.initial_placement!r}")
        if self.collective_detail not in ("auto", "expanded", "macro"):
            raise ConfigError(
                f"--collective-detail must be auto, expanded or macro, got {self.collective_detail!r}"
            )
        for flag, value in (("--dp", self.dp), ("--tp", self.tp), ("--pp", self.pp), ("--cp", self.cp)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} must be a positive integer, got {value}")
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"--zero must be 0, 1, 2, 3 or fsdp, got {self.zero!r}")
        if self.tp_style is not None and self.tp_style not in TP_STYLES:
            raise ConfigError(f"--tp-style must be megatron or per-op, got {self.tp_style!r}")
        parse_rank_order(self.rank_order)
        if self.hybrid and self.reference_compat:
            raise ConfigError("--reference-compat reproduces the original's -case runs; it does not combine "
                              "with --dp/--tp/--pp")
        self._validate_context()
        self._validate_experts()
        if num_gpus is not None and self.hybrid:
            dp, tp, pp = self.degrees(num_gpus)
            cp = self.context_degree
            if dp * tp * pp * cp != num_gpus:
                with_cp = f" × --cp {cp}" if cp > 1 else ""
                raise ConfigError(
                    f"--dp {dp} × --tp {tp} × --pp {pp}{with_cp} = {dp * tp * pp * cp} GPUs, but -GPUnumber is "
                    f"{num_gpus}: make them agree or leave -GPUnumber out"
                )
        if self.recompute not in RECOMPUTE_MODES:
            raise ConfigError(f"--recompute must be none, selective or full, got {self.recompute!r}")
        if self.recompute != "none" and not self.hybrid:
            raise ConfigError("--recompute needs the degrees of a hybrid run: give --dp/--tp/--pp (not -case)")
        spec = self.recompute_spec  # checks the method, layer count and modules
        if self.recompute != "full" and (spec.method != "uniform" or spec.num_layers != 1):
            raise ConfigError("--recompute-method/--recompute-num-layers need --recompute full (Megatron's "
                              "--recompute-granularity full)")
        if self.offload_activations is not None:
            if not self.hybrid:
                raise ConfigError("--offload-activations needs the degrees of a hybrid run: give --dp/--tp/--pp")
            if self.recompute != "none":
                raise ConfigError("--offload-activations with --recompute: Megatron-Core does not offload activations "
                                  "while it recomputes them (cpu_offloading with recompute_granularity); choose one")
        if self.recompute != "selective" and spec.modules != DEFAULT_MODULES:
            raise ConfigError("--recompute-modules needs --recompute selective (Megatron's --recompute-granularity "
                              "selective)")
        if (self.zero or self.sequence_parallel) and not self.hybrid:
            raise ConfigError("--zero and --sequence-parallel need the degrees: give --dp/--tp/--pp instead of -case")
        self._validate_overlaps()

    def _validate_overlaps(self) -> None:
        """The overlap switches, with Megatron-Core's own conditions on them."""
        if self.pipeline_send not in PIPELINE_SENDS:
            raise ConfigError(f"--pipeline-send must be auto, blocking or overlapped, got {self.pipeline_send!r}")
        named = [flag for flag, on in (("--tp-comm-overlap", self.tp_comm_overlap),
                                       ("--overlap-grad-reduce", self.overlap_grad_reduce),
                                       ("--overlap-param-gather", self.overlap_param_gather),
                                       ("--pipeline-send", self.pipeline_send != "auto"),
                                       ("--pipeline-scatter-gather", self.pipeline_scatter_gather)) if on]
        if named and not self.hybrid:
            raise ConfigError(f"{named[0]} needs the degrees of a hybrid run: give --dp/--tp/--pp (not -case)")
        if self.tp_comm_overlap_cfg is not None and not self.tp_comm_overlap:
            raise ConfigError("--tp-comm-overlap-cfg needs --tp-comm-overlap (the table sets how its overlaps run)")
        if self.tp_comm_overlap and not self.sequence_parallel:
            # Megatron-LM asserts it: the overlapped collectives are sequence parallelism's
            raise ConfigError("--tp-comm-overlap needs --sequence-parallel (it overlaps sequence parallelism's "
                              "all-gathers and reduce-scatters, as Megatron-Core requires)")
        if self.overlap_param_gather and not self.zero:
            raise ConfigError("--overlap-param-gather needs the distributed optimizer (--zero 1 or more): without "
                              "it there is no parameter all-gather to overlap")
        if self.overlap_param_gather and not self.overlap_grad_reduce:
            raise ConfigError("--overlap-param-gather needs --overlap-grad-reduce (as Megatron-LM requires)")

    def _validate_experts(self) -> None:
        for flag, value in (("--ep", self.ep), ("--etp", self.etp)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} must be a positive integer, got {value}")
            if (value or 1) > 1 and not self.hybrid:
                raise ConfigError(f"{flag} needs the degrees of a hybrid run: give --dp/--tp/--pp (not -case); expert "
                                  "parallelism is folded over their tp x cp x dp GPUs")
        if (self.ep or 1) > 1 and (self.tp or 1) > 1 and not self.sequence_parallel:
            raise ConfigError(f"--ep {self.ep} with --tp {self.tp} needs --sequence-parallel (Megatron-Core: when using "
                              "expert parallelism and tensor parallelism, sequence parallelism must be used)")
        if self.moe_token_dispatcher not in MOE_DISPATCHERS:
            raise ConfigError(f"--moe-token-dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, got "
                              f"{self.moe_token_dispatcher!r}")
        if not (isinstance(self.moe_imbalance, (int, float)) and 1.0 <= self.moe_imbalance <= 1e6):
            raise ConfigError(f"--moe-imbalance must be a number from 1 (balanced) up, got {self.moe_imbalance!r}")
        if self.delay_wgrad_compute and not self.moe_a2a_overlap:
            raise ConfigError("--delay-wgrad-compute needs --moe-a2a-overlap (Megatron-Core: "
                              "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute)")
        if self.moe_a2a_overlap:  # Megatron-Core's checks (TransformerConfig.__post_init__)
            if self.expert_degree < 2:
                raise ConfigError("--moe-a2a-overlap needs expert parallelism (--ep 2 or more), as Megatron-Core")
            if self.moe_token_dispatcher not in ("alltoall", "flex"):
                raise ConfigError("--moe-a2a-overlap needs --moe-token-dispatcher alltoall or flex, as Megatron-Core")
            if self.recompute == "full":
                raise ConfigError("--moe-a2a-overlap: leave out --recompute full (Megatron-Core refuses the two)")
            if self.moe_shared_expert_overlap:
                raise ConfigError("--moe-a2a-overlap: leave out --moe-shared-expert-overlap (Megatron-Core refuses "
                                  "the two)")
            if self.pipeline_send == "blocking":
                raise ConfigError("--moe-a2a-overlap runs a forward and a backward block together: not with "
                                  "--pipeline-send blocking")

    def _validate_context(self) -> None:
        if self.cp_comm_type not in CP_COMM_TYPES:
            raise ConfigError(f"--cp-comm-type must be p2p, a2a, allgather or a2a+p2p, got {self.cp_comm_type!r}")
        if self.cp_comm_type not in MODELLED_CP_COMM_TYPES:
            raise ConfigError(f"--cp-comm-type {self.cp_comm_type} (hierarchical context parallelism) is not modelled: "
                              "use p2p, a2a or allgather")

    @property
    def name(self) -> str:
        if self.hybrid:
            parts = [f"{k}{v}" for k, v in (("dp", self.dp), ("tp", self.tp), ("pp", self.pp), ("cp", self.cp))
                     if v not in (None, 1)]
            extra = f", ZeRO-{self.zero}" if self.zero else ""
            return f"hybrid {'×'.join(parts) or 'dp1'}{extra}"
        return CASE_NAMES.get(self.case, f"case {self.case}")

    def parallel_dict(self, num_gpus: int) -> dict:
        """The JSON ``parallel`` block."""
        dp, tp, pp = self.degrees(num_gpus)
        return {
            "dp": dp,
            "tp": tp,
            "pp": pp,
            "zero": self.zero,
            "sequence_parallel": self.sequence_parallel,
            "schedule": self.schedule,
            "virtual_stages": getattr(self, "virtual_stages", 1),
            "tp_style": self.effective_tp_style if tp > 1 else None,
            "rank_order": ",".join(with_context_axis(tuple(self.rank_order)) if self.context_degree > 1
                                   else (a for a in self.rank_order if a != "cp")),
            "exact": self.exact,
            "recompute": self.recompute,
            **({"recompute_method": self.recompute_method, "recompute_num_layers": self.recompute_num_layers}
               if self.recompute == "full" and self.recompute_spec.partial else {}),
            **({"recompute_modules": list(self.recompute_modules)}
               if self.recompute == "selective" and tuple(self.recompute_modules) != DEFAULT_MODULES else {}),
            **({"offload_activations": self.offload_activations} if self.offload_activations is not None else {}),
            "tp_comm_overlap": self.tp_comm_overlap,
            **({"tp_comm_overlap_cfg": {"source": self.tp_comm_overlap_cfg.source, "changed": {
                n: asdict(u) for n, u in self.tp_comm_overlap_cfg.changed().items()}}}
               if self.tp_comm_overlap_cfg is not None else {}),
            "overlap_grad_reduce": self.overlap_grad_reduce,
            "overlap_param_gather": self.overlap_param_gather,
            "pipeline_send": ("blocking" if self.blocking_sends else "overlapped") if pp > 1 else None,
            "pipeline_scatter_gather": self.pipeline_scatter_gather,
            "cp": self.context_degree,
            **({"cp_comm_type": self.cp_comm_type} if self.context_degree > 1 else {}),
            **({"ep": self.expert_degree, "etp": self.expert_tensor_degree,
                "moe_token_dispatcher": self.moe_token_dispatcher, "moe_imbalance": self.moe_imbalance,
                "moe_shared_expert_overlap": self.moe_shared_expert_overlap,
                **({"moe_a2a_overlap": True} if self.moe_a2a_overlap else {}),
                **({"delay_wgrad_compute": True} if self.delay_wgrad_compute else {})}
               if self.expert_degree > 1 or self.expert_tensor_degree > 1 else {}),
        }
