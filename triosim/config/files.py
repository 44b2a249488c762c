"""``--config`` files (JSON or YAML, or a ``--json`` result's ``config`` block) and the block that
records a run: every flag's value, the triosim version and the trace files' sha256."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..safe_yaml import MAX_YAML_BYTES, MAX_YAML_DEPTH, parse_yaml_text, read_text_file
from .defaults import applied_defaults
from .flags import FlagTable
from .gpu import GPU_FLAG_DEFAULTS, GpuOptions
from .model_flags import MODEL_FLAG_DEFAULTS, model_given, model_trace
from .precision import PRECISION_FLAG_DEFAULTS
from .trace_dirs import check_path_length, trace_dir_from_flag


def read_config_file(path: str | Path, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``--config`` file: a mapping flag name → value, JSON (``.json``) or YAML (otherwise).

    A whole ``--json`` result is accepted too: its ``config`` block is used. Keys that describe
    the run but are no flag (``triosim_version``, ``trace_sha256``, …) go into ``facts`` when
    given (``check_config_facts`` compares them with this run), else they are ignored. Two
    spellings of one flag (``gpus`` and ``GPUnumber``) are an error naming both keys.
    """
    p = Path(path)
    data = read_settings_mapping(p, "--config", "config file")
    if "config" in data and isinstance(data["config"], dict) and "makespan_ms" in data:
        data = data["config"]
    out: dict[str, Any] = {}
    keys: dict[str, str] = {}  # flag dest -> the key that set it
    table = FlagTable.from_cli()
    for name, value in data.items():
        if str(name) in INFO_KEYS:
            if facts is not None:
                facts[str(name)] = value
            continue
        spec = table.lookup(str(name), f"--config {p}")
        if spec.dest in keys:
            raise ConfigError(f"--config {p}: keys {keys[spec.dest]!r} and {str(name)!r} both set --{spec.name}; "
                              "keep one")
        keys[spec.dest] = str(name)
        if isinstance(value, (list, dict)):
            raise ConfigError(f"--config {p}: {name!r} must be a single value (sweep lists belong in --grid)")
        try:
            out[spec.dest] = spec.parse(value)
            if spec.dest in PATH_FLAGS and isinstance(out[spec.dest], str):
                check_path_length(out[spec.dest], f"--{spec.name}")
        except ConfigError as exc:
            raise ConfigError(f"--config {p}: {exc}") from None
    return out


# Flags whose value is a file or directory name (checked for names no file system can hold).
PATH_FLAGS = frozenset({"trace_dir", "topology_file", "gpu_file"})


def read_settings_mapping(path: Path, flag: str, what: str) -> dict[str, Any]:
    """A ``--config`` or ``--grid`` file as a mapping, read within :mod:`triosim.safe_yaml`'s
    limits (1 MiB of UTF-8, 32 levels of nesting, 100,000 values with aliases expanded, each key
    once); every problem is one line starting with ``flag path``."""
    try:
        text = read_text_file(path, what)
    except ConfigError as exc:
        raise ConfigError(f"{flag} {exc}") from None
    return parse_mapping_text(text, path, flag)


def parse_mapping_text(text: str, path: Path, flag: str) -> dict[str, Any]:
    """JSON when the name ends in ``.json`` (read as JSON, with the YAML loader's limits on
    nesting and repeated keys), YAML otherwise (:func:`triosim.safe_yaml.parse_yaml_text`)."""
    where = f"{flag} {path}"
    if path.suffix.lower() == ".json":
        data = _parse_json(text, where)
    else:
        data = parse_yaml_text(text, where)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of flag names to values")
    return data


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"key {key[:200]!r} given twice in one mapping")
        out[key] = value
    return out


def _parse_json(text: str, where: str) -> Any:
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{where}: larger than the limit of {MAX_YAML_BYTES:,} bytes for a settings file")
    try:
        data = json.loads(text, object_pairs_hook=_unique_pairs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested more than {MAX_YAML_DEPTH} levels deep, above the limit for a "
                          "settings file") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: invalid JSON ({' '.join(str(exc).split())[:200]})") from None
    # The nesting, walked without recursion (json itself nests ~1,000 deep before it gives up).
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(f"{where}: nested more than {MAX_YAML_DEPTH} levels deep, above the limit for "
                                  "a settings file")
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return data


# Keys of a result's ``config`` block that record facts about the run rather than set a flag.
INFO_KEYS = frozenset({"triosim_version", "trace_sha256", "tensor_sha256", "defaults_applied"})


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
    card_run = model_given(args)  # the trace is the card's, rebuilt from the card by a rerun
    trace_dir = model_trace(args, GpuOptions.of(args).dtype).trace_dir if card_run else trace_dir_from_flag(args.trace_dir)
    block: dict[str, Any] = {}
    for spec in table.specs:
        value = getattr(args, spec.dest, spec.default)
        if (spec.dest in GPU_FLAG_DEFAULTS and value == GPU_FLAG_DEFAULTS[spec.dest]) or \
                (spec.dest in PRECISION_FLAG_DEFAULTS and value == PRECISION_FLAG_DEFAULTS[spec.dest]) or \
                (spec.dest in MODEL_FLAG_DEFAULTS and value is None):
            continue  # a run without the GPU, precision or card flags records the block it always did
        if spec.dest == "model_file":
            value = str(Path(value).resolve())
        if spec.dest == "trace_dir":
            value = None if card_run else str(trace_dir.resolve())
        block[spec.name] = value
    applied = applied_defaults(args)
    for d in applied:  # the flag as given: a rerun derives the same default
        block[table.by_dest(d.dest).name] = d.given
    if applied:  # what the run filled in, and why
        block["defaults_applied"] = {d.flag: f"{d.value}: {d.why}" for d in applied}
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
