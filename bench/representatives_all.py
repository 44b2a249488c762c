"""Representatives against ``--exact`` on every DP × TP × PP mesh of at most 64 GPUs.

    python bench/representatives_all.py              # every mesh, ZeRO 0, 1 and 3, both traces
    python bench/representatives_all.py --max-gpus 16
    python bench/representatives_all.py --topologies ring mesh fully-connected dgx-h100-superpod.yaml

The test suite compares a sample of these meshes (tests/graph/test_hybrid.py,
tests/graph/test_representatives_presets.py); this runs all of them: every dp, every tp dividing
the trace's attention heads (the synthetic MLP, which has none, takes tp 1, 2, 4, 8 per op), every
pp up to the layer count, each with ZeRO 0, 1 and 3, 1F1B, micro-batch 2, 4 GPUs per node, macro
collectives, under the original network model (the Python API's default: exclusive links, one
ring per collective). ``--topologies`` takes any built-in topology or a file of topologies/
(nvlink-cluster and switch by default; a cluster file takes the meshes of whole nodes, under the
command line's network model: flow sharing, where the two differ by up to 1e-4). Prints one
line per trace and topology with the number of meshes, the largest relative difference, how many
meshes the representative build built whole because their replicas meet the nodes differently
(triosim.graph.replica_symmetry) and how many refuse representatives (on ring and mesh, where
groups share links, unless one group spans every GPU), and every mesh above 1e-9, if any; exits 1
when there is one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from triosim.config import configure
from triosim.errors import ConfigError
from triosim.graph import build_graph
from triosim.graph.strategy import Strategy
from triosim.hardware.presets import build_platform
from triosim.schedule.list_scheduler import schedule
from triosim.trace import load_trace
from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

REPO = Path(__file__).resolve().parents[1]


def platform_of(n: int, topology: str):
    """A built-in topology of ``n`` GPUs (4 a node), or a topology file of topologies/ (None:
    ``n`` is not a whole number of its nodes)."""
    if not topology.endswith(".yaml"):
        return build_platform(num_gpus=n, topology=topology, gpus_per_node=4)
    try:
        return configure(topology_file=str(REPO / "topologies" / topology), dp=n)[1]
    except ConfigError:
        return None


def makespan(trace, platform, strategy: Strategy) -> tuple[float, bool]:
    """The iteration time, and whether one representative pipeline was built."""
    graph = build_graph(trace, platform, strategy)
    return schedule(graph).makespan, bool(graph.meta["hybrid"]["representatives"])


def meshes(max_gpus: int, tps: list[int], layers: int):
    for tp in tps:
        for pp in range(1, layers + 1):
            for dp in range(1, max_gpus // (tp * pp) + 1):
                if dp * tp * pp > 1:
                    yield dp, tp, pp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-gpus", type=int, default=64)
    ap.add_argument("--topologies", nargs="+", default=["nvlink-cluster", "switch"])
    args = ap.parse_args()
    worst_all = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        synthetic = write_synthetic_trace(Path(tmp) / "syn", SyntheticModel(layers=4, batch_size=8, seed=3))
        traces = [("GPT sample (4 heads, 4 layers)", load_trace(REPO / "sample_trace" / "gpt-cpu-bs8", batch_size=8),
                   [1, 2, 4], 4),
                  ("synthetic MLP (4 layers)", load_trace(synthetic, batch_size=8), [1, 2, 4, 8], 4)]
        for name, trace, tps, layers in traces:
            for topology in args.topologies:
                t0, count, worst, bad, unalike, refused = time.perf_counter(), 0, 0.0, [], 0, 0
                for dp, tp, pp in meshes(args.max_gpus, tps, layers):
                    platform = platform_of(dp * tp * pp, topology)
                    if platform is None:
                        continue
                    for zero in (0, 1, 3):
                        kw = dict(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch_size=2, schedule="1f1b",
                                  collective_detail="macro")
                        exact, _ = makespan(trace, platform, Strategy(exact=True, **kw))
                        try:
                            rep, one_pipeline = makespan(trace, platform, Strategy(exact=False, **kw))
                        except ConfigError:  # representatives refused here: the default builds every GPU
                            refused += 1
                            continue
                        unalike += not one_pipeline and dp * tp > 1  # (dp·tp = 1: one replica anyway)
                        diff = abs(exact - rep) / max(1e-300, abs(exact))
                        worst = max(worst, diff)
                        count += 1
                        if diff > 1e-9:
                            bad.append((dp, tp, pp, zero, exact, rep, diff))
                print(f"{name:32s} {topology:15s} {count:4d} meshes x ZeRO, largest relative difference "
                      f"{worst:.1e}; {unalike} built every GPU (replicas unalike), {refused} refused "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
                for dp, tp, pp, zero, exact, rep, diff in bad:
                    print(f"  above 1e-9: dp {dp} tp {tp} pp {pp} zero {zero}: exact {exact:.9f}, "
                          f"representatives {rep:.9f} ({diff:.1e})")
                worst_all = max(worst_all, worst)
    return 1 if worst_all > 1e-9 else 0


if __name__ == "__main__":
    sys.exit(main())
