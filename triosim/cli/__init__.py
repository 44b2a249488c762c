"""The ``triosim`` command line: argument parsing and the subcommands over the configuration."""

from __future__ import annotations

from .console import build_parser, console_main, main

__all__ = ["build_parser", "console_main", "main"]
