"""A random audit of `plan`'s estimate against the task DAG, over plan's own candidates.

The tests compare the estimate with the DAG on stratified samples chosen by hand; this draws
candidates at random (seeded) from everything `plan` would consider for a few small setups
(dense Llama with context parallelism over two nodes, FP8 Llama 3 70B, Qwen3 30B-A3B and
GPT-OSS with expert parallelism, Qwen3 30B-A3B again in Megatron-Core's rank order), DAG-times each and prints the time and peak-memory errors,
marking those beyond 5 %. It prints figures only; nothing is asserted.

    python bench/plan_audit.py                      # every setup, 40 candidates each, seed 7
    python bench/plan_audit.py --setups llama-cp --count 100 --seed 1
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from triosim.cli.console import build_parser  # noqa: E402
from triosim.cli.plan import plan_inputs  # noqa: E402
from triosim.plan import PipelineTimer, estimate  # noqa: E402
from triosim.plan.candidates import enumerate_candidates  # noqa: E402
from triosim.plan.report import dag_seconds  # noqa: E402
from triosim.plan.search import Row, dag_time  # noqa: E402

TWO_NODES = ["--gpu", "h100-sxm", "--topology", "nvlink-cluster", "--gpus-per-node", "8", "--gpus", "16"]
SETUPS = {
    "llama-cp": ["--model", "llama3-8b", "--num-layers", "4", "--seq-len", "8192", *TWO_NODES, "--global-batch", "16"],
    "llama-fp8": ["--model", "llama3-70b", "--num-layers", "4", "--seq-len", "4096", *TWO_NODES, "--global-batch",
                  "32", "--dtype", "fp8"],
    "qwen-moe": ["--model", "qwen3-30b-a3b", "--num-layers", "4", "--seq-len", "4096", *TWO_NODES, "--global-batch",
                 "16"],
    "gptoss": ["--model", "gpt-oss-120b", "--num-layers", "4", "--seq-len", "4096", *TWO_NODES, "--global-batch",
               "16"],
    # Megatron-Core's rank order (tp, cp, dp, pp), as the published recipes run
    "qwen-moe-order": ["--model", "qwen3-30b-a3b", "--num-layers", "4", "--seq-len", "4096", *TWO_NODES,
                       "--global-batch", "16", "--rank-order", "tp,cp,dp,pp"],
}
BOUND = 0.05


def audit(name: str, count: int, seed: int) -> tuple[int, int]:
    """DAG-time ``count`` random candidates of setup ``name``; returns (timed, beyond the bound)."""
    inputs = plan_inputs(build_parser().parse_args(["plan", *SETUPS[name]]))
    candidates = list(enumerate_candidates(inputs.space))
    sample = random.Random(seed).sample(candidates, min(count, len(candidates)))
    print(f"{name}: {len(candidates)} candidates, {len(sample)} drawn (seed {seed})", flush=True)
    timer = PipelineTimer(inputs.profile.platform)
    timed = off = 0
    errors: list[float] = []
    for c in sample:
        row = Row(c)
        t0 = time.process_time()
        dag_time([row], inputs.base, inputs.space.global_batch)
        dag_s = dag_seconds(row)
        if dag_s is None:
            print(f"  no DAG ({row.dag.reason}): {c}")
            continue
        e = estimate(c, inputs.profile, inputs.settings, timer)
        t_err = e.time_s / dag_s - 1
        m_err = e.peak_bytes / row.dag.max_peak_memory_bytes - 1
        beyond = abs(t_err) > BOUND or abs(m_err) > BOUND
        errors.append(abs(t_err))
        timed += 1
        off += beyond
        print(f"  time {t_err:+7.2%}  memory {m_err:+7.2%}  {time.process_time() - t0:4.1f} s  {c.mesh} mb{c.micro_batch} "
              f"{c.schedule_label} ZeRO-{c.zero} {c.recompute_label} SP {'on' if c.sequence_parallel else 'off'}"
              f"{' (' + c.layout_label + ')' if c.split.given else ''}{'  <<<' if beyond else ''}", flush=True)
    if errors:
        print(f"{name}: time |estimate / DAG - 1| mean {sum(errors) / len(errors):.2%}, max {max(errors):.2%}")
    return timed, off


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated, of {', '.join(SETUPS)}")
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    for name in args.setups.split(","):
        timed, off = audit(name.strip(), args.count, args.seed)
        print(f"{name}: {off} of {timed} beyond {BOUND:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
