"""The rules across a trace's cells (issue 24): every shipped and reference trace still passes
them with both readers, and the data-flow exceptions they allow (parameters read before the
optimizer writes them) stay allowed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from triosim.errors import TraceError
from triosim.trace import load_trace
from triosim.trace.model import tensor_type_problem

ROOT = Path(__file__).resolve().parents[1]
REAL = sorted(p for p in (ROOT / "sample_trace").iterdir() if (p / "trace.csv").is_file())
REFERENCE = sorted((ROOT.parent / "shared" / "reference" / "sample_trace" / "trace2-h100-bs128").glob("*"))
if not REFERENCE:
    REFERENCE = sorted(Path("/work/shared/reference/sample_trace/trace2-h100-bs128").glob("*"))


@pytest.mark.parametrize("trace", REAL + REFERENCE, ids=lambda p: p.name)
def test_real_traces_pass_the_rules_with_both_readers(trace: Path) -> None:
    slow = load_trace(trace, batch_size=8, fast=False)
    fast = load_trace(trace, batch_size=8, fast=True)
    assert fast == slow


def test_parameter_read_before_a_later_write_stays_external(tmp_path: Path) -> None:
    """The reference traces read one weight before a later backward op writes it: accepted."""
    ref = [p for p in REFERENCE if p.name == "vgg13"]
    if not ref:
        pytest.skip("reference traces absent")
    trace = load_trace(ref[0], batch_size=128)
    assert "276" in trace.external


def test_activation_read_before_its_write_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / "t"
    shutil.copytree(ROOT / "sample_trace" / "resnet18-cpu-bs16", d)
    lines = (d / "trace.csv").read_text().split("\n")
    lines[1], lines[3] = lines[3], lines[1]  # batch_norm before the conv2d that makes its input
    (d / "trace.csv").write_text("\n".join(lines))
    for fast in (False, True):
        with pytest.raises(TraceError, match="trace.csv:2: Operator_input: reads tensor 17 before line 4 writes it"):
            load_trace(d, batch_size=16, fast=fast)


@pytest.mark.parametrize("raw, ok", [("weight", True), ("bias=None", True), ("mat2", True), ("reservespace", True),
                                     ("weights", True), ("", True), ("wieght", False), ("bais", False),
                                     ("12", False), ("a b", False), ("[4]", False)])
def test_tensor_types(raw: str, ok: bool) -> None:
    assert (tensor_type_problem(raw) is None) == ok
