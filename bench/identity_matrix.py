"""Identity matrix: a fixed list of `triosim` commands whose outputs must not change.

    python bench/identity_matrix.py --record DIR  [--triosim PATH]   # run and store the baseline
    python bench/identity_matrix.py --compare DIR [--triosim PATH]   # run again and compare
    python bench/identity_matrix.py --list                           # the commands, in order

Each command runs as a subprocess of the given ``triosim`` executable (default: ``triosim`` on
PATH), in the repository root, so that ``sample_trace/…`` and ``../shared/reference/…`` resolve
there. Its outputs go to ``DIR/<name>.*``: ``.json`` (``run --json``), ``.timeline.json``
(``run --timeline``), ``.dot`` (``dag --export``), ``.csv`` (``sweep --out``), ``.trace/``
(``trace repeat --out``), and ``.cmd.json`` (argv, exit code, stdout of ``-q`` runs, wall
seconds and stderr for information only). ``DIR/manifest.json`` lists the commands.

Compare mode runs every command again into a scratch directory (``--keep DIR2`` keeps it) and
prints one line per command:

- ``same``: every output identical. A JSON result is compared on its canonical form (parsed,
  ``config.triosim_version`` deleted, ``config.trace-dir`` reduced to its last component since
  the directory's absolute path depends on where the repository or package lives while its
  content is pinned by ``config.trace_sha256``/``tensor_sha256``, keys sorted); the line says
  when the raw bytes differ, and whether only by the version field.
- ``counts-only``: a ``-case`` run whose only differences are the task/edge counts (JSON
  ``tasks``, ``edges``; sweep CSV column ``tasks``) while makespan, per_gpu and per_link are
  identical. The refactor may change those counts for ``-case`` runs, nothing else.
- ``DIFF``: anything else, with the first differing keys and values; for a JSON result it says
  whether makespan, per_gpu and per_link are identical nonetheless.

The exit status is 1 when any command is ``DIFF`` (or missing from the baseline), else 0. The
last line is ``N commands: S same, C counts-only, D different``. Commands on the original
TrioSim's H100 reference traces (``<repo>/../shared/reference/sample_trace/trace2-h100-bs128``)
are skipped, with a note, where that directory is absent.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REF_REL = "../shared/reference/sample_trace/trace2-h100-bs128"
REF = (REPO / REF_REL).resolve()
VERSION_KEY = "triosim_version"  # lives in the result's ``config`` block
PATH_KEYS = ("trace-dir",)  # config keys holding an absolute path (content pinned by sha256)
COUNT_KEYS = frozenset({"tasks", "edges"})  # top-level JSON keys / sweep CSV columns
CORE_KEYS = ("makespan_ms", "per_gpu", "per_link")
TIMEOUT_S = 300

GPT = "sample_trace/gpt-cpu-bs8"  # GPT decoder, 4 layers, 4 heads, batch 8
GPT16 = "sample_trace/gpt-h16-cpu-bs8"  # GPT decoder, 2 layers, 16 heads, batch 8
R18 = "sample_trace/resnet18-cpu-bs16"  # the embedded default, given by path
VGG = f"{REF_REL}/vgg13"  # batch 128
R50 = f"{REF_REL}/resnet50"  # batch 128


@dataclass
class Cmd:
    """One command of the matrix: ``triosim <argv>`` plus its output flag(s)."""

    name: str
    argv: list[str]
    kind: str = "run"  # run | dag | sweep | repeat
    timeline: bool = False
    reference: bool = False  # needs the H100 reference traces
    case_run: bool = field(init=False)

    def __post_init__(self) -> None:
        self.reference = self.reference or any(REF_REL in a for a in self.argv)
        hybrid = any(a in ("--dp", "--tp", "--pp") for a in self.argv)
        self.case_run = self.kind in ("run", "dag", "sweep") and not hybrid and (
            "-case" in self.argv or "--case" in self.argv)

    @property
    def quiet(self) -> bool:
        return "-q" in self.argv or "--quiet" in self.argv

    def full_argv(self, out: Path) -> list[str]:
        """The command line after the executable, writing into directory ``out``."""
        stem = out / self.name
        if self.kind == "run":
            extra = ["--json", f"{stem}.json"]
            if self.timeline:
                extra += ["--timeline", f"{stem}.timeline.json"]
            return ["run", *self.argv, *extra]
        if self.kind == "dag":
            return ["dag", *self.argv, "--export", f"{stem}.dot"]
        if self.kind == "sweep":
            return ["sweep", *self.argv, "--out", f"{stem}.csv"]
        if self.kind == "repeat":
            return ["trace", "repeat", *self.argv, "--out", f"{stem}.trace"]
        raise ValueError(self.kind)

    def outputs(self) -> list[str]:
        """Output file (or directory) names relative to the output directory."""
        return {"run": [f"{self.name}.json"] + ([f"{self.name}.timeline.json"] if self.timeline else []),
                "dag": [f"{self.name}.dot"], "sweep": [f"{self.name}.csv"],
                "repeat": [f"{self.name}.trace"]}[self.kind]


def matrix() -> list[Cmd]:
    """The fixed, ordered list of commands (names are unique and stable)."""
    cmds: list[Cmd] = []
    add = cmds.append
    # Cases 0-4, with and without --reference-compat, on every trace (8 GPUs by default; the
    # 4-layer GPT and 2-layer GPT-h16 take 4 and 2 pipeline stages at most).
    traces = [("default", None, "4"), ("gpt", GPT, "4"), ("gpth16", GPT16, "2"), ("r18", R18, "4"),
              ("vgg13", VGG, "4"), ("r50", R50, "4")]
    for short, path, pp_gpus in traces:
        tdir = [] if path is None else ["-trace-dir", path]
        for case in range(5):
            gpus = ["-GPUnumber", pp_gpus] if case == 4 else []
            for compat in (False, True):
                name = f"case{case}-{short}" + ("-compat" if compat else "")
                add(Cmd(name, [*tdir, "-case", str(case), *gpus, *(["--reference-compat"] if compat else []), "-q"]))
    # Case 4: schedules, micro-batch sizes, partitions.
    for sched, mb, part in (("gpipe", "32", None), ("1f1b", "32", None), ("1f1b", "16", None),
                            ("1f1b", "32", "count"), ("gpipe", "64", "count"), ("1f1b", "8", "time")):
        pa = ["--partition", part] if part else []
        add(Cmd(f"pipe-vgg13-{sched}-mb{mb}" + (f"-{part}" if part else ""),
                ["-trace-dir", VGG, "-case", "4", "-GPUnumber", "4", "-micro-batch-size", mb,
                 "--schedule", sched, *pa, "-q"], timeline=(sched, mb, part) == ("1f1b", "32", None)))
    # (--reference-compat replays the original's pipeline: GPipe only)
    add(Cmd("pipe-vgg13-gpipe-mb32-compat", ["-trace-dir", VGG, "-case", "4", "-GPUnumber", "4",
                                              "-micro-batch-size", "32", "--reference-compat", "-q"]))
    add(Cmd("pipe-r50-1f1b-mb8", ["-trace-dir", R50, "-case", "4", "-GPUnumber", "8",
                                  "-micro-batch-size", "8", "--schedule", "1f1b", "-q"]))
    add(Cmd("pipe-gpt-1f1b-mb2", ["-trace-dir", GPT, "-case", "4", "-GPUnumber", "4",
                                  "-micro-batch-size", "2", "--schedule", "1f1b", "-q"]))
    add(Cmd("pipe-gpt-gpipe-mb1-count", ["-trace-dir", GPT, "-case", "4", "-GPUnumber", "2",
                                         "-micro-batch-size", "1", "--schedule", "gpipe", "--partition", "count", "-q"]))
    add(Cmd("pipe-r18-1f1b-mb4", ["-trace-dir", R18, "-case", "4", "-GPUnumber", "4",
                                  "-micro-batch-size", "4", "--schedule", "1f1b"]))  # full summary path
    # Hybrid meshes on the GPT sample.
    mesh = ["-trace-dir", GPT, "--dp", "2", "--tp", "2", "--pp", "2", "-micro-batch-size", "2", "--schedule", "1f1b"]
    for zero in ("0", "1", "2", "3"):
        add(Cmd(f"hyb-gpt-d2t2p2-zero{zero}", [*mesh, "--zero", zero, "-q"], timeline=zero == "3"))
    add(Cmd("hyb-gpt-d2t4p2", ["-trace-dir", GPT, "--dp", "2", "--tp", "4", "--pp", "2", "-micro-batch-size", "2",
                               "--schedule", "1f1b", "-q"]))
    add(Cmd("hyb-gpt-t4-megatron", ["-trace-dir", GPT, "--tp", "4", "--tp-style", "megatron", "-q"]))
    add(Cmd("hyb-gpt-t4-perop", ["-trace-dir", GPT, "--tp", "4", "--tp-style", "per-op", "-q"]))
    add(Cmd("hyb-gpt16-d2t8-sp", ["-trace-dir", GPT16, "--dp", "2", "--tp", "8", "--sequence-parallel", "-q"]))
    add(Cmd("hyb-gpt-d2t2p2-sp-zero1", [*mesh, "--sequence-parallel", "--zero", "1", "-q"]))
    add(Cmd("hyb-gpt-d2t2p2-interleaved-v2", ["-trace-dir", GPT, "--dp", "2", "--tp", "2", "--pp", "2",
                                              "-micro-batch-size", "2", "--schedule", "interleaved",
                                              "--virtual-stages", "2", "-q"]))
    add(Cmd("hyb-gpt-d2p2-gpipe-count", ["-trace-dir", GPT, "--dp", "2", "--pp", "2", "-micro-batch-size", "4",
                                         "--schedule", "gpipe", "--partition", "count", "-q"]))
    l16 = ["-trace-dir", GPT, "--num-layers", "16", "--dp", "2", "--tp", "2", "--pp", "4",
           "-micro-batch-size", "2", "--schedule", "1f1b", "--topology", "nvlink-cluster"]
    add(Cmd("hyb-gpt-l16-d2t2p4-exact", [*l16, "--exact", "-q"]))
    add(Cmd("hyb-gpt-l16-d2t2p4-repr", [*l16, "--representatives", "-q"]))
    add(Cmd("hyb-gpt16-l96-d8t8p8", ["-trace-dir", GPT16, "--num-layers", "96", "--dp", "8", "--tp", "8", "--pp", "8",
                                     "--schedule", "1f1b", "-batch-size-sim", "64", "-micro-batch-size", "1",
                                     "--topology", "nvlink-cluster", "-q"]))
    add(Cmd("hyb-gpt-d4t2-rankorder-dp", ["-trace-dir", GPT, "--dp", "4", "--tp", "2", "--rank-order", "dp,tp,pp",
                                          "--topology", "nvlink-cluster", "--gpus-per-node", "4", "-q"]))
    # Model cards: FP8 training, and mixture-of-experts layers with expert parallelism (the
    # combined 1F1B among them).
    card = ["--seq-len", "1024", "--gpu", "h100-sxm", "-micro-batch-size", "1"]
    add(Cmd("card-llama8b-l2-d2t2p2-fp8", ["--model", "llama3-8b", "--num-layers", "2", *card, "--dp", "2", "--tp", "2",
                                           "--pp", "2", "--sequence-parallel", "--dtype", "fp8", "--global-batch", "8",
                                           "-q"]))
    add(Cmd("card-qwen30b-l2-d8ep8-fp8", ["--model", "qwen3-30b-a3b", "--num-layers", "2", *card, "--dp", "8", "--ep",
                                          "8", "--dtype", "fp8", "--global-batch", "8", "-q"]))
    add(Cmd("card-qwen30b-l4-d4t2p2ep4-a2a", ["--model", "qwen3-30b-a3b", "--num-layers", "4", *card, "--topology",
                                              "nvlink-cluster", "--dp", "4", "--tp", "2", "--pp", "2", "--ep", "4",
                                              "--sequence-parallel", "--schedule", "interleaved", "--virtual-stages",
                                              "2", "--moe-a2a-overlap", "--global-batch", "16", "-q"]))
    # Collective algorithms (DDP over two 8-GPU NVSwitch nodes) and protocols.
    ddp16 = ["-trace-dir", R50, "-case", "2", "-GPUnumber", "16", "--topology", "nvlink-cluster"]
    for algo in ("auto", "ring", "one-way-ring", "tree", "hierarchical", "direct"):
        add(Cmd(f"coll-r50-ddp16-{algo}", [*ddp16, "--collective-algo", algo, "-q"]))
    add(Cmd("coll-r50-ddp16-proto-auto", [*ddp16, "--collective-protocol", "auto", "-q"]))
    add(Cmd("coll-r50-ddp16-ll128-lat0", [*ddp16, "--collective-protocol", "ll128", "--collective-latency-us", "0", "-q"]))
    add(Cmd("coll-r50-ddp16-expanded", [*ddp16, "--collective-algo", "ring", "--collective-detail", "expanded", "-q"]))
    add(Cmd("coll-gpt-t4-tree", ["-trace-dir", GPT, "--dp", "2", "--tp", "4", "--collective-algo", "tree", "-q"]))
    # Network models and the optical mesh.
    for net in ("flow", "exclusive"):
        add(Cmd(f"net-{net}-vgg13-ddp8", ["-trace-dir", VGG, "-case", "2", "-GPUnumber", "8", "--network", net, "-q"]))
        add(Cmd(f"net-{net}-gpt-d2t2p2", [*mesh, "--network", net, "-q"]))
    add(Cmd("optical-vgg13-ddp8-2x4", ["-trace-dir", VGG, "-case", "2", "-GPUnumber", "8", "-interconnects", "1",
                                       "-numRows", "2", "-numCols", "4", "-q"]))
    add(Cmd("optical-vgg13-pipe4", ["-trace-dir", VGG, "-case", "4", "-GPUnumber", "4", "-interconnects", "1",
                                    "-micro-batch-size", "32", "-q"]))
    add(Cmd("optical-vgg13-dp8-compat", ["-trace-dir", VGG, "-case", "1", "-GPUnumber", "8", "-interconnects", "1",
                                         "--reference-compat", "-q"]))
    # Topology files and presets.
    add(Cmd("topo-superpod-r50-ddp64", ["-trace-dir", R50, "-case", "2", "-GPUnumber", "64",
                                        "--topology-file", "topologies/dgx-h100-superpod.yaml", "-q"]))
    add(Cmd("topo-superpod-gpt-d4t4p2", ["-trace-dir", GPT, "--dp", "4", "--tp", "4", "--pp", "2",
                                         "-micro-batch-size", "2", "--schedule", "1f1b",
                                         "--topology-file", "topologies/dgx-h100-superpod.yaml", "-q"]))
    add(Cmd("topo-ringfile-vgg13-ddp8", ["-trace-dir", VGG, "-case", "2", "-GPUnumber", "8",
                                         "--topology-file", "topologies/ring.yaml", "-q"]))
    for topo in ("ring", "fully-connected", "switch", "nvlink-cluster"):
        add(Cmd(f"topo-{topo}-vgg13-ddp8", ["-trace-dir", VGG, "-case", "2", "-GPUnumber", "8", "--topology", topo, "-q"]))
    add(Cmd("topo-nvlink-gpn4-vgg13-pipe8", ["-trace-dir", VGG, "-case", "4", "-GPUnumber", "8", "--topology",
                                             "nvlink-cluster", "--gpus-per-node", "4", "-micro-batch-size", "16",
                                             "--link-latency-us", "1", "-q"]))
    # Other knobs that go through the trace readers and op-time models.
    add(Cmd("misc-r50-ddp1024", ["-trace-dir", R50, "-case", "2", "-GPUnumber", "1024", "-q"]))
    add(Cmd("misc-vgg13-span-bs64", ["-trace-dir", VGG, "-case", "1", "-GPUnumber", "4", "--time-column", "span",
                                     "-batch-size-sim", "64", "-q"]))
    add(Cmd("misc-r18-remote-bucket5", ["-trace-dir", R18, "-case", "2", "-GPUnumber", "4", "--initial-placement",
                                        "remote", "--bucket-mb", "5", "-capacity", "34", "-q"]))
    # Sweeps (CSV), DAG exports (DOT), trace repeat (a directory).
    add(Cmd("sweep-vgg13-cases", ["--trace-dir", VGG, "--case", "0,1,2,3,4", "--gpus", "2,4",
                                  "--micro-batch-size", "32", "-j", "1", "-q"], kind="sweep"))
    add(Cmd("sweep-gpt-hybrid-j2", ["--trace-dir", GPT, "--dp", "1,2", "--tp", "1,2", "--pp", "1,2",
                                    "--micro-batch-size", "2", "--schedule", "1f1b", "--zero", "0,3", "-j", "2", "-q"],
            kind="sweep"))
    for collapse in ("none", "layer", "stage"):
        add(Cmd(f"dag-default-pipe2-{collapse}", ["-case", "4", "-GPUnumber", "2", "--collapse", collapse], kind="dag"))
    add(Cmd("dag-gpt-d2t2p2-auto", [*mesh], kind="dag"))
    add(Cmd("dag-vgg13-ddp4-gpus01", ["-trace-dir", VGG, "-case", "2", "-GPUnumber", "4", "--show-gpus", "0,1",
                                      "--collapse", "none", "--layout", "lr"], kind="dag"))
    add(Cmd("repeat-gpt-l8", ["--layers", "8", "--in", GPT, "-q"], kind="repeat"))
    add(Cmd("repeat-gpt16-l5", ["--layers", "5", "--in", GPT16, "-q"], kind="repeat"))
    names = [c.name for c in cmds]
    assert len(names) == len(set(names)), "duplicate command names"
    return cmds


# ---------------------------------------------------------------------------------------------
# Running


def run_one(exe: str, cmd: Cmd, out: Path) -> dict:
    """Run ``cmd`` writing into ``out``; returns its record (also written to ``<name>.cmd.json``)."""
    for rel in cmd.outputs():
        p = out / rel
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    argv = cmd.full_argv(out)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([exe, *argv], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = "timeout", "", f"timed out after {e.timeout} s"
    record = {
        "name": cmd.name,
        "argv": ["triosim", *cmd.full_argv(Path("DIR"))],
        "exit_code": rc,
        "stdout": stdout if cmd.quiet else None,
        "wall_s": round(time.perf_counter() - t0, 2),  # information only, never compared
        "stderr_tail": stderr[-2000:],  # information only, never compared
    }
    (out / f"{cmd.name}.cmd.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def select(cmds: list[Cmd], only: list[str] | None) -> tuple[list[Cmd], list[Cmd]]:
    """(commands to run, commands skipped for want of the reference traces)."""
    if only:
        cmds = [c for c in cmds if any(re.search(pat, c.name) for pat in only)]
    have_ref = REF.is_dir()
    run = [c for c in cmds if have_ref or not c.reference]
    return run, [c for c in cmds if c not in run]


def triosim_version(exe: str) -> str:
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, cwd=REPO)
    return proc.stdout.strip() or proc.stderr.strip()


def record(exe: str, out: Path, only: list[str] | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    cmds, skipped = select(matrix(), only)
    for c in skipped:
        print(f"{c.name}: skipped (no {REF_REL})")
    failures = 0
    for i, cmd in enumerate(cmds, 1):
        rec = run_one(exe, cmd, out)
        missing = [rel for rel in cmd.outputs() if not (out / rel).exists()]
        note = f" MISSING {', '.join(missing)}" if missing else ""
        failures += bool(missing) or rec["exit_code"] != 0
        print(f"[{i:3d}/{len(cmds)}] {cmd.name}: rc={rec['exit_code']} {rec['wall_s']:.2f} s"
              + (f" stdout={rec['stdout'].strip()!r}" if rec["stdout"] else "") + note, flush=True)
    names = [c.name for c in cmds]
    if only and (out / "manifest.json").exists():  # a partial re-record keeps the other commands
        kept = set(json.loads((out / "manifest.json").read_text())["commands"]) | set(names)
        names = [c.name for c in matrix() if c.name in kept]
    manifest = {"triosim": triosim_version(exe), "executable": exe, "repo": str(REPO),
                "commands": names, "skipped": [c.name for c in skipped]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"recorded {len(cmds)} commands into {out} ({failures} with a non-zero exit or a missing output)")
    return 0


# ---------------------------------------------------------------------------------------------
# Comparing


def strip_version(obj):
    """Delete ``triosim_version`` wherever it occurs (the result holds it in ``config``)."""
    if isinstance(obj, dict):
        return {k: strip_version(v) for k, v in obj.items() if k != VERSION_KEY}
    if isinstance(obj, list):
        return [strip_version(v) for v in obj]
    return obj


def canonical(obj) -> dict | list:
    """The compared form of a result: no version field, path fields reduced to their last part."""
    obj = strip_version(obj)
    if isinstance(obj, dict) and isinstance(obj.get("config"), dict):
        for key in PATH_KEYS:
            value = obj["config"].get(key)
            if isinstance(value, str):
                obj["config"][key] = "…/" + Path(value).name
    return obj


def raw_without_version(text: str) -> str:
    return re.sub(r'"triosim_version":\s*"[^"]*"', '"triosim_version": ""', text)


def leaf_diffs(a, b, path: str = "", out: list | None = None, limit: int = 1000) -> list[tuple[str, object, object]]:
    """(path, old, new) of differing leaves, in document order."""
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            p = f"{path}.{k}" if path else str(k)
            if k not in b:
                out.append((p, a[k], "<absent>"))
            elif k not in a:
                out.append((p, "<absent>", b[k]))
            else:
                leaf_diffs(a[k], b[k], p, out, limit)
    elif isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            p = f"{path}[{i}]"
            if i >= len(b):
                out.append((p, a[i], "<absent>"))
            elif i >= len(a):
                out.append((p, "<absent>", b[i]))
            else:
                leaf_diffs(a[i], b[i], p, out, limit)
    elif a != b or type(a) is not type(b):
        out.append((path, a, b))
    return out


def short(v, n: int = 60) -> str:
    s = json.dumps(v) if not isinstance(v, str) else repr(v)
    return s if len(s) <= n else s[:n] + "…"


def fmt_diffs(diffs: list[tuple[str, object, object]], k: int = 4) -> str:
    shown = "; ".join(f"{p}: {short(a)} -> {short(b)}" for p, a, b in diffs[:k])
    return shown + (f"; … {len(diffs) - k} more" if len(diffs) > k else "")


@dataclass
class Verdict:
    status: str  # same | counts | diff
    detail: str = ""


def compare_json(old: Path, new: Path, case_run: bool) -> Verdict:
    ob, nb = old.read_bytes(), new.read_bytes()
    if ob == nb:
        return Verdict("same")
    try:
        oj, nj = json.loads(ob), json.loads(nb)
    except ValueError as e:
        return Verdict("diff", f"{new.name}: not JSON ({e})")
    oc, nc = canonical(oj), canonical(nj)
    if json.dumps(oc, sort_keys=True) == json.dumps(nc, sort_keys=True):
        if raw_without_version(ob.decode()) == raw_without_version(nb.decode()):
            return Verdict("same", f"{new.name}: raw bytes differ only in config.{VERSION_KEY}")
        diffs = leaf_diffs(strip_version(oj), strip_version(nj))
        why = fmt_diffs(diffs) if diffs else "key order or formatting"
        return Verdict("same", f"{new.name}: raw bytes differ beyond the version field ({why})")
    diffs = leaf_diffs(oc, nc)
    counts_only = bool(diffs) and all(p in COUNT_KEYS for p, _, _ in diffs)
    core_same = all(oc.get(k) == nc.get(k) for k in CORE_KEYS) if isinstance(oc, dict) and isinstance(nc, dict) else False
    if counts_only and core_same and case_run:
        return Verdict("counts", f"{new.name}: " + fmt_diffs(diffs))
    note = ("only task/edge counts differ but this is not a -case run; " if counts_only else "") + (
        "makespan/per_gpu/per_link identical" if core_same else "makespan/per_gpu/per_link DIFFER")
    return Verdict("diff", f"{new.name}: {note}; {fmt_diffs(diffs)}")


def first_line_diff(a: bytes, b: bytes) -> str:
    al, bl = a.decode(errors="replace").splitlines(), b.decode(errors="replace").splitlines()
    for i in range(max(len(al), len(bl))):
        x = al[i] if i < len(al) else "<end>"
        y = bl[i] if i < len(bl) else "<end>"
        if x != y:
            return f"line {i + 1}: {short(x, 100)} -> {short(y, 100)} ({len(al)} vs {len(bl)} lines)"
    return "same lines, different bytes (line endings?)"


def compare_csv(old: Path, new: Path, case_run: bool) -> Verdict:
    ob, nb = old.read_bytes(), new.read_bytes()
    if ob == nb:
        return Verdict("same")
    orows = list(csv.DictReader(io.StringIO(ob.decode())))
    nrows = list(csv.DictReader(io.StringIO(nb.decode())))
    drop = {c for rows in (orows, nrows) for c in (rows[0] if rows else {}) if "version" in c.lower()}
    ohead = [c for c in (orows[0] if orows else {}) if c not in drop]
    nhead = [c for c in (nrows[0] if nrows else {}) if c not in drop]
    if ohead != nhead:
        return Verdict("diff", f"{new.name}: columns {ohead} -> {nhead}")
    if len(orows) != len(nrows):
        return Verdict("diff", f"{new.name}: {len(orows)} rows -> {len(nrows)}")
    diffs = [(f"row {i + 1}.{c}", o[c], n[c]) for i, (o, n) in enumerate(zip(orows, nrows))
             for c in ohead if o[c] != n[c]]
    if not diffs:
        return Verdict("same", f"{new.name}: raw bytes differ only in the version column(s) {sorted(drop)}"
                       if drop else f"{new.name}: same cells, different bytes")
    if all(p.split(".")[-1] in COUNT_KEYS for p, _, _ in diffs) and case_run:
        return Verdict("counts", f"{new.name}: " + fmt_diffs(diffs))
    return Verdict("diff", f"{new.name}: " + fmt_diffs(diffs))


def compare_bytes(old: Path, new: Path) -> Verdict:
    ob, nb = old.read_bytes(), new.read_bytes()
    if ob == nb:
        return Verdict("same")
    return Verdict("diff", f"{new.name}: {first_line_diff(ob, nb)}")


def compare_tree(old: Path, new: Path) -> Verdict:
    ofiles = sorted(p.relative_to(old).as_posix() for p in old.rglob("*") if p.is_file())
    nfiles = sorted(p.relative_to(new).as_posix() for p in new.rglob("*") if p.is_file())
    if ofiles != nfiles:
        return Verdict("diff", f"{new.name}/: files {ofiles} -> {nfiles}")
    for rel in ofiles:
        v = compare_json(old / rel, new / rel, False) if rel.endswith(".json") else compare_bytes(old / rel, new / rel)
        if v.status != "same":
            return Verdict("diff", f"{new.name}/{v.detail}")
    return Verdict("same")


def compare_cmd(cmd: Cmd, base: Path, new: Path, rec: dict) -> Verdict:
    meta_path = base / f"{cmd.name}.cmd.json"
    if not meta_path.exists():
        return Verdict("diff", "not in the baseline")
    old = json.loads(meta_path.read_text())
    notes, worst = [], "same"

    def add(v: Verdict) -> None:
        nonlocal worst
        if v.detail:
            notes.append(v.detail)
        rank = {"same": 0, "counts": 1, "diff": 2}
        if rank[v.status] > rank[worst]:
            worst = v.status

    if old["argv"] != rec["argv"]:
        add(Verdict("diff", f"argv changed: {' '.join(old['argv'])}"))
    if old["exit_code"] != rec["exit_code"]:
        add(Verdict("diff", f"exit code {old['exit_code']} -> {rec['exit_code']}"
                    + (f" ({rec['stderr_tail'].strip().splitlines()[-1][:150]})" if rec["stderr_tail"].strip() else "")))
    if old["stdout"] != rec["stdout"]:
        add(Verdict("diff", f"stdout {short(old['stdout'])} -> {short(rec['stdout'])}"))
    for rel in cmd.outputs():
        o, n = base / rel, new / rel
        if not o.exists() and not n.exists():
            continue
        if not o.exists() or not n.exists():
            add(Verdict("diff", f"{rel}: {'absent' if not o.exists() else 'present'} in baseline, "
                        f"{'absent' if not n.exists() else 'present'} now"))
        elif o.is_dir():
            add(compare_tree(o, n))
        elif rel.endswith(".timeline.json"):
            add(compare_bytes(o, n))
        elif rel.endswith(".json"):
            add(compare_json(o, n, cmd.case_run))
        elif rel.endswith(".csv"):
            add(compare_csv(o, n, cmd.case_run))
        else:
            add(compare_bytes(o, n))
    return Verdict(worst, " | ".join(notes))


def compare(exe: str, base: Path, only: list[str] | None, keep: Path | None) -> int:
    if not (base / "manifest.json").exists():
        raise SystemExit(f"{base}: no manifest.json (record it first with --record)")
    cmds, skipped = select(matrix(), only)
    manifest = json.loads((base / "manifest.json").read_text())
    print(f"baseline: {manifest['triosim']} ({len(manifest['commands'])} commands); now: {triosim_version(exe)}")
    for c in skipped:
        print(f"{c.name}: skipped (no {REF_REL})")
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        new = keep
        ctx = None
    else:
        ctx = tempfile.TemporaryDirectory(prefix="identity-matrix-")
        new = Path(ctx.name)
    counts = {"same": 0, "counts": 0, "diff": 0}
    width = max(len(c.name) for c in cmds)
    try:
        for cmd in cmds:
            rec = run_one(exe, cmd, new)
            v = compare_cmd(cmd, base, new, rec)
            counts[v.status] += 1
            label = {"same": "same", "counts": "counts-only", "diff": "DIFF"}[v.status]
            print(f"{cmd.name:<{width}}  {label}" + (f"  ({v.detail})" if v.detail else ""), flush=True)
    finally:
        if ctx is not None:
            ctx.cleanup()
    not_run = [n for n in manifest["commands"] if n not in {c.name for c in cmds} and not only]
    if not_run:
        print(f"in the baseline but not in this matrix: {', '.join(not_run)}")
    if skipped:
        print(f"{len(skipped)} command(s) skipped: no {REF_REL}")
    print(f"{len(cmds)} commands: {counts['same']} same, {counts['counts']} counts-only, {counts['diff']} different")
    return 1 if counts["diff"] or not_run else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", metavar="DIR", type=Path, help="run the matrix and store its outputs in DIR")
    mode.add_argument("--compare", metavar="DIR", type=Path, help="run the matrix and compare with DIR")
    mode.add_argument("--list", action="store_true", help="print the commands and exit")
    ap.add_argument("--triosim", default="triosim", metavar="PATH", help="the triosim executable (triosim on PATH)")
    ap.add_argument("--only", action="append", metavar="REGEX", help="run only the commands matching (repeatable)")
    ap.add_argument("--keep", metavar="DIR", type=Path, help="compare: keep the new outputs in DIR")
    args = ap.parse_args(argv)
    exe = shutil.which(args.triosim) or args.triosim
    if args.list:
        cmds, skipped = select(matrix(), args.only)
        for c in cmds + skipped:
            print(f"{c.name}: {' '.join(c.full_argv(Path('DIR')))}" + ("   [skipped]" if c in skipped else ""))
        print(f"{len(cmds)} commands ({len(skipped)} skipped)")
        return 0
    if not os.access(exe, os.X_OK):
        raise SystemExit(f"{args.triosim}: not an executable")
    if args.record:
        return record(exe, args.record.resolve(), args.only)
    return compare(exe, args.compare.resolve(), args.only, args.keep.resolve() if args.keep else None)


if __name__ == "__main__":
    sys.exit(main())
