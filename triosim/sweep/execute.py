"""Running the configurations of a sweep: validation, the work item, and three backends.

A configuration is *invalid* when ``triosim run`` would refuse its flags (the same checks, from
:mod:`triosim.config`: ``check_flags`` and the batch checks of ``resolve_batches``, and a
ConfigError while building its DAG); it is *failed* when its simulation raised anything else, or
its parallelism case has no graph builder yet. Neither stops the sweep.

Backends: in-process; a local process pool; a Dask distributed cluster. The raw traces are
loaded once in the parent, shipped once to each worker (pool initializer, ``client.scatter(...,
broadcast=True)``) and scaled to each configuration's batch on the worker, where the scaled
copy is cached for the configurations that follow.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..compute.model_flops import model_flops_per_sample
from ..compute.scale import scale_trace
from ..config import (
    check_case,
    layers_to_repeat,
    load_recorded_trace,
    op_time_options,
    platform_from_args,
    resolve_batches,
    strategy_from_args,
)
from ..config.build import gpu_timing_options
from ..config.gpu import GpuOptions, verdict_capacity
from ..config.model_flags import card_flag
from ..config.precision import with_flag_precision
from ..errors import ConfigError, TriosimError
from ..trace import Trace
from .grid import Point

# (trace directory, batch the trace was recorded at, op-time column, --num-layers, op-time
# model, kernel floor in µs, the GPU flags that time the ops or None): what
# config.load_recorded_trace reads.
TraceKey = tuple[str, int, str, "int | None", str, float, "GpuOptions | None"]

OK, INVALID, FAILED = "ok", "invalid", "failed"


@dataclass
class TraceSet:
    """The raw traces of a sweep, keyed by how they were loaded, plus a per-worker cache of
    batch-scaled copies (never shipped: it is dropped when pickled)."""

    traces: dict[TraceKey, Trace]
    _scaled: dict[tuple[TraceKey, int, bool], Trace] = field(default_factory=dict, repr=False, compare=False)
    _flops: dict[TraceKey, float] = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"traces": self.traces, "_scaled": {}, "_flops": {}}

    def flops_per_sample(self, key: TraceKey) -> float:
        """Model FLOPs of one sample of the trace of ``key`` (recorded at batch ``key[1]``)."""
        hit = self._flops.get(key)
        if hit is None:
            hit = self._flops[key] = model_flops_per_sample(self.traces[key], key[1])
        return hit

    def scaled(self, key: TraceKey, batch_size_sim: int, reference_compat: bool) -> Trace:
        ck = (key, batch_size_sim, reference_compat)
        hit = self._scaled.get(ck)
        if hit is None:
            hit = scale_trace(self.traces[key], batch_size_sim, reference_compat=reference_compat)
            self._scaled[ck] = hit
        return hit


@dataclass(frozen=True)
class Task:
    """What a worker needs for one configuration: its flags and which loaded trace to use."""

    index: int
    config: tuple[tuple[str, Any], ...]
    trace_key: TraceKey
    batch_size_sim: int
    # (index, flags) of configurations that differ from this one only in --zero 2 where it has
    # --zero 1: their DAG is this one's, their memory plan their own (with_zero_twins)
    twins: tuple[tuple[int, tuple[tuple[str, Any], ...]], ...] = ()


@dataclass(frozen=True)
class Outcome:
    """The figures of one configuration (rounded to 1e-9 like ``Result.to_dict``)."""

    index: int
    status: str
    reason: str = ""
    makespan_ms: float | None = None
    mean_compute_ms: float | None = None
    mean_exposed_comm_ms: float | None = None
    max_peak_memory_bytes: int | None = None
    tasks: int | None = None
    samples_per_s: float | None = None  # training throughput: samples of one iteration / its time
    global_batch: int | None = None  # samples of one iteration over all data-parallel replicas
    micro_batch: int | None = None
    micro_batches: int | None = None  # per replica
    tokens_per_s: float | None = None  # with a sequence length (meta.json's seq_len)
    tflops_per_gpu: float | None = None  # model FLOP/s per GPU / 1e12 (recomputation excluded)
    mfu: float | None = None  # with --gpu: model FLOPs utilisation against its dense peak
    gpu: str | None = None  # with --gpu: the device and the op-time source used
    op_time_source: str | None = None
    fits: bool | None = None  # under a memory verdict: whether every GPU's peak fits its capacity


def _r(x: float) -> float:
    return round(x, 9)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, TriosimError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_task(traces: TraceSet, task: Task) -> Outcome:
    """Simulate one configuration; every error becomes an Outcome, never an exception."""
    return _simulated(traces, task)[0]


def run_tasks(traces: TraceSet, task: Task) -> list[Outcome]:
    """The outcome of ``task``, then its twins': each takes the task's simulation with its own
    memory plan (``peaks_under_zero``), or where the build could not give that one, its own run."""
    if not task.twins:
        return [run_task(traces, task)]
    zeros = tuple(int(dict(config)["zero"]) for _, config in task.twins)
    main, peaks, capacity = _simulated(traces, task, zeros)
    out = [main]
    for (index, config), zero in zip(task.twins, zeros):
        got = peaks.get(zero) if main.status == OK and peaks is not None else None
        if got is None:
            out.append(run_task(traces, replace(task, index=index, config=config, twins=())))
        else:
            out.append(replace(main, index=index, max_peak_memory_bytes=max(got.values(), default=0),
                               fits=None if capacity is None else all(p <= capacity for p in got.values())))
    return out


def with_zero_twins(tasks: Sequence[Task]) -> list[Task]:
    """``tasks`` with each ``--zero 2`` configuration whose ``--zero 1`` twin (every other flag the
    same) is among them folded into the twin's task (:attr:`Task.twins`): ZeRO-2 shards the
    gradient buffers too and changes no task, so one simulation times both."""
    def flags_but_zero(t: Task) -> str:
        return repr((t.trace_key, t.batch_size_sim, tuple(kv for kv in t.config if kv[0] != "zero")))

    def zero(t: Task) -> str:
        return str(dict(t.config).get("zero"))

    ones = {flags_but_zero(t): t.index for t in tasks if zero(t) == "1"}
    folded: dict[int, list[tuple[int, tuple]]] = {}
    for t in tasks:
        one = ones.get(flags_but_zero(t)) if zero(t) == "2" else None
        if one is not None:
            folded.setdefault(one, []).append((t.index, t.config))
    twins = {index for pairs in folded.values() for index, _ in pairs}
    return [replace(t, twins=tuple(folded.get(t.index, ()))) for t in tasks if t.index not in twins]


def _simulated(traces: TraceSet, task: Task, memory_twins: tuple[int, ...] = ()
               ) -> tuple[Outcome, dict[int, dict[int, int]] | None, int | None]:
    """(the outcome of ``task``, the peaks per GPU of its ``memory_twins`` as the graph records
    them, the capacity its memory verdict judged against)."""
    from argparse import Namespace

    from ..compute.op_time_source import gpu_timing
    from ..report.memory_verdict import memory_verdict
    from ..report.throughput import throughput_of
    from ..simulation import simulate as run_simulation

    ns = Namespace(**dict(task.config))
    try:
        platform = platform_from_args(ns)
        trace = with_flag_precision(traces.scaled(task.trace_key, task.batch_size_sim, bool(ns.reference_compat)), ns)
        strategy = strategy_from_args(ns, trace.batch_size)
        result = run_simulation(trace, platform, strategy, memory_twins=memory_twins)
        timing = gpu_timing(trace)
        judged = verdict_capacity(ns)
        fits = memory_verdict(result.graph, trace, strategy, *judged).fits if judged is not None else None
        rates = throughput_of(trace, strategy, platform.num_gpus, result.makespan_s,
                              traces.flops_per_sample(task.trace_key), timing)
    except ConfigError as exc:
        return Outcome(task.index, INVALID, _reason(exc)), None, None
    except Exception as exc:  # a failed configuration is data, not the end of the sweep
        return Outcome(task.index, FAILED, _reason(exc)), None, None
    gpus = result.per_gpu
    n = max(1, len(gpus))
    outcome = Outcome(
        index=task.index,
        status=OK,
        makespan_ms=_r(result.makespan_ms),
        mean_compute_ms=_r(sum(g.compute_ms for g in gpus) / n),
        mean_exposed_comm_ms=_r(sum(g.exposed_comm_ms for g in gpus) / n),
        max_peak_memory_bytes=max((g.peak_memory_bytes for g in gpus), default=0),
        tasks=len(result.graph),
        samples_per_s=_rounded(rates.samples_per_s),
        global_batch=rates.global_batch,
        micro_batch=rates.micro_batch,
        micro_batches=rates.micro_batches,
        tokens_per_s=_rounded(rates.tokens_per_s),
        tflops_per_gpu=_rounded(rates.flops_per_gpu / 1e12 if rates.flops_per_gpu is not None else None),
        mfu=_rounded(rates.mfu),
        gpu=timing.device.name if timing is not None else None,
        op_time_source=timing.source if timing is not None else None,
        fits=fits,
    )
    return outcome, result.graph.meta.get("memory_twins"), judged[0] if judged is not None else None


def _rounded(x: float | None) -> float | None:
    return None if x is None else _r(x)


# ----------------------------------------------------------------------------- preparation


@dataclass
class Prepared:
    """The grid split into what runs (``tasks``) and what was settled without running."""

    tasks: list[Task]
    settled: list[Outcome]
    traces: TraceSet
    trace_dirs: list[str]


def _builder_missing(case: int) -> bool:
    """Whether the graph builder has no preset for a named ``case``."""
    from ..graph.strategy import CASE_NAMES, PRESETS

    return case in CASE_NAMES and case not in PRESETS


def prepare(points: Sequence[Point]) -> Prepared:
    """Validate every point as ``triosim run`` would, then load each distinct trace once."""
    from ..graph.strategy import CASE_NAMES

    infos: dict[str, tuple[int, str]] = {}
    pending: list[tuple[Point, TraceKey, int]] = []
    cards: dict[TraceKey, str | None] = {}
    settled: list[Outcome] = []
    for point in points:
        ns = point.namespace()
        try:
            # The order of `configure`'s checks, so a point gets the error `run` would print.
            check_case(ns)
            platform_from_args(ns)
            batches = resolve_batches(ns, infos)
            strategy_from_args(ns, batches.sim)
        except TriosimError as exc:
            settled.append(Outcome(point.index, INVALID, _reason(exc)))
            continue
        trace_dir, batch, sim = str(batches.trace_dir), batches.batch, batches.sim
        if _builder_missing(ns.case):
            # The message `triosim run` gives; failed, not invalid: the flags are fine.
            settled.append(Outcome(point.index, FAILED,
                                   f"-case {ns.case} ({CASE_NAMES[ns.case]}) is not implemented yet"))
            continue
        key = (trace_dir, batch, ns.time_column, layers_to_repeat(ns), *op_time_options(ns), gpu_timing_options(ns))
        pending.append((point, key, sim))
        cards.setdefault(key, card_flag(ns))  # a card's trace: its errors name the card

    loaded: dict[TraceKey, Trace] = {}
    broken: dict[TraceKey, str] = {}
    for _, key, _ in pending:
        if key in loaded or key in broken:
            continue
        try:
            loaded[key] = load_recorded_trace(*key, card=cards.get(key))
        except TriosimError as exc:
            broken[key] = _reason(exc)
    tasks = []
    for point, key, sim in pending:
        if key in broken:
            settled.append(Outcome(point.index, INVALID, broken[key]))
        else:
            tasks.append(Task(point.index, point.config, key, sim))
    dirs = sorted({k[0] for k in loaded} | {k[0] for k in broken})
    return Prepared(tasks, sorted(settled, key=lambda o: o.index), TraceSet(loaded), dirs)


# ----------------------------------------------------------------------------- backends

OnOutcome = Callable[[Outcome], None]
OnReady = Callable[[], None]  # called once the backend is up and every task is submitted


def _noop() -> None:
    return None


def run_inprocess(traces: TraceSet, tasks: Sequence[Task], on_outcome: OnOutcome,
                  on_ready: OnReady = _noop) -> None:
    on_ready()
    for task in tasks:
        for outcome in run_tasks(traces, task):
            on_outcome(outcome)


@dataclass
class _WorkerSlot:
    traces: TraceSet | None = None


# The one per-process slot a pool initializer can fill: it is set only inside pool worker
# processes, once, so that tasks carry an index and flags instead of the whole trace.
_WORKER = _WorkerSlot()


def _pool_init(traces: TraceSet) -> None:
    # Ctrl-C reaches the whole process group; the parent decides what to keep, so workers
    # must not die mid-task with a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER.traces = traces


def _pool_run(task: Task) -> list[Outcome]:
    assert _WORKER.traces is not None, "pool worker used without its initializer"
    return run_tasks(_WORKER.traces, task)


def _failed(task: Task, reason: str) -> list[Outcome]:
    """``task``'s and its twins' outcomes when the task never came back."""
    return [Outcome(index, FAILED, reason) for index in (task.index, *(i for i, _ in task.twins))]


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def pool_context() -> Any:
    """fork when this process runs no other thread (no pickling of the traces, no re-import of
    ``__main__``, fast start); else forkserver, whose workers never inherit another thread's
    held locks."""
    import multiprocessing
    import threading

    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def run_pool(traces: TraceSet, tasks: Sequence[Task], jobs: int, on_outcome: OnOutcome,
             on_ready: OnReady = _noop) -> None:
    """A local process pool; a worker that dies fails its configuration (and the pool's rest)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    executor = ProcessPoolExecutor(max_workers=max(1, min(jobs, len(tasks))), mp_context=pool_context(),
                                   initializer=_pool_init, initargs=(traces,))
    try:
        # With fork, every worker starts at the first submit, before on_ready starts any
        # progress-bar thread.
        futures = {executor.submit(_pool_run, t): t for t in tasks}
        on_ready()
        for fut in as_completed(futures):
            exc = fut.exception()
            for outcome in (fut.result() if exc is None
                            else _failed(futures[fut], f"worker process died ({_reason(exc)})")):
                on_outcome(outcome)
    except BaseException:
        _terminate_workers(executor)  # before shutdown(), which forgets the process table
        executor.shutdown(wait=False, cancel_futures=True)
        raise
    executor.shutdown(wait=True)


def _terminate_workers(executor: Any) -> None:
    """Stop a pool's running workers now (Python 3.14 has a method; before, the process table)."""
    stop = getattr(executor, "terminate_workers", None)
    if stop is not None:
        stop()
        return
    for proc in list((getattr(executor, "_processes", None) or {}).values()):
        proc.terminate()


def run_dask(address: str, traces: TraceSet, tasks: Sequence[Task], on_outcome: OnOutcome,
             timeout_s: float = 20.0, on_ready: OnReady = _noop) -> None:
    """A Dask distributed cluster: ``address`` is ``tcp://HOST:PORT`` or a scheduler file."""
    client = connect_dask(address, timeout_s)
    futures: list[Any] = []
    try:
        from distributed import as_completed

        shipped = client.scatter(traces, broadcast=True, hash=False)
        # Explicit keys: two configurations never share one even if their flags coincide, and
        # two sweeps on one cluster never share theirs.
        token = uuid.uuid4().hex[:12]
        futures = [client.submit(run_tasks, shipped, t, pure=False, key=f"triosim-sweep-{token}-{t.index}")
                   for t in tasks]
        by_key = {f.key: t for f, t in zip(futures, tasks)}
        on_ready()
        for fut in as_completed(futures, loop=client.loop):
            for outcome in (fut.result() if fut.status == "finished"
                            else _failed(by_key[fut.key], f"dask task {fut.status}{_dask_error(fut)}")):
                on_outcome(outcome)
            fut.release()
    except BaseException:
        if futures:
            try:
                client.cancel(futures)
            except Exception:  # the scheduler may be gone already; closing is all that is left
                pass
        raise
    finally:
        client.close()


def _dask_error(fut: Any) -> str:
    try:
        exc = fut.exception(timeout=1)
    except Exception:  # cancelled futures have no exception to fetch
        return ""
    return f" ({_reason(exc)})" if exc is not None else ""


def require_distributed() -> None:
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise ConfigError("--dask needs dask.distributed: pip install 'triosim[cluster]'") from None


def check_dask_address(address: str) -> None:
    """Refuse what is neither a scheduler file nor ``[PROTOCOL://]HOST:PORT``, before the sweep
    opens its outputs and before a Client is built: a Client whose constructor fails on the
    address is left half-built, and its finalizer printed a traceback 40 s later."""
    if "://" not in address and Path(address).is_file():
        return
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--dask: {address!r} is neither a scheduler file nor an address HOST:PORT "
                          "(e.g. tcp://10.0.0.5:8786)")


def connect_dask(address: str, timeout_s: float = 20.0) -> Any:
    require_distributed()
    from distributed import Client

    kwargs: dict[str, Any]
    if "://" not in address and Path(address).is_file():
        kwargs = {"scheduler_file": address}
    else:
        check_dask_address(address)
        kwargs = {"address": address}
    try:
        return Client(**kwargs, timeout=timeout_s, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(f"--dask: cannot reach the Dask scheduler at {address} ({_reason(exc)})") from None
