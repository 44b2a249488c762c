"""GEMM efficiency curves for triosim device files from XLA's measured matmul table.

XLA's GPU cost model ships a table of measured matmul throughputs, ``kDefaultMatmulPTable`` in
``xla/service/gpu/model/matmul_interpolator_data.h`` of openxla/xla (mirrored in
tensorflow/tensorflow under ``third_party/xla/``): for each GPU key (``sm_90``: H100;
``sm_100_B200``: B200, named ``sm_100`` before XLA told B200 and GB200 apart) and each
(b, m, n, k) of b in {1, 2, 4} and m, n, k in {256, ..., 4096}, the FLOP/s of one batched dot
per dtype. XLA's generator (``xla/tools/matmul_perf_table_gen.cc``) times each dot as the
median CUPTI kernel time of 5 runs after a warm-up and stores 2·b·m·n·k / time.

    python bench/xla_matmul_curves.py --extract matmul_interpolator_data.h --commit SHA  # -> the JSON
    python bench/xla_matmul_curves.py                  # all curves, from bench/data/xla-matmul-sm90-sm100.json
    python bench/xla_matmul_curves.py --compare        # sm_90 against the h100-sxm file's (H200-measured) curves
    python bench/xla_matmul_curves.py --yaml b200      # the compute block for a device file (b200 or gb200)

Rule (the one bench/device_curves.py applies to its own measurements, see the h200 file's
efficiency.source): each entry is a record with FLOPs = 2·b·m·n·k, kernel time t = FLOPs / the
table's FLOP/s, and ``frac_model`` = FLOPs / (peak · (t − launch floor)), peak and launch floor
from the device file, so that triosim's roofline (FLOPs / (peak · fraction) + launch floor) gives
back the measured kernel time; records with t under 1.5 launch floors are left out. Records are
binned by half-decades of FLOPs; each point is a bin's median FLOPs and median fraction.
Past the last point (about 5e11 FLOPs, the table's largest dot) the device-file loader holds
the curve flat.

GB200: XLA's matmul table has no GB200 entry. Its curves are B200's with each dtype's fractions
scaled by GB200's over B200's Maximum Achievable Matmul FLOPS efficiency (stas00/ml-engineering,
compute/accelerator/README.md), the one published measurement of both parts with the same tool.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from device_curves import bins, model_fractions  # noqa: E402  the H200 measurements' rule

DATA = BENCH / "data" / "xla-matmul-sm90-sm100.json"
H200_DATA = BENCH / "data" / "h200-curves.json"   # bench/device_curves.py on one H200
# XLA's GPU key -> the triosim device file whose peaks and launch floor the fractions use.
DEVICES = {"sm_90": "h100-sxm", "sm_100_B200": "b200"}
KEY_ALIASES = {"sm_100": "sm_100_B200"}   # the key before openxla/xla e97611c4 (2026-02-13)
# XLA's dtype keys -> triosim dtypes. f32 dots run as TF32 on the tensor cores (XLA's default
# precision); the hybrid fp8 pairs (e4m3 x e5m2, the backward GEMMs of FP8 "hybrid" recipes) are
# shown but not used for a curve.
DTYPES = {"bf16xbf16->bf16": "bf16", "f8e4m3fnxf8e4m3fn->bf16": "fp8", "f32xf32->f32": "tf32",
          "f8e4m3fnxf8e5m2->bf16": "fp8-e4m3xe5m2", "f8e5m2xf8e4m3fn->bf16": "fp8-e5m2xe4m3"}
PEAK_DTYPE = {"bf16": "bf16", "fp8": "fp8", "tf32": "tf32", "fp8-e4m3xe5m2": "fp8", "fp8-e5m2xe4m3": "fp8"}
CURVE_DTYPES = ("bf16", "fp8")   # what the device files take from the table

# stas00/ml-engineering, compute/accelerator/README.md at 744d01e18b79512572f64a6bbd8b5f4a725203a7,
# "Maximum Achievable Matmul FLOPS comparison table": MAMF and theoretical TFLOPS (dense).
MAMF = {"b200": {"bf16": (1745.0, 2250.0), "fp8": (3432.5, 4500.0)},
        "gb200": {"bf16": (1822.0, 2500.0), "fp8": (3615.6, 5000.0)}}


def parse_table(text: str) -> list[dict]:
    """The entries of ``kDefaultMatmulPTable`` (a text-format proto): one per GPU and dot, with
    its measured FLOP/s per dtype key."""
    body = text.split("kDefaultMatmulPTable[] = R\"pb(", 1)
    if len(body) != 2:
        raise SystemExit("xla_matmul_curves: no kDefaultMatmulPTable in that file")
    entries = []
    # Top level: entries { key: "sm_90" value { entries { b m n k flops {...}... } ... } }
    for gpu_block in re.split(r'\n  entries \{\n    key: ', body[1])[1:]:
        gpu = gpu_block.split("\n", 1)[0].strip('"')
        for entry in re.split(r"\n      entries \{", gpu_block)[1:]:
            dims = {d: int(re.search(rf"\b{d}: (\d+)", entry).group(1)) for d in "bmnk"}
            flops = {key: int(value) for key, value in re.findall(r'flops \{ key: "([^"]+)" value: (\d+) \}', entry)}
            entries.append({"gpu": gpu, **dims, "flop_per_s": dict(sorted(flops.items()))})
    if not entries:
        raise SystemExit("xla_matmul_curves: kDefaultMatmulPTable has no entries")
    return entries


def extract(header: Path, commit: str, repo: str, path: str, out: Path) -> None:
    entries = parse_table(header.read_text())
    entries.sort(key=lambda e: (e["gpu"], e["b"], e["m"], e["n"], e["k"]))
    meta = {"source": f"{repo}, {path}, kDefaultMatmulPTable", "commit": commit,
            "generator": "xla/tools/matmul_perf_table_gen.cc: median CUPTI kernel time of 5 runs "
                         "after a warm-up; flop_per_s = 2*b*m*n*k / time",
            "script": "bench/xla_matmul_curves.py --extract"}
    lines = ",\n".join(json.dumps(e, separators=(",", ":")) for e in entries)   # one dot a line
    out.write_text(f'{{"meta": {json.dumps(meta, indent=1)},\n"entries": [\n{lines}\n]}}\n')
    gpus = sorted({e["gpu"] for e in entries})
    print(f"{len(entries)} dots ({', '.join(gpus)}) -> {out}")


def device_records(data: dict, gpu: str) -> list[dict]:
    """One record per dot and dtype of one XLA GPU key, with FLOPs and ``frac_model`` against its
    triosim device file."""
    from triosim.hardware.device_db import get_device

    dev = get_device(DEVICES[gpu])
    floor = dev.launch_floor_s
    out = []
    for e in data["entries"]:
        if KEY_ALIASES.get(e["gpu"], e["gpu"]) != gpu:
            continue
        flops = 2.0 * e["b"] * e["m"] * e["n"] * e["k"]
        for key, rate in e["flop_per_s"].items():
            if key not in DTYPES:
                continue
            dtype = DTYPES[key]
            t = flops / rate
            peak = dev.matrix_peak(PEAK_DTYPE[dtype])
            frac = flops / (peak * (t - floor)) if t >= 1.5 * floor else None
            out.append({"gpu": e["gpu"], "b": e["b"], "m": e["m"], "n": e["n"], "k": e["k"], "dtype_key": key,
                        "flop_per_s": rate, "dtype": dtype, "flops": flops, "t_s": t, "frac": flops / (peak * t),
                        "frac_model": frac})
    return out


def curve(records: list[dict], dtype: str) -> list[tuple[float, float, int, float, float]]:
    return bins([r for r in records if r["dtype"] == dtype], "flops")


def points_yaml(points, indent: int, scale: float = 1.0, note: str = "") -> str:
    pad = " " * indent
    return "".join(f"{pad}- [{x:.3e}, {f * scale:.3f}]   # {n} measured{note}, {lo * scale:.2f}-{hi * scale:.2f}\n"
                   for x, f, n, lo, hi in points)


def mamf_ratio(dtype: str) -> float:
    """GB200's MAMF efficiency over B200's (each MAMF / its own dense peak)."""
    (g, gp), (b, bp) = MAMF["gb200"][dtype], MAMF["b200"][dtype]
    return (g / gp) / (b / bp)


def device_yaml(data: dict, name: str) -> str:
    recs = device_records(data, "sm_100_B200")
    bf16, fp8 = curve(recs, "bf16"), curve(recs, "fp8")
    if name == "b200":
        heads = ("bf16 GEMMs, XLA sm_100 table (comments: count, range in the bin)",
                 "f8e4m3fn x f8e4m3fn -> bf16 GEMMs, XLA sm_100 table")
        scale, note = {d: 1.0 for d in CURVE_DTYPES}, ""
    else:
        scale, note = {d: mamf_ratio(d) for d in CURVE_DTYPES}, " on B200"
        heads = (f"bf16: the b200 points x {scale['bf16']:.4f}, MAMF GB200/B200 (comments: B200 count, range)",
                 f"fp8: the b200 points x {scale['fp8']:.4f}, MAMF GB200/B200")
    return (f"  compute:   # {heads[0]}\n" + points_yaml(bf16, 4, scale["bf16"], note)
            + f"  compute_by_dtype:\n    fp8:   # {heads[1]}\n" + points_yaml(fp8, 6, scale["fp8"], note))


def print_curves(data: dict) -> None:
    print(f"# {data['meta']['source']} @ {data['meta']['commit']}")
    for gpu, dev in DEVICES.items():
        recs = device_records(data, gpu)
        for dtype in DTYPES.values():
            pts = curve(recs, dtype)
            if pts:
                print(f"\n{gpu} ({dev} peaks) {dtype}: median frac_model per half-decade of FLOPs")
                for x, f, n, lo, hi in pts:
                    print(f"  {x:.3e}  {f:.3f}   ({n}, {lo:.2f}-{hi:.2f})")
    print("\nMAMF efficiency ratio GB200/B200: "
          + ", ".join(f"{d} {mamf_ratio(d):.4f}" for d in CURVE_DTYPES))


def compare(data: dict) -> None:
    """sm_90 (H100, XLA) against the h100-sxm file's curves, which were measured on an H200."""
    from triosim.hardware.device_db import get_device

    dev = get_device("h100-sxm")
    recs = device_records(data, "sm_90")
    for dtype in CURVE_DTYPES:
        pts = curve(recs, dtype)
        file_curve = dev.compute_curve(dtype)
        print(f"{dtype}: XLA sm_90 table against the h100-sxm file's {dtype} curve (H200-measured)")
        print("| FLOPs | XLA sm_90 median | records | range | h100-sxm file | XLA - file |")
        print("|---:|---:|---:|---|---:|---:|")
        diffs = []
        for x, f, n, lo, hi in pts:
            ref = file_curve.at(x)
            diffs.append(f - ref)
            print(f"| {x:.2e} | {f:.3f} | {n} | {lo:.2f}-{hi:.2f} | {ref:.3f} | {f - ref:+.3f} |")
        above = [d for (x, *_), d in zip(pts, diffs) if x >= 1e10]
        print(f"mean difference from 1e10 FLOPs: {sum(above) / len(above):+.3f}; "
              f"largest: {max(diffs, key=abs):+.3f}\n")
    same_shapes(recs)
    fp8_sanity(data)


def fp8_sanity(data: dict) -> None:
    """fp8 against the dense peak and against bf16 at the same shape (at most 2x at equal efficiency)."""
    for gpu in DEVICES:
        recs = device_records(data, gpu)
        over = [r["flops"] for r in recs if r["dtype"] == "fp8" and (r["frac_model"] or 0) > 1]
        rate = {}
        for r in recs:
            if r["dtype"] in ("bf16", "fp8") and r["flops"] >= 1e11:
                rate.setdefault((r["b"], r["m"], r["n"], r["k"]), {})[r["dtype"]] = r["flop_per_s"]
        ratios = [v["fp8"] / v["bf16"] for v in rate.values()]
        above = f"{len(over)} dots, from {min(over):.2e} FLOPs" if over else "none"
        print(f"{gpu} fp8: above the dense fp8 peak: {above}; fp8/bf16 rate on the {len(ratios)} dots "
              f"from 1e11 FLOPs: {min(ratios):.2f}-{max(ratios):.2f}")


def same_shapes(recs: list[dict]) -> None:
    """The square GEMMs both runs timed: XLA's sm_90 b=1 n×n×n dots and the H200 run's
    torch.matmul (bf16) and torch._scaled_mm (fp8) squares, each as its fraction by the same rule."""
    h200 = model_fractions(json.loads(H200_DATA.read_text()))["records"]
    print("Same shapes: XLA sm_90 (H100) against bench/data/h200-curves.json (H200, torch), squares n x n x n")
    print("| n | FLOPs | XLA bf16 | H200 bf16 | XLA fp8 | H200 fp8 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sorted({r["m"] for r in recs}):
        xla = {r["dtype"]: r["frac_model"] for r in recs if r["b"] == 1 and r["m"] == r["n"] == r["k"] == n}
        ours = {}
        for r in h200:
            if r["suite"] == "gemm_square" and r["op"] in ("matmul", "scaled_mm") and r["shape"] == [n, n, n]:
                ours.setdefault(r["dtype"], r["frac_model"])   # the first of repeated shapes
        cells = [xla.get("bf16"), ours.get("bf16"), xla.get("fp8"), ours.get("fp8")]
        print(f"| {n} | {2.0 * n ** 3:.2e} | " + " | ".join("—" if c is None else f"{c:.3f}" for c in cells) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the extracted records (JSON)")
    ap.add_argument("--extract", type=Path, metavar="HEADER", help="parse matmul_interpolator_data.h into --data")
    ap.add_argument("--commit", default="", help="with --extract: the source commit")
    ap.add_argument("--repo", default="openxla/xla", help="with --extract: the source repository")
    ap.add_argument("--path", default="xla/service/gpu/model/matmul_interpolator_data.h",
                    help="with --extract: the file's path in that repository")
    ap.add_argument("--compare", action="store_true", help="sm_90 against the h100-sxm file's curves")
    ap.add_argument("--yaml", choices=("b200", "gb200"), help="the compute block for that device file")
    args = ap.parse_args()
    if args.extract:
        if not re.fullmatch(r"[0-9a-f]{40}", args.commit):
            raise SystemExit("xla_matmul_curves: --extract needs --commit, the 40-digit source commit")
        extract(args.extract, args.commit, args.repo, args.path, args.data)
        return 0
    data = json.loads(args.data.read_text())
    if args.yaml:
        print(device_yaml(data, args.yaml), end="")
    elif args.compare:
        compare(data)
    else:
        print_curves(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
