"""Megatron's defaults for what a run leaves out (:mod:`triosim.config.defaults`): micro-batch 1
with --global-batch, 1F1B over several micro-batches, the GPU's node fabric, dp from -GPUnumber;
each shown in the summary, the JSON ``defaults`` list and the config block, and a rerun from the
config block gives the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_capture import run

CARD = ["--model", "llama3-8b", "--num-layers", "2", "--gpu", "h100-sxm"]



def result(argv: list[str]) -> dict:
    code, out, err = run(["run", *argv, "--json", "-"])
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRIOSIM_CACHE_DIR", str(tmp_path / "cache"))


def test_global_batch_without_micro_batch_runs_micro_batches_of_one() -> None:
    r = result([*CARD, "--dp", "2", "--pp", "2", "--global-batch", "8"])
    assert r["hybrid"]["micro_batches"] == 4 and r["throughput"]["micro_batch"] == 1
    explicit = result([*CARD, "--dp", "2", "--pp", "2", "--global-batch", "8", "-micro-batch-size", "1"])
    assert r["makespan_ms"] == explicit["makespan_ms"]
    assert {"flag": "-micro-batch-size", "value": "1", "why": "--global-batch without it"} in r["defaults"]
    assert "-micro-batch-size" in r["config"]["defaults_applied"]
    assert r["config"]["micro-batch-size"] == -1  # as given: a rerun derives the same default
    assert "defaults" not in explicit or all(d["flag"] != "-micro-batch-size" for d in explicit["defaults"])


def test_several_micro_batches_run_1f1b_and_one_runs_gpipe() -> None:
    many = result([*CARD, "--pp", "2", "--global-batch", "8", "--topology", "ring"])
    assert many["parallel"]["schedule"] == "1f1b"
    one = result([*CARD, "--pp", "2", "--global-batch", "2", "-micro-batch-size", "2", "--topology", "ring"])
    assert one["parallel"]["schedule"] == "gpipe" and "defaults" not in one
    asked = result([*CARD, "--pp", "2", "--global-batch", "8", "--schedule", "gpipe", "--topology", "ring"])
    assert asked["parallel"]["schedule"] == "gpipe"


def test_gradient_accumulation_holds_one_micro_batch_of_activations() -> None:
    """At --pp 1, several micro-batches are gradient accumulation: 1F1B frees each micro-batch's
    activations in its backward, so the peak is that of one micro-batch, below GPipe's."""
    base = [*CARD, "--dp", "1", "--global-batch", "8"]
    auto = result(base)["per_gpu"][0]["peak_memory_bytes"]
    one_f_one_b = result([*base, "--schedule", "1f1b"])["per_gpu"][0]["peak_memory_bytes"]
    gpipe = result([*base, "--schedule", "gpipe"])["per_gpu"][0]["peak_memory_bytes"]
    assert auto == one_f_one_b < gpipe


def test_reference_compat_keeps_the_originals_gpipe(vgg13_dir: Path) -> None:
    code, out, err = run(["run", "-trace-dir", str(vgg13_dir), "-case", "4", "-GPUnumber", "2",
                          "-micro-batch-size", "32", "--reference-compat", "--json", "-"])
    assert code == 0, err
    assert json.loads(out)["pipeline"]["schedule"] == "gpipe"
    code, out, err = run(["run", "-trace-dir", str(vgg13_dir), "-case", "4", "-GPUnumber", "2",
                          "-micro-batch-size", "32", "--json", "-"])
    assert code == 0, err
    assert json.loads(out)["pipeline"]["schedule"] == "1f1b"


@pytest.mark.parametrize("gpu,fabric", [("h100-sxm", "dgx-h100-superpod"), ("h200", "dgx-h100-superpod"),
                                        ("a100-80gb", "dgx-a100-superpod"), ("b200", "dgx-b200-superpod")])
def test_gpu_without_topology_runs_on_its_node_fabric(gpu: str, fabric: str) -> None:
    r = result(["--model", "llama3-8b", "--num-layers", "2", "--gpu", gpu, "--dp", "2", "--tp", "8",
                "--global-batch", "2"])
    assert any(link["link"].startswith("gpu0->nvsw") for link in r["per_link"])
    assert any(d["flag"] == "--topology-file" and d["value"] == fabric for d in r["defaults"])
    assert r["config"]["topology-file"] is None and "--topology-file" in r["config"]["defaults_applied"]


def test_summary_box_names_the_fabric_and_the_defaults() -> None:
    code, out, err = run(["run", *CARD, "--dp", "2", "--tp", "8", "--global-batch", "4"])
    assert code == 0, err
    assert "(dgx-h100-superpod)" in out
    assert "Megatron's defaults:" in out and "-micro-batch-size 1" in out and "--schedule 1f1b" in out


@pytest.mark.parametrize("chosen", [["--topology", "ring"], ["-ptp-bandwidth", "300"],
                                    ["--topology", "nvlink-cluster"]])
def test_a_topology_flag_keeps_the_users_network(chosen: list[str]) -> None:
    r = result([*CARD, "--dp", "2", "--tp", "8", "--global-batch", "2", *chosen])
    assert all(d["flag"] != "--topology-file" for d in r.get("defaults", []))
    assert r["config"]["topology-file"] is None and "--topology-file" not in r["config"].get("defaults_applied", {})


def test_a_gpu_without_a_standard_system_stays_on_the_ring_with_the_notice() -> None:
    code, out, err = run(["run", "--model", "llama3-8b", "--num-layers", "2", "--gpu", "l40s", "--dp", "16",
                          "--global-batch", "16", "-q"])
    assert code == 0, err
    assert "no topology given" in err


def test_fewer_gpus_than_a_node_run_on_part_of_one_node() -> None:
    r = result([*CARD, "--tp", "2", "--global-batch", "1"])
    assert {link["link"] for link in r["per_link"]} >= {"gpu0->nvsw0", "nvsw0->gpu1"}


def test_data_parallel_size_from_the_world_size() -> None:
    derived = result([*CARD, "-GPUnumber", "16", "--tp", "4", "--pp", "2", "--global-batch", "8"])
    explicit = result([*CARD, "--dp", "2", "--tp", "4", "--pp", "2", "--global-batch", "8"])
    assert derived["makespan_ms"] == explicit["makespan_ms"]
    assert any(d["flag"] == "--dp" and d["value"] == "2" for d in derived["defaults"])
    code, _, err = run(["run", *CARD, "-GPUnumber", "10", "--tp", "4", "--global-batch", "8"])
    assert code == 2 and err.count("\n") == 1
    assert "-GPUnumber 10 is not a multiple of --tp 4 × --pp 1 = 4" in err


def test_rerun_from_the_config_block_gives_the_same_bytes(tmp_path: Path) -> None:
    argv = [*CARD, "--dp", "2", "--pp", "2", "--global-batch", "8"]
    first = tmp_path / "first.json"
    code, _, err = run(["run", *argv, "--json", str(first)])
    assert code == 0, err
    second = tmp_path / "second.json"
    code, _, err = run(["run", "--config", str(first), "--json", str(second)])
    assert code == 0, err
    assert first.read_bytes() == second.read_bytes()


def test_summary_box_names_what_each_axis_overlaps() -> None:
    """Megatron-Core's overlaps are off unless switched on, which moves the answer as much as a
    degree does: the box says, per parallel axis of the run, what overlaps and what does not."""
    code, out, err = run(["run", *CARD, "--dp", "2", "--tp", "2", "--pp", "2", "--global-batch", "8",
                          "--sequence-parallel", "--zero", "1"])
    assert code == 0, err
    flat = " ".join(out.replace("│", " ").split())
    for words in ("gradient reduction after the backward (--overlap-grad-reduce off)",
                  "parameter all-gather after the optimizer (--overlap-param-gather off)",
                  "TP communication exposed (--tp-comm-overlap off)", "pipeline sends blocking (--pipeline-send auto)"):
        assert words in flat
    code, out, err = run(["run", *CARD, "--dp", "2", "--global-batch", "8", "--overlap-grad-reduce"])
    assert code == 0, err
    flat = " ".join(out.replace("│", " ").split())
    assert "Overlaps: gradient reduction per bucket during the backward" in flat and "pipeline sends" not in flat
