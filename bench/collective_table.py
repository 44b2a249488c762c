"""Print what ``--collective-algo auto`` picks per message size (like NCCL's tuning table),
and the closed-form all-reduce time of every algorithm, for a few group sizes and topologies.

    python bench/collective_table.py                # 8 and 64 GPUs, nvlink-cluster and others
    python bench/collective_table.py --plot docs/allreduce_vs_size.png
    python bench/collective_table.py --auto-table   # auto's pick per size, markdown (docs)
    python bench/collective_table.py --auto-table --protocol auto   # protocol picked too
    python bench/collective_table.py --nvls-table   # NVLS against the ring on SHARP switches
"""

from __future__ import annotations

import argparse

from triosim import build_platform
from triosim.graph.collectives.cost import collective_cost

SIZES = [2**k for k in range(10, 33, 2)]  # 1 KiB … 4 GiB
ALGOS = ("one-way-ring", "ring", "tree", "hierarchical", "direct", "nvls")


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n //= 1024
    return f"{n} TiB"


def platforms():
    """(label, platform): H100-like clusters (8 GPUs per node, NVLink 450 GB/s per direction,
    one 400 Gb/s NIC per GPU), NCCL latencies."""
    for n in (8, 64):
        yield f"nvlink-cluster {n} GPUs", build_platform(
            n, topology="nvlink-cluster", ptp_bandwidth_gbps=450, node_bandwidth_gbps=50,
            network="flow", collective_algo="auto", collective_latency_us=None)
        yield f"switch {n} GPUs", build_platform(
            n, topology="switch", ptp_bandwidth_gbps=450, network="flow", collective_algo="auto",
            collective_latency_us=None)
    yield "dgx-h100-superpod 8 GPUs (NVLink SHARP)", build_platform(
        8, topology_file="dgx-h100-superpod", network="flow", collective_algo="auto", collective_latency_us=None)
    yield "ring 8 GPUs", build_platform(8, ptp_bandwidth_gbps=65, collective_latency_us=None)
    yield "fully-connected 8 GPUs", build_platform(8, topology="fully-connected", collective_latency_us=None)


def table() -> None:
    for label, p in platforms():
        group = range(p.num_gpus)
        print(f"\n{label}: all-reduce, time in µs per algorithm (* = auto's choice)")
        print(f"{'size':>9} | " + " | ".join(f"{a:>13}" for a in ALGOS) + " | auto")
        for size in SIZES:
            choice = collective_cost(p, group, "all_reduce", size).algo
            cells = []
            for a in ALGOS:
                c = collective_cost(p, group, "all_reduce", size, a)
                mark = "*" if c.algo == choice and a == choice else " "
                cells.append(f"{c.seconds * 1e6:12.1f}{mark}" if c.algo == a else f"{'(' + c.algo + ')':>13}")
            print(f"{human(size):>9} | " + " | ".join(cells) + f" | {choice}")


AUTO_SIZES = [2**k for k in (10, 14, 17, 20, 22, 24, 26, 28, 30)]  # 1 KiB … 1 GiB


def auto_table(protocol: str = "simple") -> None:
    """Markdown: auto's algorithm and time per all-reduce size on the DGX SuperPOD file (8 GPUs =
    one node, 64 GPUs = 8 nodes) and on 8 fully connected GPUs at 65 GB/s (NCCL latencies), under
    ``protocol`` (``auto``: the protocol is picked too and shown after the algorithm)."""
    setups = [build_platform(8, topology_file="dgx-h100-superpod", collective_latency_us=None),
              build_platform(64, topology_file="dgx-h100-superpod", collective_latency_us=None),
              build_platform(8, topology="fully-connected", collective_latency_us=None)]
    setups = [p.with_network(collective_protocol=protocol) for p in setups]
    print("| size | 8 GPUs, 1 node: auto | µs | 64 GPUs, 8 nodes: auto | µs | fully-connected 8 (65 GB/s): auto | µs |")
    print("|---|---|---|---|---|---|---|")
    for size in AUTO_SIZES:
        cells = []
        for p in setups:
            c = collective_cost(p, range(p.num_gpus), "all_reduce", size)
            cells += [c.algo if protocol == "simple" else f"{c.algo}/{c.protocol}", f"{c.seconds * 1e6:.1f}"]
        print(f"| {human(size)} | " + " | ".join(cells) + " |")


NVLS_SYSTEMS = (("dgx-h100-superpod", 8), ("dgx-b200-superpod", 8), ("gb200-nvl72", 72))
NVLS_SIZES = (2**20, 2**30)  # 1 MiB, 1 GiB


def nvls_table() -> None:
    """Markdown: NVLS against the ring inside one NVLink domain of each shipped file whose switch
    offers SHARP (8 GPUs of a DGX H100 or B200 node, the 72 of a GB200 NVL72 rack), per
    operation and size: both times, NVLS's algbw and nccl-tests' busbw, and auto's pick (Simple,
    NCCL latencies)."""
    print("| system | GPUs | operation | size | ring µs | nvls µs | nvls algbw GB/s | nvls busbw GB/s | auto |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, n in NVLS_SYSTEMS:
        p = build_platform(n, topology_file=name, collective_latency_us=None)
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            for size in NVLS_SIZES:
                ring = collective_cost(p, range(n), op, size, "ring")
                nvls = collective_cost(p, range(n), op, size, "nvls")
                auto = collective_cost(p, range(n), op, size).algo
                print(f"| {name} | {n} | {op.replace('_', '-')} | {human(size)} | {ring.seconds * 1e6:.1f} | "
                      f"{nvls.seconds * 1e6:.1f} | {nvls.algbw / 1e9:.0f} | {nvls.busbw / 1e9:.0f} | {auto} |")


def plot(path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, n in zip(axes, (8, 64)):
        p = build_platform(n, topology="nvlink-cluster", ptp_bandwidth_gbps=450, node_bandwidth_gbps=50,
                           collective_latency_us=None)
        for a in ALGOS:
            ys = [collective_cost(p, range(n), "all_reduce", s, a) for s in SIZES]
            if all(c.algo == a for c in ys):
                ax.plot(SIZES, [c.seconds * 1e6 for c in ys], marker="o", ms=3, label=a)
        auto = [collective_cost(p, range(n), "all_reduce", s).seconds * 1e6 for s in SIZES]
        ax.plot(SIZES, auto, "k--", lw=1, label="auto")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("all-reduce time (µs)")
        ax.set_title(f"{n} GPUs, nvlink-cluster (8/node, 450 GB/s NVLink, 50 GB/s NIC)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plot", metavar="PNG", help="also write the all-reduce time vs size plot")
    ap.add_argument("--auto-table", action="store_true", help="print only auto's pick per size (markdown)")
    ap.add_argument("--nvls-table", action="store_true",
                    help="print only NVLS against the ring on the shipped SHARP switches (markdown)")
    ap.add_argument("--protocol", default="simple", choices=("simple", "ll", "ll128", "auto"),
                    help="the collectives' protocol for --auto-table (default simple)")
    args = ap.parse_args()
    if args.auto_table:
        auto_table(args.protocol)
        return
    if args.nvls_table:
        nvls_table()
        return
    table()
    if args.plot:
        plot(args.plot)


if __name__ == "__main__":
    main()
