"""``triosim gpus``: the device database as a table (or ``--json``), and a user's device file
checked and shown (``--gpu-file FILE``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from ..hardware.device_db import Device, read_device_file, shipped_devices

MATRIX_COLUMNS = ("bf16", "fp16", "fp8", "tf32", "fp32")


def register(sub: Any) -> None:
    p = sub.add_parser("gpus", help="list the GPUs --gpu knows (the device database), or check a device file")
    p.add_argument("--gpu-file", metavar="FILE.yaml", default=None,
                   help="check and show your own device file (the schema of docs/gpus.md) instead")
    p.add_argument("--json", action="store_true", help="print the devices as JSON")
    p.set_defaults(func=cmd_gpus)
    p.absent_flags = {"--gpu": "`triosim gpus` takes no --gpu: it lists every GPU with its peaks, memory and aliases "
                               "(`triosim gpus --json`: every number and its source); --gpu NAME is a flag of run, "
                               "dag, sweep and plan"}


def device_record(d: Device) -> dict[str, Any]:
    """One device, JSON-ready: peaks in TFLOPS, HBM in GB/s, memory in GB, floor in µs."""
    return {
        "name": d.name,
        "display_name": d.display_name,
        "aliases": list(d.aliases),
        "matrix_tflops": {k: round(v / 1e12, 4) for k, v in d.matrix_flops.items()},
        "vector_tflops": {k: round(v / 1e12, 4) for k, v in d.vector_flops.items()},
        "hbm_gbps": round(d.hbm_bytes_per_s / 1e9, 4),
        "memory_gb": round(d.memory_bytes / 1e9, 4),
        "launch_floor_us": round(d.launch_floor_s * 1e6, 4),
        "processing_mode": d.processing_mode,
        "sources": dict(d.sources),
        "file": d.path,
    }


def _tf(d: Device, dtype: str) -> str:
    v = d.matrix_flops.get(dtype)
    return "—" if v is None else f"{v / 1e12:,.1f}"


def device_table(devices: list[Device], title: str) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False,
                  caption="dense peaks (no 2:4 sparsity), TFLOPS; — : no such matrix mode. "
                          "Every number's public source is in the device file (--json shows them).",
                  caption_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("aliases", no_wrap=True)
    for dtype in MATRIX_COLUMNS:
        table.add_column(dtype, justify="right")
    for col in ("vec fp32", "HBM GB/s", "mem GB", "floor µs"):
        table.add_column(col, justify="right")
    for d in devices:
        table.add_row(d.name, ", ".join(d.aliases), *(_tf(d, t) for t in MATRIX_COLUMNS),
                      f"{d.vector_flops['fp32'] / 1e12:,.1f}", f"{d.hbm_bytes_per_s / 1e9:,.0f}",
                      f"{d.memory_bytes / 1e9:,.0f}", f"{d.launch_floor_s * 1e6:g}")
    return table


def cmd_gpus(args: argparse.Namespace) -> int:
    if args.gpu_file is not None:
        devices = [read_device_file(args.gpu_file)]
        title = f"{args.gpu_file}: a valid device file"
    else:
        devices = sorted(shipped_devices().values(), key=lambda d: d.name)
        title = f"{len(devices)} GPUs (--gpu NAME; names and aliases are case-insensitive)"
    if args.json:
        sys.stdout.write(json.dumps([device_record(d) for d in devices], indent=2) + "\n")
        return 0
    console = Console(highlight=False)
    if not console.is_terminal:  # a pipe or file: room for every column
        console = Console(highlight=False, width=max(console.width, 132))
    console.print(device_table(devices, title))
    return 0
