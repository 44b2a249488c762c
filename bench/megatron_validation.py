"""triosim against published Megatron-LM iteration times (DGX A100 80 GB, Selene).

    python bench/megatron_validation.py                  # every model, full and selective+SP
    python bench/megatron_validation.py --models megatron-22b,gpt3-175b --modes full,seqsel,none

Published: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Table 5 (sequence 2048, vocabulary 51,200, fp16, no data parallelism). The rows are typed
with the settings those runs used: Megatron-LM of 2022 (megatron/p2p_communication.py at commit
55ba1f7b96, May 2022) posted each send with its receive in one ``batch_isend_irecv``, waited on
both and called ``torch.cuda.synchronize()``, so ``--pipeline-send blocking``; without sequence
parallelism each TP rank sent 1/8 of the tensor and the receivers all-gathered it (its default
``scatter_gather_tensors_in_pipeline``, so ``--pipeline-scatter-gather``); its default
``--DDP-impl local`` reduced gradients after the backward (no overlap, triosim's default; there is
no data parallelism here anyway), and it had no TP communication overlap. Its gradients were
accumulated in fp16: the scripts of that commit (``examples/pretrain_gpt3_175B.sh``,
``examples/sc21/CONFIG.sh``) type ``--fp16`` without ``--accumulate-allreduce-grads-in-fp32``, so
the local DDP's gradient buffer had the parameters' dtype (``megatron/model/distributed.py``,
``_get_buffer_type``), triosim's default under ``--dtype fp16``: no ``--grad-reduce-dtype`` is
typed (fp16 gradients and the optimizer step's fp32 copy of them). Each row runs
``triosim run --model M --gpu a100-80gb --topology-file topologies/dgx-a100-superpod.yaml ...`` as
a user would type it (the command is printed) and reads its JSON: the iteration time, the mean
GPU's time breakdown and the first stage's memory.

Beside triosim: Calculon (Isaev et al., SC'23) and llm-analysis (PyPI 0.2.2), neither a
dependency. Calculon's column is its own ``llm-validation`` output (commit of calculon-ai/calculon
at the time of writing, its ``systems/a100_80g.json``); llm-analysis's is ``LLMAnalysis.training``
with ``a100-sxm-80gb``, ``w16a16e16``, ``flops_efficiency=0.5``, ``flash_attn=False``, sequence
parallel = tp for the selective rows (the numbers printed by ``--llm-analysis`` when it is
importable; recorded here otherwise).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = REPO / "topologies" / "dgx-a100-superpod.yaml"


@dataclass(frozen=True)
class Config:
    model: str
    tp: int
    pp: int
    global_batch: int
    micro_batch: int
    virtual_stages: int


CONFIGS = (
    Config("megatron-22b", 8, 1, 4, 4, 1),
    Config("gpt3-175b", 8, 8, 64, 1, 3),
    Config("turing-530b", 8, 35, 280, 1, 3),
    Config("megatron-1t", 8, 64, 512, 1, 1),
)
# seconds per iteration: Korthikanti et al. 2022, Table 5
PUBLISHED = {
    ("megatron-22b", "full"): 1.42, ("megatron-22b", "seqsel"): 1.10,
    ("gpt3-175b", "full"): 18.13, ("gpt3-175b", "seqsel"): 13.75,
    ("turing-530b", "full"): 49.05, ("turing-530b", "seqsel"): 37.83,
    ("megatron-1t", "full"): 94.42, ("megatron-1t", "seqsel"): 71.49,
}
# Calculon's llm-validation (seqsel_tab5), run on its repository's HEAD
CALCULON = {
    ("megatron-22b", "full"): 1.40, ("megatron-22b", "seqsel"): 1.14,
    ("gpt3-175b", "full"): 18.03, ("gpt3-175b", "seqsel"): 13.64,
    ("turing-530b", "full"): 49.89, ("turing-530b", "seqsel"): 34.47,
    ("megatron-1t", "full"): 90.08, ("megatron-1t", "seqsel"): 66.04,
}
# llm-analysis 0.2.2, settings in the module docstring
LLM_ANALYSIS = {
    ("megatron-22b", "full"): 1.222, ("megatron-22b", "seqsel"): 0.932, ("megatron-22b", "none"): 0.916,
    ("gpt3-175b", "full"): 18.842, ("gpt3-175b", "seqsel"): 14.259, ("gpt3-175b", "none"): 14.132,
    ("turing-530b", "full"): 56.539, ("turing-530b", "seqsel"): 42.636, ("turing-530b", "none"): 42.405,
    ("megatron-1t", "full"): 107.27, ("megatron-1t", "seqsel"): 80.805, ("megatron-1t", "none"): 80.452,
}
MODES = {"full": ("--recompute", "full"), "seqsel": ("--recompute", "selective", "--sequence-parallel"),
         "none": ("--recompute", "none")}


def command(cfg: Config, mode: str) -> list[str]:
    cmd = ["triosim", "run", "--model", cfg.model, "--gpu", "a100-80gb", "--topology-file",
           str(TOPOLOGY.relative_to(REPO)), "--tp", str(cfg.tp), "--pp", str(cfg.pp)]
    if cfg.virtual_stages > 1:
        cmd += ["--schedule", "interleaved", "--virtual-stages", str(cfg.virtual_stages)]
    elif cfg.pp > 1:
        cmd += ["--schedule", "1f1b"]
    if cfg.pp > 1:
        cmd += ["--pipeline-send", "blocking", "--pipeline-scatter-gather"]
    cmd += ["--global-batch", str(cfg.global_batch), "-micro-batch-size", str(cfg.micro_batch),
            *MODES[mode], "--dtype", "fp16", "-q"]
    return cmd


def cli_json(cmd: list[str], timeout: int) -> dict:
    """``cmd`` (a ``triosim ...`` command line) run in a subprocess; its JSON result with the run's
    wall seconds, or its last error line."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        argv = [sys.executable, "-m", "triosim.cli", *cmd[1:], "--json", str(out)]
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1], "wall_s": wall}
        data = json.loads(out.read_text())
        data["wall_s"] = wall
        return data


def run(cfg: Config, mode: str, timeout: int) -> dict:
    return cli_json(command(cfg, mode), timeout)


def llm_analysis_seconds(cfg: Config, mode: str) -> float | None:
    """llm-analysis's iteration time, computed when the package is importable."""
    try:
        from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
        from llm_analysis.config import (
            ModelConfig,
            ParallelismConfig,
            get_dtype_config_by_name,
            get_gpu_config_by_name,
        )
    except ImportError:
        return None
    import logging

    logging.disable(logging.INFO)
    shapes = {"megatron-22b": (48, 6144, 64), "gpt3-175b": (96, 12288, 96), "turing-530b": (105, 20480, 128),
              "megatron-1t": (128, 25600, 160)}
    layers, hidden, heads = shapes[cfg.model]
    model = ModelConfig(name=cfg.model, num_layers=layers, n_head=heads, hidden_dim=hidden, vocab_size=51200,
                        max_seq_len=2048, ffn_embed_dim=4 * hidden)
    analysis = LLMAnalysis(model, get_gpu_config_by_name("a100-sxm-80gb"), get_dtype_config_by_name("w16a16e16"),
                           ParallelismConfig(tp_size=cfg.tp, pp_size=cfg.pp, dp_size=1,
                                             sp_size=cfg.tp if mode == "seqsel" else 1), flops_efficiency=0.5)
    recompute = {"none": 0, "seqsel": 1, "full": 2}[mode]
    out = analysis.training(batch_size_per_gpu=cfg.micro_batch, global_batch_size=cfg.global_batch, seq_len=2048,
                            activation_recomputation=ActivationRecomputation(recompute), ds_zero=DSZeRO(0),
                            flash_attn=False)
    return float(out["latency_per_iter"])


def f(v: float | None) -> str:
    return f"{v:9.2f}" if v is not None else f"{'—':>9}"


def pct(x: float | None, ref: float | None) -> str:
    return f"{(x - ref) / ref * 100:+.1f}%" if x is not None and ref else "—"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(c.model for c in CONFIGS))
    ap.add_argument("--modes", default="full,seqsel")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--llm-analysis", action="store_true", help="recompute llm-analysis's column")
    args = ap.parse_args()
    wanted = args.models.split(",")
    rows = []
    for cfg in CONFIGS:
        if cfg.model not in wanted:
            continue
        for mode in args.modes.split(","):
            print("$ " + " ".join(command(cfg, mode)), flush=True)
            data = run(cfg, mode, args.timeout)
            key = (cfg.model, mode)
            sim = data.get("makespan_ms", 0) / 1e3 if "makespan_ms" in data else None
            lla = llm_analysis_seconds(cfg, mode) if args.llm_analysis else LLM_ANALYSIS.get(key)
            pub = PUBLISHED.get(key)
            rows.append((cfg.model, mode, pub, sim, CALCULON.get(key), lla, data))
            mean = (data.get("breakdown") or {}).get("mean", {})
            parts = " ".join(f"{k[:-3]}={v / 1e3:.3f}s" for k, v in mean.items() if v > 0)
            print(f"  -> {sim if sim is None else round(sim, 3)} s (published {pub}, error {pct(sim, pub)}), "
                  f"wall {data['wall_s']:.1f} s" + (f"; {data['error']}" if "error" in data else ""), flush=True)
            if parts:
                print(f"     breakdown (mean GPU): {parts}")
            memory = (data.get("hybrid") or {}).get("memory") or []
            if memory:
                m = memory[0]
                print("     stage 0 memory (GiB): " + ", ".join(
                    f"{k[:-6]} {m[k] / 2**30:.2f}" for k in ("weights_bytes", "gradients_bytes", "optimizer_bytes",
                                                             "activations_peak_bytes", "peak_bytes") if k in m))
    print()
    print(f"{'model':14} {'mode':7} {'published':>9} {'triosim':>9} {'error':>7} {'Calculon':>9} {'error':>7} "
          f"{'llm-an.':>9} {'error':>7}")
    errs = []
    for model, mode, pub, sim, calc, lla, _ in rows:
        print(f"{model:14} {mode:7} {f(pub)} {f(sim)} {pct(sim, pub):>7} {f(calc)} {pct(calc, pub):>7} "
              f"{f(lla)} {pct(lla, pub):>7}")
        if pub and sim:
            errs.append(abs(sim - pub) / pub * 100)
    if errs:
        print(f"triosim: mean |error| {sum(errs) / len(errs):.2f}%, worst {max(errs):.2f}% over {len(errs)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
