"""Training throughput of one simulated iteration: batch, samples/s, tokens/s, TFLOP/s per GPU, MFU.

- **Global batch**: the samples one iteration trains over every data-parallel replica, the
  simulated per-replica batch × dp (a ``-case`` run: case 1 and 2 train a batch per GPU, cases
  3 and 4 one batch over all GPUs). A replica cuts its batch into micro-batches
  (``-micro-batch-size``; one micro-batch when it is not given, and outside pipelines for
  ``-case`` runs); ``micro_batch`` is the first one's size (under ``-case 4`` the last may be
  smaller).
- **samples/s** = global batch / iteration time; **tokens/s** = samples/s × the sequence length,
  when the trace says it has one (meta.json's ``seq_len``).
- **Model FLOPs** (:mod:`triosim.compute.model_flops`): 3 × the forward's matrix-unit FLOPs per
  sample × the global batch, recomputation excluded. **TFLOP/s per GPU** = model FLOPs /
  iteration time / GPUs. **MFU** = that / the GPU's dense matrix peak in the run's math dtype
  (the dtype doing most of the matrix FLOPs), from the device database: only with ``--gpu``.
  A trace whose forward has no matrix op with shapes to count gives no FLOP figures (None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..compute.op_time_source import GpuTiming
from ..graph.pipeline.builder import micro_batch_sizes
from ..graph.strategy import Strategy
from ..trace import Trace


@dataclass(frozen=True)
class Throughput:
    """What one iteration trains and how fast; rates are per second of simulated time."""

    global_batch: int  # samples per iteration, all data-parallel replicas
    data_parallel: int
    micro_batch: int  # samples per micro-batch (the first's)
    micro_batches: int  # per replica
    iteration_s: float
    gpus: int
    model_flops: float | None  # per iteration, recomputation excluded; None: the trace has no shapes to count
    seq_len: int | None = None
    peak_flops: float | None = None  # one GPU's dense matrix peak in ``peak_dtype`` (with --gpu)
    peak_dtype: str | None = None
    gpu_name: str | None = None

    @property
    def samples_per_s(self) -> float | None:
        return self.global_batch / self.iteration_s if self.iteration_s > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        sps = self.samples_per_s
        return sps * self.seq_len if sps is not None and self.seq_len else None

    @property
    def flops_per_gpu(self) -> float | None:
        """Model FLOP/s per GPU."""
        if self.model_flops is None or not self.iteration_s > 0 or self.gpus < 1:
            return None
        return self.model_flops / self.iteration_s / self.gpus

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: model FLOP/s per GPU / the GPU's dense peak (None without --gpu)."""
        achieved = self.flops_per_gpu
        return achieved / self.peak_flops if achieved is not None and self.peak_flops else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON ``throughput`` object (rounded as ``Result.to_dict``: 1e-9, FLOPs to 1e-3)."""

        def r(x: float | None, digits: int = 9) -> float | None:
            return None if x is None else round(x, digits)

        achieved = self.flops_per_gpu
        return {
            "global_batch": self.global_batch,
            "data_parallel": self.data_parallel,
            "micro_batch": self.micro_batch,
            "micro_batches": self.micro_batches,
            "seq_len": self.seq_len,
            "samples_per_s": r(self.samples_per_s),
            "tokens_per_s": r(self.tokens_per_s),
            "model_flops_per_iteration": r(self.model_flops, 3),
            "model_tflops_per_s_per_gpu": r(achieved / 1e12 if achieved is not None else None),
            "peak_tflops_per_gpu": r(self.peak_flops / 1e12 if self.peak_flops else None),
            "peak_dtype": self.peak_dtype,
            "mfu": r(self.mfu),
        }


def per_replica_micro_batches(strategy: Strategy, batch: int) -> tuple[int, ...]:
    """The micro-batch sizes one replica trains: a hybrid run's and case 4's from
    ``-micro-batch-size``; the other ``-case`` presets run the whole batch at once."""
    if not strategy.hybrid and strategy.preset.axis != "pp":
        return (batch,)
    mb = strategy.micro_batch_size
    if strategy.reference_compat and mb is not None and mb < batch:
        return (mb,) * (batch // mb)  # the original's ⌊batch / micro-batch⌋ rounds
    return micro_batch_sizes(batch, mb)


def throughput_of(trace: Trace, strategy: Strategy, num_gpus: int, iteration_s: float,
                  flops_per_sample: float, timing: GpuTiming | None = None) -> Throughput:
    """The throughput of a run of ``trace`` (scaled to its per-replica batch) under ``strategy``
    on ``num_gpus`` GPUs that took ``iteration_s``; ``flops_per_sample``: model FLOPs of one
    sample (:func:`triosim.compute.model_flops.model_flops_per_sample`); ``timing``: the run's
    GPU (None without ``--gpu``: no peak, no MFU)."""
    dp = strategy.degrees(num_gpus)[0]
    sizes = per_replica_micro_batches(strategy, trace.batch_size)
    global_batch = trace.batch_size * dp
    peak = dtype = name = None
    if timing is not None:
        dtype = timing.dtype.split("/")[0]  # the math dtype doing most of the matrix FLOPs
        peak = timing.device.matrix_flops.get(dtype)  # a device without that matrix peak: no MFU
        name = timing.device.display_name
    return Throughput(global_batch=global_batch, data_parallel=dp, micro_batch=sizes[0], micro_batches=len(sizes),
                      iteration_s=iteration_s, gpus=num_gpus,
                      # a trace without shapes (or without matrix ops) has no count: unknown, not zero
                      model_flops=flops_per_sample * global_batch if flops_per_sample > 0 else None,
                      seq_len=sequence_length(trace), peak_flops=peak, peak_dtype=dtype, gpu_name=name)


def sequence_length(trace: Trace) -> int | None:
    """The trace's sequence length (meta.json's ``seq_len``), None when it has none."""
    value = (trace.info or {}).get("seq_len")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _si(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if x >= scale:
            return f"{x / scale:,.1f} {unit}"
    return f"{x:,.0f} "


def throughput_lines(d: dict[str, Any], gpu_name: str | None = None) -> list[str]:
    """The summary's lines for a JSON ``throughput`` object ``d`` (each within 80 columns on
    models of up to 10^6 samples/s and PFLOPs per iteration)."""
    mb = d["micro_batches"]
    lines = [f"Batch: global {d['global_batch']:,} = dp {d['data_parallel']} × {mb} micro-batch"
             f"{'es' if mb != 1 else ''} of {d['micro_batch']:,}"]
    rates = []
    if d.get("samples_per_s") is not None:
        rates.append(f"{d['samples_per_s']:,.1f} samples/s")
    if d.get("tokens_per_s") is not None:
        rates.append(f"{d['tokens_per_s']:,.0f} tokens/s (sequence {d['seq_len']:,})")
    if rates:
        lines.append("Throughput: " + " · ".join(rates))
    tflops = d.get("model_tflops_per_s_per_gpu")
    if tflops is not None:
        lines.append(f"Model FLOPs: {_si(d['model_flops_per_iteration'])}FLOP an iteration · "
                     f"{tflops:,.2f} TFLOP/s per GPU")
    if d.get("mfu") is not None:
        who = f"{gpu_name}'s " if gpu_name else ""
        lines.append(f"MFU: {d['mfu'] * 100:.1f} % of {who}dense {d['peak_dtype']} peak "
                     f"({d['peak_tflops_per_gpu']:,.0f} TFLOP/s)")
    return lines


__all__ = ["Throughput", "per_replica_micro_batches", "sequence_length", "throughput_lines", "throughput_of"]
