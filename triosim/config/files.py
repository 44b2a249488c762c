"""``--config`` files (JSON or YAML, or a ``--json`` result's ``config`` block) and the block that
records a run: every flag's value, the triosim version and the trace files' sha256."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .flags import FlagTable
from .gpu import GPU_FLAG_DEFAULTS
from .trace_dirs import trace_dir_from_flag


def read_config_file(path: str | Path, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``--config`` file: a mapping flag name → value, JSON (``.json``) or YAML (otherwise).

    A whole ``--json`` result is accepted too: its ``config`` block is used. Keys that describe
    the run but are no flag (``triosim_version``, ``trace_sha256``, …) go into ``facts`` when
    given (``check_config_facts`` compares them with this run), else they are ignored.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--config {p}: cannot read ({exc.strerror})") from None
    data = parse_mapping_text(text, p, "--config")
    if "config" in data and isinstance(data["config"], dict) and "makespan_ms" in data:
        data = data["config"]
    out: dict[str, Any] = {}
    table = FlagTable.from_cli()
    for name, value in data.items():
        if str(name) in INFO_KEYS:
            if facts is not None:
                facts[str(name)] = value
            continue
        spec = table.lookup(str(name), f"--config {p}")
        if isinstance(value, (list, dict)):
            raise ConfigError(f"--config {p}: {name!r} must be a single value (sweep lists belong in --grid)")
        try:
            out[spec.dest] = spec.parse(value)
        except ConfigError as exc:
            raise ConfigError(f"--config {p}: {exc}") from None
    return out


def parse_mapping_text(text: str, path: Path, flag: str) -> dict[str, Any]:
    """JSON when the name ends in ``.json``, YAML otherwise (PyYAML is needed only then)."""
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{flag} {path}: invalid JSON ({exc})") from None
    else:
        try:
            import yaml
        except ImportError:
            raise ConfigError(
                f"{flag} {path}: reading YAML needs PyYAML (pip install 'triosim[yaml]'), or use a .json file"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{flag} {path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{flag} {path}: expected a mapping of flag names to values")
    return data


# Keys of a result's ``config`` block that record facts about the run rather than set a flag.
INFO_KEYS = frozenset({"triosim_version", "trace_sha256", "tensor_sha256"})


def file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def config_block(args: argparse.Namespace) -> dict[str, Any]:
    """Everything needed to run this simulation again: every simulation flag by its key (the
    trace directory made absolute), the triosim version and the sha256 of both trace files.

    ``--config`` accepts the block back (or the whole ``--json`` result holding it).
    """
    from ..version import __version__

    table = FlagTable.from_cli()
    trace_dir = trace_dir_from_flag(args.trace_dir)
    block: dict[str, Any] = {}
    for spec in table.specs:
        value = getattr(args, spec.dest, spec.default)
        if spec.dest in GPU_FLAG_DEFAULTS and value == GPU_FLAG_DEFAULTS[spec.dest]:
            continue  # a run without the GPU flags records the block it always did
        if spec.dest == "trace_dir":
            value = str(trace_dir.resolve())
        block[spec.name] = value
    block["triosim_version"] = __version__
    block["trace_sha256"] = file_sha256(trace_dir / "trace.csv")
    block["tensor_sha256"] = file_sha256(trace_dir / "tensor.csv")
    return block


def check_config_facts(facts: dict[str, Any], block: dict[str, Any]) -> list[str]:
    """Warnings when a run from a result's ``config`` block cannot reproduce that result: the
    trace files or the triosim version differ from what the block recorded."""
    warnings = []
    for key, what in (("trace_sha256", "trace.csv"), ("tensor_sha256", "tensor.csv")):
        if key in facts and facts[key] != block.get(key):
            warnings.append(f"{what} differs from the one the configuration was recorded with "
                            f"(sha256 {str(facts[key])[:12]}… then, {str(block.get(key))[:12]}… now)")
    if "triosim_version" in facts and facts["triosim_version"] != block.get("triosim_version"):
        warnings.append(f"the configuration was recorded with triosim {facts['triosim_version']}, "
                        f"this is {block.get('triosim_version')}")
    return warnings
