"""The memory a build needs, estimated before building against the memory available: a graph
under the task limit but over the machine's memory is one line (exit 2) saying what it needs,
what there is and how to shrink it, not a MemoryError traceback minutes later; a MemoryError
that still happens is one line too."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

import triosim.graph.build_size as build_size
from triosim.cli.console import main
from triosim.config import configure
from triosim.errors import ConfigError
from triosim.graph import build_graph


def test_a_build_over_the_available_memory_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(build_size, "available_memory_bytes", lambda: 50_000_000, raising=False)
    trace, platform, strategy = configure(case=2, gpus=512, topology="ring")
    with pytest.raises(ConfigError) as info:
        build_graph(trace, platform, strategy)
    msg = str(info.value)
    assert msg.startswith("-case 2 on 512 GPUs would need at least 0.1 GB to build (81,920 tasks")
    assert "0.1 GB of memory is available: --dp 512 builds one representative GPU" in msg
    trace, platform, strategy = configure(dp=64, tp=2, topology="ring", exact=True, micro_batch_size=1)
    with pytest.raises(ConfigError, match="--representatives builds one pipeline"):
        build_graph(trace, platform, strategy)
    trace, platform, strategy = configure(case=2, gpus=1024, topology="switch")
    with pytest.raises(ConfigError, match="GB of all-reduce trees.*--collective-algo ring"):
        build_graph(trace, platform, strategy)


def test_a_small_build_passes_the_check() -> None:
    from triosim.limits import available_memory_bytes

    trace, platform, strategy = configure(dp=2, tp=2, pp=2, topology="switch")
    need = build_size.build_memory(trace, platform, strategy)
    assert 0 < need.total < (available_memory_bytes() or 10**12)
    assert len(build_graph(trace, platform, strategy)) > 0


def _limited(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


# One BLAS thread: on a machine of many cores their stacks alone would take much of the limit.
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def test_available_memory_follows_ulimit() -> None:
    code = "from triosim.limits import available_memory_bytes as a; print(a())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         preexec_fn=_limited(1_500_000_000), timeout=60, env=ENV)
    assert 0 < int(out.stdout) < 1_500_000_000


def test_case_2_on_4096_switch_gpus_under_1_5_gb_is_one_line(tmp_path) -> None:
    """It used to grow for 10 s and end in a MemoryError traceback."""
    done = subprocess.run([sys.executable, "-m", "triosim.cli", "run", "-case", "2", "-GPUnumber", "4096",
                           "--topology", "switch", "-q"], capture_output=True, text=True, cwd=tmp_path,
                          preexec_fn=_limited(1_500_000_000), timeout=300, env=ENV)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "would need at least 4.3 GB" in lines[0] and "GB of memory is available" in lines[0]


def test_a_memory_error_is_one_line(monkeypatch, capsys) -> None:
    import triosim.graph as graph_package

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(graph_package, "build_graph", exhausted)
    assert main(["run", "-case", "1", "-GPUnumber", "2", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("triosim: error: run ran out of memory (")
