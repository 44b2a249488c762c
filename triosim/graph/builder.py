"""The graph builder: the one way from a :class:`~triosim.graph.strategy.Strategy` to the task DAG
of one training iteration on a platform.

Every run with more than one GPU's program is built by the composition
(:mod:`triosim.graph.composition`): a run given as degrees (``--dp/--tp/--pp``), and a ``-case``
run as its :class:`~triosim.graph.strategy.Preset` (one axis spread over every GPU, every GPU
built, the case's names and JSON blocks). Case 0 (one GPU) keeps its own small builder
(:mod:`triosim.graph.single`), which reads the trace's columns only.

``--reference-compat`` is a mode beside it: the original's model where it differs from the
composition's (:meth:`GraphBuilder.replay`): standard data parallelism's all-reduce after the
optimizer (:func:`triosim.graph.data.data_parallel.build_reference`), tensor parallelism's
all-reduce of every split op's outputs that the next op waits for
(:func:`triosim.graph.tensor.per_op.build_from_plan` with the original's plan) and the replay of
the original's pipeline player (:mod:`triosim.graph.pipeline.reference`). One GPU and DDP
buckets are the composition's in that mode too (on the original's platform and trace scaling).
"""

from __future__ import annotations

from dataclasses import replace

from ..compute.op_parts import op_parts
from ..compute.op_time_source import gpu_timing
from ..errors import ConfigError
from ..hardware.platform import Platform
from ..limits import check_graph_size, op_copies
from ..schedule.list_scheduler import SCHEDULED_META, schedule
from ..schedule.network import attach_network
from ..schedule.sm_sharing import COMM_SMS_META, SM_COUNT_META
from ..schedule.tasks import TaskGraph
from ..trace import Trace
from ..trace.load import collector_paused
from . import composition, single
from .build_size import check_build_memory
from .composition import FOLD_CHECKS_META, MIRRORS_META
from .data import data_parallel
from .pipeline import reference
from .rank_map import RankMap
from .replica_symmetry import representatives_refused
from .strategy import Strategy
from .tensor.megatron import plan_tensor_parallel
from .tensor.per_op import build_from_plan


class GraphBuilder:
    """Builds the DAG of ``strategy`` on ``platform`` from ``trace``: :meth:`check`, :meth:`compose`,
    then the run's ``parallel`` block and the platform's network recorded on the graph."""

    def __init__(self, trace: Trace, platform: Platform, strategy: Strategy, fold: bool = False,
                 memory_twins: tuple[int, ...] = ()) -> None:
        self.trace = trace
        self.memory_twins = memory_twins  # see composition.build
        self.platform = platform
        self.strategy = strategy
        self.requested = strategy  # as given (the JSON's ``parallel``); :meth:`check` may settle ``exact``
        # A data-parallel preset built as GPU 0 and its mirrors (composition.folds), where no
        # output needs every GPU's tasks (a timeline, a DOT export) and no SMs are shared.
        self.fold = fold and self.sm_sharing() is None

    def build(self) -> TaskGraph:
        self.check()
        graph = self.finish(self.compose())
        if graph.meta.get(MIRRORS_META) and not mirrors_hold(graph):
            self.fold = False  # a member's part of a collective ends apart from GPU 0's: build every GPU
            graph = self.finish(self.compose())
        return graph

    def finish(self, graph: TaskGraph) -> TaskGraph:
        """The run-level blocks and the platform's network recorded on a composed graph."""
        graph.meta.setdefault("parallel", self.requested.parallel_dict(self.platform.num_gpus))
        precision = self.trace.precision
        if precision is not None:  # only under a training dtype: a run as traced writes what it always wrote
            graph.meta["precision"] = {"dtype": precision.dtype, "grad_reduce_dtype": precision.grad_reduce_dtype,
                                       "master_weights": precision.mixed}
            if precision.fp8 is not None:  # FP8 training: its recipe (docs/precision.md)
                graph.meta["precision"]["fp8"] = precision.fp8.to_dict()
            opt = precision.optimizer
            if opt.precision_aware:  # the precision-aware optimizer's state dtypes and bytes
                graph.meta["precision"]["optimizer"] = {
                    "precision_aware": True, "main_grads_dtype": opt.main_grads, "main_params_dtype": opt.main_params,
                    "exp_avg_dtype": opt.exp_avg, "exp_avg_sq_dtype": opt.exp_avg_sq,
                    "master_weight_bytes": precision.master_weight_bytes, "moment_bytes": precision.moment_bytes}
        # Each compute task names its trace op; the time breakdown reads the op's phase here.
        graph.meta.setdefault("op_stages", tuple(op.stage for op in self.trace.ops))
        # ... and the kinds of kernel its time is spent on (GEMM, FP8 casts, attention, other)
        graph.meta.setdefault("op_parts", op_parts(self.trace, self.strategy.micro_batch_size))
        self.share_sms(graph)
        return attach_network(graph, self.platform)

    def sm_sharing(self) -> tuple[int, int] | None:
        """(SMs, SMs a collective takes) with ``--gpu`` on a device whose file gives both, else None."""
        timing = gpu_timing(self.trace)
        device = timing.device if timing is not None else None
        if device is not None and device.sm_count and device.collective_sms and not self.strategy.reference_compat:
            return device.sm_count, device.collective_sms
        return None

    def share_sms(self, graph: TaskGraph) -> None:
        """With ``--gpu`` on a device whose file gives ``sm_count`` and ``collective_sms``: record
        them for the scheduler, whose compute then slows while communication holds SMs
        (:mod:`triosim.schedule.sm_sharing`); without them SMs are not shared."""
        sms = self.sm_sharing()
        if sms is not None:
            graph.meta[SM_COUNT_META], graph.meta[COMM_SMS_META] = sms

    def check(self) -> None:
        """Refuse a bad strategy, and at once what would exhaust the task limit or the machine's
        memory after minutes of building. Where one representative pipeline cannot stand for
        the others (:func:`~triosim.graph.replica_symmetry.representatives_refused`),
        ``--representatives`` is refused and the default builds every GPU."""
        strategy, n = self.strategy, self.platform.num_gpus
        strategy.validate(n if strategy.hybrid else None)
        why = None
        if strategy.hybrid and strategy.exact is not True:
            why = representatives_refused(self.platform, RankMap(*strategy.degrees(n), tuple(strategy.rank_order)))
            if why is not None and strategy.exact is False:
                raise ConfigError(f"--representatives: {why}; use --exact, or a topology whose GPUs have links "
                                  "of their own (switch, nvlink-cluster, fully-connected, a cluster file)")
            if why is not None:
                self.strategy = strategy = replace(strategy, exact=True)
        what = strategy.name if strategy.hybrid else f"-case {strategy.case}"
        try:
            check_graph_size(len(self.trace.ops), op_copies(strategy, n), n, what)
            check_build_memory(self.trace, self.platform, strategy, representatives=why is None)
        except ConfigError as exc:
            if why is None:
                raise
            raise ConfigError(f"{exc} (every GPU is built: {why})") from None

    def compose(self) -> TaskGraph:
        """The DAG without the run-level blocks: case 0's one GPU, the original's replay under
        ``--reference-compat`` where it has one, else the composition."""
        strategy = self.strategy
        if not strategy.hybrid and strategy.preset.axis is None:  # one GPU: from the trace's columns only
            return single.build(self.trace, self.platform, strategy)
        graph = self.replay() if strategy.reference_compat else None
        return graph if graph is not None else composition.build(self.trace, self.platform, strategy, fold=self.fold,
                                                                   memory_twins=self.memory_twins)

    def replay(self) -> TaskGraph | None:
        """The original's model of this preset where it is not the composition's (None: it is)."""
        trace, platform, strategy = self.trace, self.platform, self.strategy
        preset = strategy.preset
        if preset.axis == "pp":
            return reference.build(trace, platform, strategy)
        if preset.axis == "tp":
            plan = plan_tensor_parallel(trace, platform.num_gpus, style="per-op", reference_compat=True)
            return build_from_plan(trace, platform, strategy, plan)
        if preset.axis == "dp" and preset.gradient_sync == "whole":
            return data_parallel.build_reference(trace, platform, strategy)
        return None


def mirrors_hold(graph: TaskGraph) -> bool:
    """Whether a folded graph's schedule is its exact build's: every member's completion task of
    every collective ends when GPU 0's does. Each GPU's program then starts every op when GPU
    0's does (the same chain of durations on a stream of its own, the same waits), so it would
    feed the collectives as GPU 0 does, and every collective runs as it ran here."""
    sched = schedule(graph)
    end = sched.end
    if not all(end[m] == end[built] for members, built in graph.meta.pop(FOLD_CHECKS_META) for m in members):
        return False
    graph.meta[SCHEDULED_META] = sched  # the run's own schedule: the next schedule(graph) takes it
    return True


def build_graph(trace: Trace, platform: Platform, strategy: Strategy, fold: bool = False,
                memory_twins: tuple[int, ...] = ()) -> TaskGraph:
    """The task DAG of one training iteration of ``trace`` under ``strategy`` on ``platform``.
    ``fold``: a data-parallel preset may be built as GPU 0 and its mirrors (the graph's
    ``mirrors``; only where nothing needs every GPU's tasks: the report mirrors them).
    ``memory_twins``: ZeRO stages whose memory peaks are recorded too (see
    :func:`triosim.graph.composition.build`).

    A large mesh makes millions of tasks' lists, tuples and dicts, all alive until the run ends
    and none of them cyclic garbage: the cyclic collector, which walked them again and again
    (a third of a 1T-parameter build), is paused meanwhile, as for loading a trace."""
    with collector_paused():
        return GraphBuilder(trace, platform, strategy, fold, memory_twins).build()


__all__ = ["GraphBuilder", "build_graph"]
