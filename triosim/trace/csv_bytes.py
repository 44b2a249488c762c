"""The fastest path of trace loading: plain trace CSVs split into cells on their bytes.

A 200k-op trace is 50 MB of CSV. pandas' C parser is quick, but importing pandas alone takes
half a second, and every cell it reads becomes a Python string. A *plain* file needs no CSV
parser: numpy finds every delimiter in a few passes over the bytes (the commas inside quotes
set aside) and checks that each line has the header's number of cells; a column is then
gathered in one step, checked with bytes methods (C loops over the whole column), and its whole
numbers and ID lists parsed by numpy in C, never cell by cell. Only text columns become strings.

Plain means: ASCII; no control character but the line ends (all ``\n`` or all ``\r\n``); no
space at a cell's edge; double quotes only around a whole cell (holding no line end); every line
with the header's number of cells; tensor IDs written as plain decimal integers. Any other file
is declined (:class:`Declined`) and read by the pandas path or the row-by-row checker, which give
the same result; for a plain file this path returns exactly what the checker returns (tested on
mutated traces).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Whole numbers of at most this many digits fit an int64 (and are below every limit on counts).
MAX_DIGITS = 18
# Sizes in a size list: at most 15 digits, below the byte limit of 2^53.
MAX_SIZE_DIGITS = 15

_NEWLINE, _RETURN, _QUOTE, _COMMA, _SPACE, _SEMICOLON, _OPEN = 10, 13, 34, 44, 32, 59, 91
_DIGITS_AS_D = bytes.maketrans(b"0123456789", b"dddddddddd")
_NONZERO_AS_D = bytes.maketrans(b"123456789", b"ddddddddd")


def _leading_zero(text: bytes) -> bool:
    """Some number in ``text`` (numbers after ``[`` or ``;``) is written with a leading zero."""
    marked = text.translate(_NONZERO_AS_D)
    return any(p in marked for p in (b"[0d", b"[00", b";0d", b";00"))


class Declined(Exception):
    """The file is not plain: another reader decides."""


@dataclass(frozen=True)
class Fields:
    """A plain CSV file split into cells: data row ``r``'s cell of column ``j`` is
    ``buf[start:end]``, with ``(start, end)`` from :meth:`bounds`; data row ``r`` is on line ``r + 2``."""

    buf: np.ndarray  # the file's bytes (ending with a line end)
    header: list[str]
    delimiters: np.ndarray  # (lines, columns): the comma or line end after each cell
    quoted: bool  # some cell is in double quotes
    line_end: int  # bytes of a line end: 1 ("\n") or 2 ("\r\n")

    @property
    def rows(self) -> int:
        return len(self.delimiters) - 1

    def bounds(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of each data row's cell of ``column``, its quotes excluded."""
        j = self.header.index(column)
        d = self.delimiters
        ends = d[1:, j]
        starts = d[:-1, -1] + self.line_end if j == 0 else d[1:, j - 1] + 1
        if self.quoted:
            quoted = self.buf[starts] == _QUOTE
            if quoted.any():
                starts, ends = starts + quoted, ends - quoted
        return starts, ends

    def joined(self, column: str, separator: bytes = b"\n") -> bytes:
        """The column's cells one after another, each followed by ``separator``; a cell with a
        space at an edge declines (the checker strips it)."""
        starts, ends = self.bounds(column)
        lengths = ends - starts
        step = lengths + 1
        offsets = np.cumsum(step) - step
        index = np.arange(int(offsets[-1] + step[-1]), dtype=np.int64)
        index -= np.repeat(offsets - starts, step)
        out = self.buf[index]
        out[offsets + lengths] = separator[0]
        text = out.tobytes()
        if edge_spaces(text, separator):
            raise Declined
        return text

    def texts(self, column: str) -> list[str]:
        """The column's cells."""
        return self.joined(column)[:-1].decode("ascii").split("\n")

    def _digit_cells(self, column: str) -> bytes:
        """The column's cells, each followed by ``;``, when each is 1 to ``MAX_DIGITS`` digits."""
        joined = self.joined(column, b";")
        if joined.translate(None, b"0123456789;") or b";;" in joined or joined.startswith(b";"):
            raise Declined
        if b"d" * (MAX_DIGITS + 1) in joined.translate(_DIGITS_AS_D):
            raise Declined
        return joined

    def whole_numbers(self, column: str) -> np.ndarray:
        """The column's cells as int64: each a plain decimal (what Python's ``int()`` reads to
        the same value); anything else declines."""
        return _parse_digits(self._digit_cells(column), self.rows)

    def plain_ids(self, column: str) -> tuple[list[str], np.ndarray]:
        """The column's cells as strings and as int64, when each is a plain decimal integer
        written without leading zeros (so that equal numbers are equal strings)."""
        joined = self._digit_cells(column)
        if _leading_zero(b";" + joined):
            raise Declined
        return joined[:-1].decode("ascii").split(";"), _parse_digits(joined, self.rows)


def edge_spaces(cells: bytes, separator: bytes = b"\n") -> bool:
    """Some cell of ``cells`` (each followed by ``separator``) starts or ends with a space."""
    return b" " + separator in cells or separator + b" " in cells or cells.startswith(b" ")


def _parse_digits(text: bytes, count: int) -> np.ndarray:
    """``count`` whole numbers from ``text``: digits, each number followed by one ``;``."""
    # numpy's text parser, in C; every character has been checked, so it reads each number whole.
    values = np.fromstring(text, dtype=np.int64, sep=";") if count else np.zeros(0, dtype=np.int64)
    if len(values) != count:
        raise Declined
    return values


def split_fields(data: bytes, columns: tuple[str, ...], field_limit: int) -> Fields:
    """Split a plain CSV file with ``columns`` (and perhaps others) into cells (see the module's
    docstring), or decline."""
    crlf = b"\r" in data
    if not data.endswith(b"\n"):
        data += b"\r\n" if crlf else b"\n"
    if not data.isascii():
        raise Declined
    lines = data.count(b"\n")
    if crlf and data.count(b"\r\n") != lines:
        raise Declined
    buf = np.frombuffer(data, dtype=np.uint8)
    if np.count_nonzero(buf < _SPACE) != lines * (1 + crlf):
        raise Declined  # a control character: NUL, tab, a carriage return alone, …
    head = data[:data.index(b"\n")].decode("ascii")
    if '"' in head or "'" in head:
        raise Declined
    header = [c.strip() for c in head.split(",")]
    if lines < 2 or len(set(header)) != len(header) or not set(columns) <= set(header):
        raise Declined
    # A line's last cell ends at its line end (at the "\r" of a "\r\n").
    line_end = _RETURN if crlf else _NEWLINE
    is_delimiter = buf == _COMMA
    is_delimiter |= buf == line_end
    delimiters = np.flatnonzero(is_delimiter)
    quotes = np.flatnonzero(buf == _QUOTE)
    if len(quotes):
        delimiters = _outside_quotes(buf, quotes, delimiters, is_delimiter)
    width = len(header)
    if len(delimiters) != lines * width:
        raise Declined
    grid = delimiters.reshape(lines, width)
    # Every line end is a row's last delimiter: each line has the header's number of cells, and
    # no quoted cell spans a line end.
    if not (buf[grid[:, -1]] == line_end).all():
        raise Declined
    if int(np.diff(delimiters).max(initial=0)) > field_limit or int(delimiters[0]) > field_limit:
        raise Declined  # a cell over the limit: the checker reports it
    return Fields(buf, header, grid, True if len(quotes) else False, 1 + crlf)


def _outside_quotes(buf: np.ndarray, quotes: np.ndarray, delimiters: np.ndarray,
                    is_delimiter: np.ndarray) -> np.ndarray:
    """The delimiters outside quotes, when the quotes pair up around whole cells (else declines)."""
    opening, closing = quotes[0::2], quotes[1::2]
    if len(quotes) % 2:
        raise Declined
    before = buf[opening - 1]
    if not (((before == _COMMA) | (before == _NEWLINE)).all() and is_delimiter[closing + 1].all()):
        raise Declined  # a quote inside a cell, or text beside a quoted cell
    # The delimiters from the first after an opening quote to the first after its closing quote
    # (not included) are inside: mark where such runs begin and end, then add up.
    edge = np.zeros(len(delimiters) + 1, dtype=np.int8)
    edge[np.searchsorted(delimiters, opening)] = 1
    edge[np.searchsorted(delimiters, closing)] -= 1
    return delimiters[np.cumsum(edge[:-1], dtype=np.int8) == 0]


@dataclass(frozen=True)
class NumberLists:
    """A column of bracketed lists of whole numbers (``[4; 6; 8]``, ``[]``): every number in
    order, how many each cell holds, and whether any is written with a leading zero."""

    values: np.ndarray
    counts: np.ndarray
    leading_zero: bool

    @property
    def bounds(self) -> np.ndarray:
        """Cell ``i``'s numbers are ``values[bounds[i]:bounds[i + 1]]``."""
        return np.concatenate(([0], np.cumsum(self.counts)))


_LIST_BYTES = b"0123456789;[]\n"
_CLOSE_AS_SEPARATOR = bytes.maketrans(b"]", b";")  # "[4;6]" -> "4;6;" (with "[" and line ends deleted)


def number_lists(fields: Fields, column: str, max_digits: int, parse: bool = True) -> NumberLists | None:
    """The column read as the checker reads a list (spaces removed, ``;`` between elements),
    when every element is a plain decimal of at most ``max_digits`` digits; else declines.
    ``parse`` False: only check the column (and return None)."""
    text = fields.joined(column).replace(b" ", b"")  # the checker drops every space inside the brackets
    n = fields.rows
    # Passes over the bytes (each a C loop over the column) check the form: "[]" or "[4;6]" a cell.
    if text.translate(None, _LIST_BYTES):
        raise Declined
    if not (text.count(b"[") == text.count(b"]") == text.count(b"]\n") == n and text.count(b"\n[") == n - 1
            and text.startswith(b"[")):
        raise Declined  # one bracketed list a cell, no other bracket
    if b"[;" in text or b";;" in text or b";]" in text:
        raise Declined  # an empty element
    if b"d" * (max_digits + 1) in text.translate(_DIGITS_AS_D):
        raise Declined  # a number too long
    if not parse:
        return None
    # A cell holds one number more than its semicolons, unless it is "[]".
    buf = np.frombuffer(text, dtype=np.uint8)
    ends = np.flatnonzero(buf == _NEWLINE)
    semicolons = np.diff(np.searchsorted(np.flatnonzero(buf == _SEMICOLON), ends), prepend=0)
    counts = semicolons + (buf[ends - 2] != _OPEN)
    numbers = text.replace(b"[]\n", b"").translate(_CLOSE_AS_SEPARATOR, b"[\n")
    return NumberLists(_parse_digits(numbers, int(counts.sum())), counts, _leading_zero(text))


__all__ = ["Declined", "Fields", "NumberLists", "number_lists", "split_fields"]
