"""One place that decides whether a number from the user is usable.

Flags, trace CSV cells and ``meta.json`` fields all go through these helpers, so every number
is checked the same way: finite (NaN and infinity never mean "unlimited"), inside its range,
and a whole number where a count, a size or an ID is meant. A flag problem is a
:class:`ConfigError` naming the flag; a file problem is a :class:`TraceError` naming file, row
and column. Comparisons are written as ``not x > 0`` rather than ``x <= 0`` because every
comparison with NaN is false.
"""

from __future__ import annotations

import math
from numbers import Real

from .errors import ConfigError, TraceError

# A tensor (or a trace's total) above 2^53 bytes (8 PiB) is no real model, and keeping sizes
# below it keeps every byte count exact as a float and far from int64 overflow when summed.
MAX_BYTES = 2**53
# Counts and IDs: anything that fits an int64 with room to add a few of them.
MAX_COUNT = 2**62
# One operator longer than about a year (in µs) is a unit mistake, and summing a few thousand
# of them must stay finite.
MAX_TIME_US = 3.2e13


def _fmt(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def flag_number(
    value: float | int | None,
    flag: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    integer: bool = False,
    allow_none: bool = False,
    unit: str = "",
) -> float | int | None:
    """Return ``value`` if it is a finite number in range, else raise ConfigError naming ``flag``.

    ``low_open`` makes the lower bound strict (``> low``); ``integer`` requires a whole number.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigError(f"{flag} must be a number, got {_fmt(value)}")
    u = f" {unit}" if unit else ""
    if not math.isfinite(value):
        raise ConfigError(f"{flag} must be a finite number, got {value}")
    if integer and value != int(value):
        raise ConfigError(f"{flag} must be a whole number, got {value}")
    if low is not None and not (value > low if low_open else value >= low):
        raise ConfigError(f"{flag} must be {'>' if low_open else '>='} {_plain(low)}{u}, got {value}")
    if high is not None and not value <= high:
        raise ConfigError(f"{flag} must be <= {_plain(high)}{u}, got {value}")
    return value


def positive(value: float | int, flag: str, unit: str = "") -> float | int:
    """A finite number > 0 (bandwidths, bucket sizes, timeouts)."""
    return flag_number(value, flag, low=0, low_open=True, unit=unit)


def non_negative(value: float | int, flag: str) -> float | int:
    """A finite number >= 0 (latencies)."""
    return flag_number(value, flag, low=0)


def _plain(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else str(x)


# ----------------------------------------------------------------------------- file fields


def cell_int(text: str, file: str, row: int | None, column: str, *, minimum: int = 0,
             maximum: int = MAX_COUNT) -> int:
    """A whole number written in a file cell: ``12``, ``12.0`` and ``1.2e1`` are 12; ``1.5``,
    ``inf``, ``nan`` and ``abc`` are errors naming file, row and column."""
    value = whole_number(text)
    if value is None:
        kind = "a whole number" if _is_float(text) else "a number"
        raise TraceError(file, f"not {kind}: {text!r}", row=row, field=column)
    if value < minimum:
        raise TraceError(file, f"must be >= {minimum}, got {text}", row=row, field=column)
    if value >= maximum:
        raise TraceError(file, f"too large: {text} (limit {maximum:,})", row=row, field=column)
    return value


def whole_number(text: str) -> int | None:
    s = text.strip()
    try:
        return int(s)
    except ValueError:
        pass
    try:
        x = float(s)
    except ValueError:
        return None
    if not math.isfinite(x) or not x.is_integer():
        return None
    return int(x)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def cell_time_us(text: str, file: str, row: int | None, column: str) -> float:
    """A duration in µs written in a file cell: finite, >= 0, below :data:`MAX_TIME_US`."""
    try:
        value = float(text)
    except ValueError:
        raise TraceError(file, f"unparsable time {text!r}", row=row, field=column) from None
    if not (value >= 0.0 and value < MAX_TIME_US):
        raise TraceError(file, f"time must be a finite number >= 0 (µs), got {text}", row=row, field=column)
    return value


def json_int(value: object, file: str, key: str, *, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """A whole number stored in a JSON file (``meta.json``'s ``batch_size``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(file, f"must be a whole number, got {_json_repr(value)}", field=key)
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise TraceError(file, f"must be a whole number, got {_json_repr(value)}", field=key)
    n = int(value)
    if n < minimum:
        raise TraceError(file, f"must be >= {minimum}, got {n}", field=key)
    if n >= maximum:
        raise TraceError(file, f"too large: {n} (limit {maximum:,})", field=key)
    return n


def _json_repr(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)
