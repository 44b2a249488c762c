"""Nothing dropped or mislabelled silently (issue 24): flags a run does not use are named in one
note, hybrid runs are labelled by their composition, and the pipeline summary's micro-batches
and stage times add up to what was simulated."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from triosim.cli.console import main
from triosim.config import configure
from triosim.graph.strategy import Strategy
from triosim.report.result import case_of
from triosim.report.summary import fold_stage_warnings, micro_batch_text

ROOT = Path(__file__).resolve().parents[1]
GPT = str(ROOT / "sample_trace" / "gpt-cpu-bs8")
SUPERPOD = str(ROOT / "topologies" / "dgx-h100-superpod.yaml")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- notes: a valid value the run does not use is named, the run goes on ---------------------

@pytest.mark.parametrize("argv, note", [
    (["-case", "1", "-GPUnumber", "2", "--reference-compat", "--collective-protocol", "ll"],
     "triosim: note: --reference-compat runs the original's network (exclusive links, one-way ring, no latency, "
     "Simple protocol): --collective-protocol ll not used"),
    (["-trace-dir", GPT, "--pp", "2", "-micro-batch-size", "2", "--sequence-parallel"],
     "triosim: note: sequence parallelism splits tensor-parallel blocks, and --tp is 1: --sequence-parallel not used"),
    (["-trace-dir", GPT, "--pp", "2", "-micro-batch-size", "2", "--sequence-parallel", "--tp-comm-overlap"],
     "triosim: note: sequence parallelism splits tensor-parallel blocks, and --tp is 1: --sequence-parallel, "
     "--tp-comm-overlap not used"),
    (["--model", "qwen3-30b-a3b", "--num-layers", "2", "--gpu", "h100-sxm", "--seq-len", "256", "--dp", "2",
      "--moe-token-dispatcher", "allgather", "--moe-imbalance", "2", "--moe-shared-expert-overlap"],
     "triosim: note: only expert parallelism sends tokens to other GPUs' experts, and --ep is 1: "
     "--moe-token-dispatcher allgather, --moe-imbalance 2.0, --moe-shared-expert-overlap not used"),
    (["--model", "llama3-8b", "--num-layers", "4", "--gpu", "h100-sxm", "--pp", "4", "--gpus", "4", "--global-batch",
      "8", "-micro-batch-size", "1", "--seq-len", "1024", "--offload-activations", "1"],  # one layer a chunk
     "triosim: note: no model chunk has a layer to offload (a chunk's last layer never is): "
     "--offload-activations 1 not used"),
    (["-trace-dir", GPT, "--pp", "2", "-micro-batch-size", "2", "--zero", "3"],
     "triosim: note: ZeRO shards over the data-parallel and context-parallel ranks, and --dp and --cp are 1: "
     "--zero 3 not used"),
    (["-case", "2", "-GPUnumber", "16", "--topology-file", SUPERPOD, "--topology", "fully-connected",
      "-ptp-bandwidth", "100"],
     "triosim: note: the --topology-file's links replace them: --topology fully-connected, -ptp-bandwidth 100.0 "
     "not used"),
    (["-case", "0", "--topology-file", SUPERPOD],
     f"triosim: note: -case 0 simulates one GPU: --topology-file {SUPERPOD} not used"),
])
def test_an_unused_value_is_named_in_one_note(capsys, argv, note):
    code, out, err = run_cli(capsys, "run", *argv, "-q")
    assert code == 0 and float(out) > 0
    assert err.splitlines() == [note]


def test_values_the_run_uses_get_no_note(capsys):
    for argv in (["-case", "1", "-GPUnumber", "2", "--collective-protocol", "ll"],
                 ["-case", "1", "-GPUnumber", "2", "--reference-compat", "--network", "exclusive"],
                 ["-trace-dir", GPT, "--dp", "2", "--zero", "1"],
                 ["-trace-dir", GPT, "--cp", "2", "--zero", "3"],  # ZeRO shards over the context ranks too
                 ["--model", "llama3-8b", "--num-layers", "4", "--gpu", "h100-sxm", "--pp", "2", "--gpus", "2",
                  "--global-batch", "8", "-micro-batch-size", "1", "--seq-len", "1024", "--offload-activations", "1"],
                 ["-trace-dir", GPT, "--tp", "2", "--sequence-parallel"],
                 ["--dp", "2"]):
        code, _, err = run_cli(capsys, "run", *argv, "-q")
        assert code == 0 and err == "", argv


def test_unused_hybrid_options_change_nothing(capsys):
    """Why a note and not an error: ZeRO at dp 1 and sequence parallelism at tp 1 simulate the
    same times and memory as without them."""
    base = ["run", "-trace-dir", GPT, "--pp", "2", "-micro-batch-size", "2", "--json", "-"]
    plain = json.loads(run_cli(capsys, *base)[1])
    for extra in (["--zero", "3"], ["--sequence-parallel"]):
        other = json.loads(run_cli(capsys, *base, *extra)[1])
        assert other["makespan_ms"] == plain["makespan_ms"]
        assert [g["peak_memory_bytes"] for g in other["per_gpu"]] == [g["peak_memory_bytes"] for g in plain["per_gpu"]]


# --- -case and the degrees --------------------------------------------------------------------

def test_case_0_from_a_config_file_combines_with_degrees(capsys, tmp_path):
    """A hybrid run's --json config block records case 0 (the default): it must run again."""
    first = tmp_path / "r.json"
    assert run_cli(capsys, "run", "-trace-dir", GPT, "--dp", "2", "--tp", "2", "--json", str(first), "-q")[0] == 0
    assert json.loads(first.read_text())["config"]["case"] == 0
    code, out, err = run_cli(capsys, "run", "--config", str(first), "-q")
    assert code == 0 and err == "" and float(out) == pytest.approx(json.loads(first.read_text())["makespan_ms"], abs=1e-4)
    (tmp_path / "c.json").write_text(json.dumps({"trace-dir": GPT, "case": 3, "dp": 2}))
    code, _, err = run_cli(capsys, "run", "--config", str(tmp_path / "c.json"), "-q")
    assert code == 2 and "-case 3 and --dp 2 both choose the parallelism" in err


def test_configure_refuses_a_case_with_degrees():
    from triosim.errors import ConfigError

    with pytest.raises(ConfigError, match="-case 2 and --dp 4 both choose"):
        configure(case=2, dp=4, trace_dir=GPT)
    configure(case=0, dp=2, trace_dir=GPT)  # the default case: Python arguments cannot tell "given"


# --- labels -----------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy, case", [
    (Strategy(case=2), 2),
    (Strategy(dp=4), 2),
    (Strategy(pp=4, micro_batch_size=2, schedule="1f1b"), 4),
    (Strategy(tp=4, tp_style="per-op"), 3),
    (Strategy(tp=4), None),  # megatron: no case
    (Strategy(dp=1), 0),
    (Strategy(dp=2, tp=2), None),
    (Strategy(dp=4, zero=1), None),
    (Strategy(dp=4, micro_batch_size=2), None),  # case 2 runs one micro-batch
    (Strategy(dp=1, pp=1, micro_batch_size=2), None),
])
def test_case_of_a_composition(strategy, case):
    assert case_of(strategy) == case


def test_hybrid_runs_are_labelled_by_their_composition(capsys):
    code, out, _ = run_cli(capsys, "run", "-trace-dir", GPT, "--dp", "2", "--tp", "2", "--json", "-")
    d = json.loads(out)
    assert code == 0 and d["case"] is None and d["case_name"] == "hybrid dp2×tp2"
    assert json.loads(run_cli(capsys, "run", "-trace-dir", GPT, "--tp", "4", "--tp-style", "per-op",
                              "--json", "-")[1])["case"] == 3
    code, out, _ = run_cli(capsys, "run", "-trace-dir", GPT, "--dp", "2", "--tp", "2")
    assert "hybrid dp2×tp2 · 4 GPUs (ring)" in out and "case 0" not in out
    code, out, _ = run_cli(capsys, "run", "-trace-dir", GPT, "--dp", "2")
    assert "hybrid dp2 (= case 2) · 2 GPUs" in out


def test_sweep_case_column_labels_hybrid_points(capsys, tmp_path):
    out_csv = tmp_path / "s.csv"
    code, _, _ = run_cli(capsys, "sweep", "-trace-dir", GPT, "--case", "0,2", "--dp", "1,2", "--tp", "1,2",
                         "--jobs", "1", "--out", str(out_csv), "-q")
    assert code == 0
    lines = out_csv.read_text().splitlines()
    head = lines[0].split(",")
    cells = [(row.split(",")[head.index("case")], row.split(",")[head.index("status")]) for row in lines[1:]]
    # case × degrees collapse to one run per composition, none refused
    assert sorted(cells) == sorted([("0", "ok"), ("hybrid tp2", "ok"), ("2", "ok"), ("hybrid dp2×tp2", "ok")])


# --- micro-batches ----------------------------------------------------------------------------

def test_micro_batch_text_adds_up_to_the_batch():
    assert micro_batch_text([5, 5, 5, 1], 16, False) == "4 micro-batches: 3 of 5 and 1 of 1 (16 samples)"
    assert micro_batch_text([4, 4, 4, 4], 16, False) == "4 micro-batches of 4 (16 samples)"
    assert micro_batch_text([16], 16, False) == "1 micro-batch of 16"
    assert micro_batch_text([5, 5, 5], 16, True) == ("3 micro-batches, each 1/3 of the batch of 16 "
                                                     "(the original's ⌊16/5⌋ rounds)")


def test_case_4_summary_tells_the_micro_batches_as_simulated(capsys):
    code, out, _ = run_cli(capsys, "run", "-case", "4", "-GPUnumber", "2", "-micro-batch-size", "5",
                           "-batch-size-sim", "16")
    assert code == 0
    assert "4 micro-batches: 3 of 5 and 1 of 1 (16 samples)" in " ".join(out.split())
    code, out, _ = run_cli(capsys, "run", "-case", "4", "-GPUnumber", "2", "-micro-batch-size", "5",
                           "-batch-size-sim", "16", "--json", "-")
    assert json.loads(out)["pipeline"]["micro_batches"] == [5, 5, 5, 1]


def test_one_micro_batch_gives_a_hint_not_a_warning_per_stage(capsys):
    code, out, _ = run_cli(capsys, "run", "-case", "4")
    text = " ".join(out.split())
    assert code == 0
    assert "hint: one micro-batch, so the stages run one after another" in text
    assert "-micro-batch-size 2: 8 micro-batches" in text
    assert "holds" not in text and "warning" not in text


def test_stage_compute_adds_up_to_the_per_gpu_table(capsys):
    code, out, _ = run_cli(capsys, "run", "-case", "4", "-GPUnumber", "4", "-micro-batch-size", "4", "--json", "-")
    per_gpu = {g["gpu"]: g["compute_ms"] for g in json.loads(out)["per_gpu"]}
    code, out, _ = run_cli(capsys, "run", "-case", "4", "-GPUnumber", "4", "-micro-batch-size", "4")
    rows = re.findall(r"stage (\d+) · GPU (\d+) · .*?: ([\d.]+) ms, optimizer ([\d.]+) ms", out)
    assert len(rows) == 4 and "optimizer share = the GPU's compute in Per GPU" in out
    for _, gpu, fb, opt in rows:
        assert float(fb) + float(opt) == pytest.approx(per_gpu[int(gpu)], abs=2e-3)


def test_small_stage_warnings_fold_into_one_line():
    reason = "no cut gave it more"
    ws = [f"stage {s} holds {p} of the compute (under 5%): {reason}" for s, p in ((4, "0.1%"), (6, "0.0%"))]
    assert fold_stage_warnings([*ws, "stage 2 has no backward op"]) == [
        f"stages 4, 6 hold 0.1%, 0.0% of the compute (each under 5%): {reason}", "stage 2 has no backward op"]
    assert fold_stage_warnings(ws[:1]) == ws[:1]
    assert fold_stage_warnings(ws, drop_small=True) == []


# --- the first hour ---------------------------------------------------------------------------

def test_closest_tracer_model():
    pytest.importorskip("torchvision")
    from triosim.tracer.models import closest_model

    assert closest_model("mobilenetv2") == "; did you mean mobilenet_v2?"
    assert closest_model("ResNet-50") == "; did you mean resnet50?"
    assert closest_model("gpt2small") == "; did you mean gpt2-small?"
    assert closest_model("zzzzzz") == ""
