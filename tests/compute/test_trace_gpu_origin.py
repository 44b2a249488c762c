"""``--trace-gpu`` names the GPU that timed a trace whose meta.json does not say; it never turns
a CPU-timed or synthetic trace's times into a GPU's (it used to, silently: a CPU trace "measured
on an H100", kept or retargeted as such)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_capture import run
from triosim.sample_trace import trace_dir

SAMPLES = trace_dir().parent
CPU = ("--trace-gpu {g}: meta.json says this trace was timed on the CPU (AMD EPYC), and CPU times are not a GPU's; "
       "leave --trace-gpu out (--op-time-source auto times its ops by the roofline on --gpu)")



@pytest.mark.parametrize(("trace_gpu", "source"), [("h100", "auto"), ("h100", "trace"), ("a100", "auto"),
                                                   ("a100", "retarget")])
def test_trace_gpu_on_a_cpu_trace_is_refused(trace_gpu: str, source: str) -> None:
    code, out, err = run(["run", "--trace-dir", str(SAMPLES / "gpt-cpu-bs8"), "--gpu", "h100", "--trace-gpu", trace_gpu,
                          "--op-time-source", source, "-q"])
    assert (code, out) == (2, "")
    assert err == f"triosim: error: {CPU.format(g=trace_gpu)}\n"


def test_trace_gpu_on_a_synthetic_trace_is_refused(tmp_path: Path) -> None:
    from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

    d = write_synthetic_trace(tmp_path / "s", SyntheticModel(layers=2, batch_size=4))
    code, _, err = run(["run", "--trace-dir", str(d), "--gpu", "h100", "--trace-gpu", "h100", "-q"])
    assert code == 2 and err == ("triosim: error: --trace-gpu h100: this trace is synthetic (meta.json device: "
                                 "synthetic) and holds no measured times; leave --trace-gpu out (--op-time-source auto "
                                 "times its ops by the roofline on --gpu)\n")


def test_retarget_of_a_cpu_trace_no_longer_suggests_trace_gpu() -> None:
    code, _, err = run(["run", "--trace-dir", str(SAMPLES / "gpt-cpu-bs8"), "--gpu", "h100", "--op-time-source",
                        "retarget", "-q"])
    assert code == 2 and err == ("triosim: error: --op-time-source retarget needs a GPU-timed trace, and this one was "
                                 "timed on the CPU: use --op-time-source roofline (or auto)\n")


def test_a_gpu_trace_and_a_trace_without_meta_still_take_trace_gpu(tmp_path: Path) -> None:
    code, out, err = run(["run", "--trace-dir", str(SAMPLES / "gpt-h200-bs8"), "--gpu", "h200", "--trace-gpu", "h200",
                          "-q"])
    assert code == 0, err
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("trace.csv", "tensor.csv"):
        (bare / name).write_bytes((SAMPLES / "gpt-h200-bs8" / name).read_bytes())
    code, out2, err = run(["run", "--trace-dir", str(bare), "--batch-size", "8", "--gpu", "h200", "--trace-gpu", "h200",
                           "-q"])
    assert code == 0 and out2 == out, err  # the same trace, its GPU named by the flag: the same time
