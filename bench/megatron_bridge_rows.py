"""Megatron-Bridge 25.11 dense rows: triosim against NVIDIA's published Llama 3 / 3.1 throughput.

NVIDIA's Megatron-Bridge performance summary (docs/performance-summary.md of NVIDIA-NeMo/Megatron-Bridge,
section "25.11 NeMo Container") publishes tokens/s/GPU for runs of its performance recipes
(scripts/performance/ on the r0.2.0 branch, the branch the 25.11 container is built from). Each row
below is one of those runs, typed as triosim flags from the summary's columns (GPUs, GBS, MBS, sequence,
FSDP, TP, PP, CP, VP) and from the recipe's remaining settings (docs/validation.md, section
"Megatron-Bridge 25.11 recipes", cites the file and line of each). The published iteration time is
GBS · sequence / (tokens/s/GPU · GPUs). Nothing here is fitted to these rows.

A recipe setting that triosim has no flag for yet is not dropped: the row prints ``needs FLAG`` with
Megatron-LM's name for the setting and is not run, rather than run as a different configuration.
The check reads the flags of ``triosim run``'s own parser, so a row runs as soon as its flag lands.

    python bench/megatron_bridge_rows.py                  # the seven FP8 rows
    python bench/megatron_bridge_rows.py --bf16           # also each row with --dtype bf16 (no published number)
    python bench/megatron_bridge_rows.py --only h100-70b  # one row (keys: --list)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Pending:
    """A recipe setting typed with Megatron-LM's flags, and the triosim flags that run it.

    ``options`` are alternative triosim spellings, each (flags that must exist, arguments to add);
    the first whose flags all exist is used."""

    megatron: tuple[str, ...]
    options: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]


@dataclass(frozen=True)
class Row:
    key: str
    system: str
    label: str
    model: str
    gpu: str
    topology: str
    gpus: int
    gbs: int
    mbs: int
    dp: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vp: int = 1
    tokens_per_s_gpu: float = 0.0  # published, FP8 current scaling
    flags: tuple[str, ...] = ()  # the recipe's settings that are triosim flags today
    pending: tuple[Pending, ...] = ()  # the recipe's settings that wait for a triosim flag
    seq: int = 8192
    userbuffers: str | None = None  # the recipe's TP overlap table: userbuffers/userbuffers_{dtype}_{this}.yaml

    @property
    def published_s(self) -> float:
        return self.gbs * self.seq / (self.tokens_per_s_gpu * self.gpus)


H100 = ("h100-sxm", "topologies/dgx-h100-superpod.yaml")
B200 = ("b200", "topologies/dgx-b200-superpod.yaml")
GB200 = ("gb200", "topologies/gb200-nvl72.yaml")
# Megatron-Core's DDP with the distributed optimizer, as the recipes' DistributedDataParallelConfig, in
# buckets of 128 Mi parameters (CommOverlapConfig with dp > 1): 256 MiB of bf16 gradients
DIST_OPT = ("--zero", "1", "--overlap-grad-reduce", "--overlap-param-gather", "--bucket-mb", "256")
# Megatron FSDP, data_parallel_sharding_strategy optim_grads_params (the summary's FSDP column)
FSDP = ("--zero", "3", "--overlap-grad-reduce", "--overlap-param-gather")
# sequence parallelism with Transformer Engine's userbuffer overlap, sends overlapped (VP > 1)
TP_SP = ("--sequence-parallel", "--tp-comm-overlap", "--pipeline-send", "overlapped")

RECOMPUTE_5_BLOCK = Pending(
    ("--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "5"),
    ((("--recompute-num-layers", "--recompute-method"),
      ("--recompute", "full", "--recompute-method", "block", "--recompute-num-layers", "5")),))
OFFLOAD_40 = Pending(
    ("--cpu-offloading", "--cpu-offloading-num-layers", "40"),
    ((("--cpu-offloading-num-layers",), ("--cpu-offloading-num-layers", "40")),
     (("--offload-activations",), ("--offload-activations", "40"))))
ACCOUNT_FOR = Pending(
    ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"),
    ((("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"),
      ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")),))

ROWS = (
    Row("h100-8b", "DGX-H100", "Llama 3 8B", "llama3-8b", *H100, gpus=8, gbs=128, mbs=1, dp=8,
        tokens_per_s_gpu=14451, flags=FSDP, pending=(RECOMPUTE_5_BLOCK,)),
    Row("h100-70b", "DGX-H100", "Llama 3 70B", "llama3-70b", *H100, gpus=64, gbs=128, mbs=1, dp=2, tp=4, pp=8,
        vp=5, tokens_per_s_gpu=1602, flags=(*TP_SP, *DIST_OPT), userbuffers="h100_h8192_tp4_mbs1_seqlen8192"),
    Row("b200-8b", "DGX-B200", "Llama 3 8B", "llama3-8b", *B200, gpus=8, gbs=128, mbs=2, dp=8,
        tokens_per_s_gpu=30624, flags=DIST_OPT),
    Row("gb200-8b", "DGX-GB200", "Llama 3 8B", "llama3-8b", *GB200, gpus=8, gbs=128, mbs=2, dp=8,
        tokens_per_s_gpu=31508, flags=DIST_OPT),
    Row("gb200-70b", "DGX-GB200", "Llama 3 70B", "llama3-70b", *GB200, gpus=64, gbs=256, mbs=2, dp=64,
        tokens_per_s_gpu=4312, flags=FSDP, pending=(OFFLOAD_40,)),
    Row("h100-405b", "DGX-H100", "Llama 3.1 405B", "llama3-405b", *H100, gpus=1024, gbs=512, mbs=1, dp=8, tp=8,
        pp=8, cp=2, vp=8, tokens_per_s_gpu=292, flags=(*TP_SP, *DIST_OPT), pending=(ACCOUNT_FOR,),
        userbuffers="h100_h16384_tp8_cp2_mbs1_seqlen8192"),
    Row("b200-405b", "DGX-B200", "Llama 3.1 405B", "llama3-405b", *B200, gpus=128, gbs=64, mbs=1, dp=2, tp=4,
        pp=8, cp=2, vp=8, tokens_per_s_gpu=661, flags=(*TP_SP, *DIST_OPT), pending=(ACCOUNT_FOR,),
        userbuffers="b200_h16384_tp4_cp2_mbs1_seqlen8192"),
)

# FP8 current scaling with FP8 parameter all-gather (bf16_with_fp8_current_scaling_mixed, every layer in
# FP8), gradients reduced in bf16 (the recipes set grad_reduce_in_fp32 False)
PRECISION = {
    "fp8": ("--dtype", "fp8", "--fp8-recipe", "current", "--fp8-param-gather", "--grad-reduce-dtype", "bf16"),
    "bf16": ("--dtype", "bf16", "--grad-reduce-dtype", "bf16"),
}


def run_flags() -> set[str]:
    """The option strings of ``triosim run``'s parser (not the Megatron names it translates)."""
    from triosim.cli.console import build_parser

    parser = build_parser(run_only=True)
    run = next(a for a in parser._actions if a.dest == "command").choices["run"]  # noqa: SLF001
    return {s for action in run._actions for s in action.option_strings}  # noqa: SLF001


def command(row: Row, dtype: str, available: set[str]) -> tuple[list[str], list[str]]:
    """The row's triosim command and the flags it still needs (empty when it can run)."""
    cmd = ["triosim", "run", "--model", row.model, "--gpu", row.gpu, "--topology-file", row.topology,
           "--dp", str(row.dp), "--tp", str(row.tp), "--pp", str(row.pp)]
    if row.cp > 1:
        cmd += ["--cp", str(row.cp)]
    if row.vp > 1:
        cmd += ["--schedule", "interleaved", "--virtual-stages", str(row.vp)]
    cmd += ["--global-batch", str(row.gbs), "-micro-batch-size", str(row.mbs), "--seq-len", str(row.seq),
            *PRECISION[dtype], *row.flags]
    needs: list[str] = []
    if row.userbuffers is not None:  # the recipe's per-GEMM TP overlap table (COMM_OVERLAP_CONFIG_MAP)
        table = f"userbuffers/userbuffers_{dtype}_{row.userbuffers}.yaml"
        if "--tp-comm-overlap-cfg" in available:
            cmd += ["--tp-comm-overlap-cfg", table]
        else:
            needs.append(f"--tp-comm-overlap-cfg {table}")
    for pending in row.pending:
        usable = [args for flags, args in pending.options if all(f in available for f in flags)]
        if usable:
            cmd += usable[0]
        else:
            needs.append(" ".join(pending.megatron))
    return cmd, needs


def simulate(cmd: list[str], timeout: int) -> dict:
    return _sibling("megatron_validation").cli_json(cmd, timeout)


def _sibling(name: str):
    """A script of this folder, imported by path (bench/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


BREAKDOWN = (("GEMM", "compute_by_kind", "gemm_ms"), ("FP8 casts", "compute_by_kind", "fp8_casts_ms"),
             ("attention", "compute_by_kind", "attention_ms"), ("other", "compute_by_kind", "other_ms"),
             ("recompute", "mean", "recompute_ms"), ("optimizer", "mean", "optimizer_ms"),
             ("exp. TP", "mean", "exposed_tp_ms"), ("exp. CP", "mean", "exposed_cp_ms"),
             ("exp. PP", "mean", "exposed_pp_ms"), ("exp. DP", "mean", "exposed_dp_ms"),
             ("exp. offload", "mean", "exposed_memory_ms"), ("bubble", "mean", "idle_ms"))


def breakdown_cells(data: dict) -> list[str]:
    """The mean GPU's compute by kind and its exposed communication and idle time, seconds."""
    b = data.get("breakdown") or {}
    return [f"{b.get(part, {}).get(k, 0.0) / 1e3:.3f}" for _, part, k in BREAKDOWN]


def result_row(row: Row, dtype: str, data: dict | None, needs: list[str]) -> tuple[str, float | None]:
    """One line of the results table and the row's |error| in percent (None when not compared)."""
    pub = row.published_s if dtype == "fp8" else None
    pub_s = f"{pub:.3f}" if pub else "—"
    if needs:
        return f"| {row.key} | {dtype} | {pub_s} | needs `{'`; `'.join(needs)}` | — | — | — |", None
    if data is None or "error" in data:
        return f"| {row.key} | {dtype} | {pub_s} | error: {(data or {}).get('error')} | — | — | — |", None
    sim = data["makespan_ms"] / 1e3
    memory = data.get("memory") or {}
    peak = (memory.get("worst") or {}).get("peak_bytes", 0) / 1e9
    err = (sim - pub) / pub * 100 if pub else None
    err_s = f"{err:+.1f} %" if err is not None else "—"
    line = f"| {row.key} | {dtype} | {pub_s} | {sim:.3f} | {err_s} | {peak:.2f} | {'yes' if memory.get('fits') else 'no'} |"
    return line, abs(err) if err is not None else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated row keys")
    ap.add_argument("--bf16", action="store_true", help="also run each row with --dtype bf16 (no published number)")
    ap.add_argument("--list", action="store_true", help="print the rows' keys and commands, run nothing")
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args()
    wanted = set(args.only.split(",")) if args.only else None
    unknown = (wanted or set()) - {r.key for r in ROWS}
    if unknown:
        print(f"--only: no row {', '.join(sorted(unknown))} (rows: {', '.join(r.key for r in ROWS)})",
              file=sys.stderr)
        return 2
    available = run_flags()
    results = []
    for row in ROWS:
        if wanted and row.key not in wanted:
            continue
        for dtype in ("fp8", "bf16") if args.bf16 else ("fp8",):
            cmd, needs = command(row, dtype, available)
            print(f"{row.key} {dtype}: $ " + " ".join(cmd), flush=True)
            if needs:
                print("  -> needs " + "; ".join(needs))
                results.append((row, dtype, None, needs))
                continue
            if args.list:
                continue
            data = simulate(cmd, args.timeout)
            results.append((row, dtype, data, needs))
            print(f"  -> {data['error']}" if "error" in data else
                  f"  -> {data['makespan_ms'] / 1e3:.3f} s, wall {data['wall_s']:.1f} s", flush=True)
    if args.list:
        return 0
    print()
    print("| row | dtype | published s | triosim s | error | peak GB | fits |")
    print("|---|---|---:|---:|---:|---:|---|")
    errors = []
    for row, dtype, data, needs in results:
        line, err = result_row(row, dtype, data, needs)
        print(line)
        if err is not None:
            errors.append(err)
    if errors:
        print(f"\n{len(errors)} published row(s) run: mean |error| {sum(errors) / len(errors):.1f} %, "
              f"worst {max(errors):.1f} %")
    ran = [(row, dtype, data) for row, dtype, data, needs in results if data and "error" not in data]
    if ran:
        print("\nTime per GPU, mean of the GPUs (s): compute by kind, then exposed communication and idle")
        print()
        print("| row | dtype | " + " | ".join(name for name, _, _ in BREAKDOWN) + " |")
        print("|---|---|" + "---:|" * len(BREAKDOWN))
        for row, dtype, data in ran:
            print(f"| {row.key} | {dtype} | " + " | ".join(breakdown_cells(data)) + " |")
        line = gemm_share_line([(row.published_s, data) for row, dtype, data in ran if dtype == "fp8"])
        if line:
            print("\n" + line)
    return 0


def gemm_share_line(runs: list[tuple[float, dict]]) -> str | None:
    """How the published rows' error follows the share of the mean GPU's iteration spent in GEMMs:
    Pearson's r over the (share, signed error) of each (published seconds, result) pair."""
    points = []
    for published, data in runs:
        sim = data["makespan_ms"]
        gemm = ((data.get("breakdown") or {}).get("compute_by_kind") or {}).get("gemm_ms", 0.0)
        points.append((gemm / sim * 100, (sim / 1e3 - published) / published * 100))
    if len(points) < 3:
        return None
    shares, errors = zip(*points)
    r = statistics.correlation(shares, errors)
    return (f"GEMM share of the iteration and error: r = {r:.2f} over {len(points)} rows "
            f"(share {min(shares):.0f}-{max(shares):.0f} %, error {max(errors):+.1f} to {min(errors):+.1f} %)")


if __name__ == "__main__":
    raise SystemExit(main())
