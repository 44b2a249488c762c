"""The tracer's user-facing error: a bad input file, field or option, reported in one line."""

from __future__ import annotations

from triosim.errors import TriosimError


class TracerError(TriosimError):
    """Bad tracer input (missing file, malformed JSON, unknown model); the CLI exits with 2."""
