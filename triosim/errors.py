"""Errors the user can fix: bad input files, bad flags, impossible memory capacity.

The CLI turns each into one line on stderr and exit code 2; everything else is a bug.
"""

from __future__ import annotations


class TriosimError(Exception):
    """A problem with the user's input, reported as one line without a traceback."""


class TraceError(TriosimError):
    """A trace file is missing or malformed; the message names file, row and field."""

    def __init__(self, file: str, message: str, row: int | None = None, field: str | None = None):
        where = file if row is None else f"{file}:{row}"
        what = message if field is None else f"{field}: {message}"
        super().__init__(f"{where}: {what}")
        self.message = message  # without the place: for a caller that names the input itself
        self.file = file
        self.row = row
        self.field = field


class ConfigError(TriosimError):
    """A flag or combination of flags that makes no sense."""


class OutOfMemoryError(TriosimError):
    """One operator's inputs and outputs alone exceed a GPU's capacity."""
