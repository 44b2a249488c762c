"""triosim.config: flags, mappings and Python arguments → (Trace, Platform, Strategy)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from triosim.compute.scale import scale_trace
from triosim.config import FlagTable, configure, default_trace_dir, read_config_file, sim_namespace
from triosim.config.parallel_flags import resolve_gpus
from triosim.errors import ConfigError
from triosim.trace.load import load_trace

PACKAGE = Path(__file__).resolve().parents[1] / "triosim"


def test_python_arguments_match_the_flags(synthetic_dir: Path) -> None:
    trace, platform, strategy = configure(case=2, GPUnumber=4, trace_dir=str(synthetic_dir), bucket_mb="5")
    assert (strategy.case, platform.num_gpus, strategy.bucket_mb) == (2, 4, 5.0)
    assert trace.batch_size == 8 and trace.batch_source == "meta.json"


def test_unknown_or_bad_python_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown flag 'gpu_count' in configure"):
        configure(gpu_count=4)
    with pytest.raises(ConfigError, match="--gpus: 'x' is not an integer"):
        sim_namespace({"gpus": "x"})


def test_namespace_holds_every_flag_at_its_default() -> None:
    ns = sim_namespace({"case": 1})
    assert set(vars(ns)) == {s.dest for s in FlagTable.from_cli().specs}
    # -GPUnumber's default is "not given": 8, or dp × tp × pp for a hybrid run.
    assert ns.case == 1 and ns.gpus is None and resolve_gpus(ns) == 8 and ns.batch_size is None


def test_load_trace_reads_the_batch_from_meta_json() -> None:
    """The Python API and the CLI agree: the sample was recorded at batch 16, not 128."""
    trace = load_trace(default_trace_dir())
    assert trace.batch_size == 16 and trace.batch_source == "meta.json"
    via_flags, _, _ = configure(batch_size_sim=32)
    scaled = scale_trace(trace, 32)
    assert scaled.total_time_s == pytest.approx(via_flags.total_time_s, rel=1e-12)
    assert trace.time_source == "cpu"


def test_load_trace_without_meta_json_warns_what_it_assumes(synthetic_dir: Path) -> None:
    (synthetic_dir / "meta.json").unlink(missing_ok=True)
    with pytest.warns(UserWarning, match="assuming 128"):
        trace = load_trace(synthetic_dir)
    assert trace.batch_size == 128 and trace.batch_source == "assumed"
    assert load_trace(synthetic_dir, batch_size=8).batch_source == "argument"


def test_config_file_json_and_yaml(tmp_path: Path) -> None:
    j = tmp_path / "run.json"
    j.write_text(json.dumps({"case": 4, "GPUnumber": 2, "micro-batch-size": "default", "reference_compat": True}))
    assert read_config_file(j) == {"case": 4, "gpus": 2, "micro_batch_size": -1, "reference_compat": True}
    pytest.importorskip("yaml")
    y = tmp_path / "run.yaml"
    y.write_text("case: 1\ngpus: 4\nptp-bandwidth: 300\n")
    assert read_config_file(y) == {"case": 1, "gpus": 4, "ptp_bandwidth": 300.0}


@pytest.mark.parametrize("key", ["megatron-args", "json", "timeline", "quiet"])
def test_a_command_line_only_flag_in_a_config_file_is_named_as_such(tmp_path: Path, key: str) -> None:
    """`triosim run --help` lists these flags, so the error must not send the user there."""
    f = tmp_path / "c.json"
    f.write_text(json.dumps({key: "x"}))
    with pytest.raises(ConfigError) as info:
        read_config_file(f)
    assert f"--{key} is a command-line option" in str(info.value) and "run --help" not in str(info.value)


@pytest.mark.parametrize("text, message", [
    ('{"cases": 1}', "unknown flag 'cases' in --config"),
    ('{"gpus": [2, 4]}', "must be a single value"),
    ('[1, 2]', "expected a mapping"),
    ('{"gpus": ', "invalid JSON"),
])
def test_bad_config_files_name_the_file(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "bad.json"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        read_config_file(f)
    assert str(f) in str(info.value)


def _imports(path: Path, package_dir: Path = PACKAGE) -> set[str]:
    """Absolute names of the triosim modules ``path`` imports (at any depth of the file)."""
    module = "triosim." + ".".join(path.relative_to(package_dir).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(0, node.level - 1)):
                base = base.rsplit(".", 1)[0]
            name = (base + ("." + node.module if node.module else "")) if node.level else (node.module or "")
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {n for n in out if n.startswith("triosim")}


def sweep_imports_cli(package: Path = PACKAGE) -> list[str]:
    return sorted(str(p.relative_to(package)) for p in (package / "sweep").glob("*.py")
                  if any(n == "triosim.cli" or n.startswith("triosim.cli.") for n in _imports(p, package)))


def test_sweep_never_imports_the_cli() -> None:
    """The command line is a shell over config and sweep; nothing below it imports it back."""
    assert sweep_imports_cli() == []
    for path in (PACKAGE / "config").glob("*.py"):
        assert not any(n.startswith("triosim.cli") for n in _imports(path)), path


def test_import_check_catches_a_planted_cli_import(tmp_path: Path) -> None:
    planted = tmp_path / "triosim"
    (planted / "sweep").mkdir(parents=True)
    (planted / "sweep" / "execute.py").write_text("def f():\n    from ..cli import main\n")
    assert sweep_imports_cli(planted) == ["sweep/execute.py"]
