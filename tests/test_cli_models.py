"""``triosim models`` and card runs (``run --model``/``--model-file``/``--seq-len``): the table,
the default dtype, the cache of built traces (keyed by the card's content, written atomically)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_capture import run

from triosim.trace.model_card import packaged_dir, shipped_cards


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("TRIOSIM_CACHE_DIR", str(root))
    return root / "model-traces"


def test_models_lists_every_card_with_its_parameters() -> None:
    code, out, err = run(["models"])
    assert code == 0, err
    for name, card in shipped_cards().items():
        assert name in out and f"{card.parameter_count() / 1e9:,.2f}" in out
    code, out, _ = run(["models", "--json"])
    records = {r["name"]: r for r in json.loads(out)}
    assert records["gpt3-175b"]["parameters"] == shipped_cards()["gpt3-175b"].parameter_count()
    assert records["llama3-8b"]["kv_heads"] == 8


def test_models_checks_a_card_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("layers: 2\n")
    code, _, err = run(["models", "--model-file", str(bad)])
    assert code == 2 and err.count("\n") == 1 and "missing key 'hidden'" in err
    good = tmp_path / "mine.yaml"
    good.write_text((packaged_dir() / "gpt-neo-1.3b.yaml").read_text())
    code, out, _ = run(["models", "--model-file", str(good)])
    assert code == 0 and "a valid model card" in out


def _result(argv: list[str], tmp_path: Path) -> dict:
    path = tmp_path / "r.json"
    code, _, err = run(["run", *argv, "--json", str(path), "-q"])
    assert code == 0, err
    return json.loads(path.read_text())


def test_card_run_defaults_to_bf16_and_caches_its_trace(cache: Path, tmp_path: Path) -> None:
    argv = ["--model", "gpt-neo-1.3b", "--gpu", "h100-sxm"]
    first = _result(argv, tmp_path)
    assert first["gpu"]["dtype"] == "bf16" and first["gpu"]["op_time_source"] == "roofline"
    assert first["config"]["trace-dir"] is None and first["config"]["model"] == "gpt-neo-1.3b"
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) == 1 and entries[0].startswith("gpt-neo-1.3b-")
    again = _result(argv, tmp_path)
    assert again["makespan_ms"] == first["makespan_ms"]
    assert sorted(p.name for p in cache.iterdir()) == entries  # reused, no partial directory left
    fp32 = _result([*argv, "--dtype", "fp32"], tmp_path)
    assert fp32["makespan_ms"] > 2 * first["makespan_ms"]  # fp32 math and twice the bytes
    assert len(list(cache.iterdir())) == 2


def test_the_cache_is_keyed_by_the_card_content(cache: Path, tmp_path: Path) -> None:
    text = (packaged_dir() / "gpt-neo-1.3b.yaml").read_text()
    same = tmp_path / "same.yaml"
    same.write_text(text.replace('description: "', 'description: "a copy of '))
    other = tmp_path / "other.yaml"
    other.write_text(text.replace("ffn: 8192", "ffn: 4096"))
    a = _result(["--model", "gpt-neo-1.3b", "--gpu", "h100-sxm"], tmp_path)
    b = _result(["--model-file", str(same), "--gpu", "h100-sxm"], tmp_path)
    assert a["makespan_ms"] == b["makespan_ms"] and len(list(cache.iterdir())) == 1
    c = _result(["--model-file", str(other), "--gpu", "h100-sxm"], tmp_path)
    assert c["makespan_ms"] < a["makespan_ms"] and len(list(cache.iterdir())) == 2


def test_seq_len_micro_batch_and_depth(cache: Path, tmp_path: Path) -> None:
    base = _result(["--model", "llama3-8b", "--gpu", "h100-sxm"], tmp_path)
    short = _result(["--model", "llama3-8b", "--gpu", "h100-sxm", "--seq-len", "2048"], tmp_path)
    assert short["makespan_ms"] < base["makespan_ms"] / 3
    half = _result(["--model", "llama3-8b", "--gpu", "h100-sxm", "--num-layers", "16"], tmp_path)
    assert half["makespan_ms"] < 0.6 * base["makespan_ms"]
    pp = _result(["--model", "llama3-8b", "--gpu", "h100-sxm", "--pp", "2", "-batch-size-sim", "4",
                  "-micro-batch-size", "2"], tmp_path)
    assert pp["batch_size"] == 2 and pp["batch_size_sim"] == 4


def test_v100_card_run_defaults_to_fp16(cache: Path, tmp_path: Path) -> None:
    r = _result(["--model", "gpt-neo-1.3b", "--gpu", "v100-32gb"], tmp_path)
    assert r["gpu"]["dtype"] == "fp16"


def test_unwritable_cache_is_one_line(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"  # a cache "directory" that is a file: unwritable even for root
    blocker.write_text("x")
    monkeypatch.setenv("TRIOSIM_CACHE_DIR", str(blocker))
    code, _, err = run(["run", "--model", "gpt-neo-1.3b", "--gpu", "h100-sxm", "-q"])
    assert code == 2 and err.count("\n") == 1 and "set TRIOSIM_CACHE_DIR" in err, err


def test_a_failed_build_leaves_no_entry(cache: Path, monkeypatch) -> None:
    """The cache is written atomically: a build that fails half-way (disk full) leaves nothing
    a later run could read, and the next run builds the entry whole."""
    import triosim.config.model_flags as mf

    real = mf.write_card_trace

    def disk_full(directory, spec):
        Path(directory, "trace.csv").write_text("OperatorID\n")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mf, "write_card_trace", disk_full)
    code, _, err = run(["run", "--model", "gpt-neo-1.3b", "--gpu", "h100-sxm", "-q"])
    assert code == 2 and err.count("\n") == 1 and "No space left on device" in err, err
    assert list(cache.iterdir()) == []
    monkeypatch.setattr(mf, "write_card_trace", real)
    code, out, err = run(["run", "--model", "gpt-neo-1.3b", "--gpu", "h100-sxm", "-q"])
    assert code == 0 and float(out) > 0, err
    assert [p.name.startswith("gpt-neo-1.3b-") for p in cache.iterdir()] == [True]


def test_config_block_of_a_trace_run_is_unchanged_and_a_card_run_reruns(cache: Path, tmp_path: Path) -> None:
    from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

    trace = write_synthetic_trace(tmp_path / "t", SyntheticModel(layers=2, batch_size=4))
    block = _result(["-trace-dir", str(trace)], tmp_path)["config"]
    assert not {"model", "model-file", "seq-len"} & set(block)
    card = tmp_path / "mine.yaml"
    card.write_text((packaged_dir() / "gpt-neo-1.3b.yaml").read_text())
    first = _result(["--model-file", str(card), "--gpu", "h100-sxm", "--seq-len", "512"], tmp_path)
    assert first["config"]["model-file"] == str(card.resolve()) and first["config"]["seq-len"] == 512
    (tmp_path / "again.json").write_text(json.dumps(first))
    again = _result(["--config", str(tmp_path / "again.json")], tmp_path)
    assert again["makespan_ms"] == first["makespan_ms"]
