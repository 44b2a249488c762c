"""plan's memory estimate with 16-bit gradients: the fp32 gradient copy the optimizer step makes
(held at the step only) is in the estimate as in the DAG's memory plan."""

from __future__ import annotations

import pytest

from triosim.cli.console import build_parser
from triosim.cli.plan import plan_inputs
from triosim.plan import Candidate as C
from triosim.plan import PipelineTimer, estimate
from triosim.plan.search import Row, dag_time

# a short sequence: the passes' activations are below the copy's 4 bytes a parameter, so the
# step is the peak
ARGV = ["--model", "llama3-8b", "--num-layers", "4", "--seq-len", "256", "--gpu", "h100-sxm", "--topology",
        "nvlink-cluster", "--gpus", "8", "--global-batch", "16", "--dtype", "bf16", "--grad-reduce-dtype", "bf16"]


@pytest.mark.parametrize("c", [C(1, 1, 8, 1, "1f1b", 1, 1, "none"), C(1, 2, 4, 1, "1f1b", 1, 0, "none")])
def test_the_estimate_holds_the_copy_at_the_step(c) -> None:
    inputs = plan_inputs(build_parser().parse_args(["plan", *ARGV]))
    row = Row(c)
    dag_time([row], inputs.base, inputs.space.global_batch)
    e = estimate(c, inputs.profile, inputs.settings, PipelineTimer(inputs.profile.platform))
    assert e.peak_bytes == pytest.approx(row.dag.max_peak_memory_bytes, rel=0.01)
