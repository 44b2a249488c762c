"""The command-line parser's error behaviour: one line on stderr, exit code 2, a suggestion.

argparse's own ``error`` prints the whole usage (17 lines for ``triosim run``) before the
message; a user who typed one flag wrong needs the message and, for a mistyped flag, the
closest real one ("did you mean -GPUnumber?").
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterator
from typing import NoReturn

_UNRECOGNIZED = "unrecognized arguments: "


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``triosim: error: …`` and exit code 2.

    Sub-parsers made with ``add_subparsers`` are of the same class, so every command
    (run, dag, sweep, trace …) behaves alike. A sub-command's parser may set ``absent_flags``
    (flag → what to say instead) for a flag users give it that belongs to another command.
    """

    def __init__(self, *args, **kwargs) -> None:
        # No abbreviations: `gpus --gpu h100` must not silently mean `--gpu-file h100`, nor
        # `--time` one flag today and an error once another flag starts alike.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # normalized flag -> the spelling the user typed (the CLI accepts -flag for --flag)
        self.typed: dict[str, str] = {}
        self.command = ""  # the sub-command being parsed, when the top parser knows it

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())  # argparse messages never need more than one line
        hint = self._suggestion(message)
        if message.startswith(_UNRECOGNIZED):  # echo the flags as the user typed them
            message = _UNRECOGNIZED + " ".join(self.typed.get(t, t) for t in message[len(_UNRECOGNIZED):].split())
        # "triosim run" -> "run": say which command's --help (the top parser reports leftovers)
        where = self.prog.split()[1:] or ([self.command] if self.command else [])
        help_cmd = " ".join(["triosim", *where, "--help"])
        text = f"triosim: error: {message}{hint} (see '{help_cmd}')"
        self.exit(2, text + "\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)

    def _suggestion(self, message: str) -> str:
        if not message.startswith(_UNRECOGNIZED):
            return ""
        first = message[len(_UNRECOGNIZED):].split()[0]
        if not first.startswith("-"):
            return ""
        flag = first.split("=", 1)[0]
        subs = self._subcommands()
        own = subs.get(self.command, self)  # suggest the flags of the command typed, not another's
        hint = getattr(own, "absent_flags", {}).get(flag)
        if hint:
            return f"; {hint}"
        best = closest_option(flag, list(own._all_options()))
        if best is None or best == flag:
            others = [name for name, sub in subs.items() if sub is not own and flag in sub._option_string_actions]
            if not others:
                return ""
            return f"; `triosim {self.command}` takes no {flag} (a flag of {_listed(others)})"
        # Show it with the dashes the user typed: -GPUNumber -> -GPUnumber.
        typed_single = bool(re.match(r"^-[^-]", self.typed.get(flag, flag)))
        shown = "-" + best.lstrip("-") if typed_single else best
        return f"; did you mean {shown}?"

    def _subcommands(self) -> dict[str, argparse.ArgumentParser]:
        """The sub-command parsers by name ({} for a parser without sub-commands)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    def _all_options(self) -> Iterator[str]:
        for action in self._actions:
            yield from (o for o in action.option_strings if o.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    if isinstance(sub, OneLineParser):
                        yield from sub._all_options()


def add_config_flag(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` (run, dag, plan): its values become the parser's defaults
    (:func:`triosim.cli.console.config_file_arg`)."""
    p.add_argument("--config", metavar="FILE",
                   help="YAML/JSON file of flag values (keys spelled like the flags, or a --json result's "
                        "config block); flags given on the command line win")


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def closest_option(flag: str, options: list[str]) -> str | None:
    """The option ``flag`` was most likely meant to be (case-insensitive first, then by spelling)."""
    for opt in options:
        if opt.lower() == flag.lower():
            return opt
    # Compare without the dashes: every option shares them, which would make "--bogus" look
    # like "--gpus".
    lowered = {o.lower().lstrip("-"): o for o in reversed(options)}
    match = difflib.get_close_matches(flag.lower().lstrip("-"), list(lowered), n=1, cutoff=0.7)
    return lowered[match[0]] if match else None


def typed_spelling(original: list[str], normalized: list[str]) -> dict[str, str]:
    """How each normalized ``--flag`` was typed (``-flag``), for :attr:`OneLineParser.typed`."""
    return {b.split("=", 1)[0]: a.split("=", 1)[0] for a, b in zip(original, normalized) if a != b}
