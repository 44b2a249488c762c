"""No parser accepts an abbreviated flag: ``triosim gpus --gpu h100`` used to read ``--gpu-file
h100`` and ``models --model X`` ``--model-file X``. A flag of another command is a one-line error
that says what the command does instead."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_capture import run
from triosim.sample_trace import trace_dir

from triosim.cli.console import build_parser

SAMPLE = trace_dir().parent / "gpt-cpu-bs8"


def parsers(parser: argparse.ArgumentParser, name: str = "triosim") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from parsers(sub, f"{name} {sub_name}")


ALL = list(parsers(build_parser()))


def test_every_command_is_checked() -> None:
    names = {n for n, _ in ALL}
    assert {"triosim", "triosim run", "triosim dag", "triosim sweep", "triosim plan", "triosim gpus", "triosim models",
            "triosim trace", "triosim trace collect", "triosim trace convert", "triosim trace repeat"} <= names


@pytest.mark.parametrize(("name", "parser"), ALL, ids=[n for n, _ in ALL])
def test_no_parser_takes_abbreviations(name: str, parser: argparse.ArgumentParser) -> None:
    assert parser.allow_abbrev is False, name



GPUS_HINT = ("; `triosim gpus` takes no --gpu: it lists every GPU with its peaks, memory and aliases (`triosim gpus "
             "--json`: every number and its source); --gpu NAME is a flag of run, dag, sweep and plan "
             "(see 'triosim gpus --help')\n")
MODELS_HINT = ("; `triosim models` takes no --model: it lists every model card with its shapes (`triosim models "
               "--json`: every field and its source); --model NAME is a flag of run, dag, sweep and plan "
               "(see 'triosim models --help')\n")
CASES = [
    ("gpus --gpu h100", ["gpus", "--gpu", "h100"], "triosim: error: unrecognized arguments: --gpu h100" + GPUS_HINT),
    ("gpus --gpu=h100", ["gpus", "--gpu=h100"], "triosim: error: unrecognized arguments: --gpu=h100" + GPUS_HINT),
    ("models --model", ["models", "--model", "llama3-8b"],
     "triosim: error: unrecognized arguments: --model llama3-8b" + MODELS_HINT),
    ("models --dp", ["models", "--dp", "2"], "triosim: error: unrecognized arguments: --dp 2; `triosim models` takes "
     "no --dp (a flag of run, dag, sweep and plan) (see 'triosim models --help')\n"),
    ("run --gpu-f", ["run", "--gpu-f", "{tmp}/gpu.yaml", "-q"],
     "triosim: error: unrecognized arguments: --gpu-f {tmp}/gpu.yaml; did you mean --gpu-file? "
     "(see 'triosim run --help')\n"),
    ("run --time", ["run", "--time", "span", "-q"], "triosim: error: unrecognized arguments: --time span "
     "(see 'triosim run --help')\n"),
    ("sweep --ou", ["sweep", "--gpus", "1", "--ou", "{tmp}/x.csv", "-q"],
     "triosim: error: unrecognized arguments: --ou {tmp}/x.csv; did you mean --out? (see 'triosim sweep --help')\n"),
    ("plan --glob", ["plan", "--gpus", "2", "--glob", "8", "-q"],
     "triosim: error: unrecognized arguments: --glob 8 (see 'triosim plan --help')\n"),
    ("trace repeat --lay", ["trace", "repeat", "--layers", "3", "--in", str(SAMPLE), "--ou", "{tmp}/r"],
     "triosim: error: the following arguments are required: --out (see 'triosim trace repeat --help')\n"),
]


@pytest.mark.parametrize(("argv", "message"), [(a, m) for _, a, m in CASES], ids=[n for n, _, _ in CASES])
def test_an_abbreviated_or_foreign_flag_is_one_helpful_line(argv: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "gpu.yaml").write_text((Path(__file__).resolve().parents[1] / "triosim" / "hardware" / "device_data" /
                                        "h100-sxm.yaml").read_text())
    code, out, err = run([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert (code, out) == (2, "")
    assert err == message.replace("{tmp}", str(tmp_path))
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "r").exists()


def test_the_standalone_tracer_takes_no_abbreviations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from triosim.tracer.cli import main as tracer_main

    with pytest.raises(SystemExit) as exit_:
        tracer_main(["repeat", "--layers", "3", "--in", str(SAMPLE), "--ou", str(tmp_path / "r")])
    assert exit_.value.code == 2 and "required: --out" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
