"""Numbers as the docs write them, and the values a run gives for them.

A number in a doc is a token such as ``813.97``, ``3,782.4``, ``−7.9`` (a minus sign or a
hyphen), ``+0.1`` or ``1.2e-15``. A fresh value is written the way the doc wrote the old one:
the same decimals, thousands separators when the doc used them, the same sign style, so a doc
value's precision is the precision it claims. ``value_of`` reads a value out of a run: its
stdout as one number (``out``), the first group of a regular expression over its output
(```` `Iteration time: ([\\d.]+)` ````), or a path into its JSON stdout
(``throughput.samples_per_s``, ``per_gpu.0.peak_memory_bytes``, ``[name=llama2-7b].parameters``)
with an optional ``*F`` or ``/F`` scale (``mfu*100``, ``makespan_ms/1000``), or arithmetic over such
paths after ``=`` (``=(a.x + a.y) / 1e9``).
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass

MINUS = "\u2212"
# A number token: not glued to a word or a dot before it (``gpt96``, ``v1.2``), nor to a word after.
NUMBER = re.compile(r"(?<![\w.])([-+\u2212]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?:[eE]([-+]?\d+))?(?![\w])")


class ClaimError(ValueError):
    """A claim that cannot be checked as written (bad syntax, a key its run does not have)."""


@dataclass(frozen=True)
class DocNumber:
    """A number as written in a doc: its text and what it says about formatting."""

    text: str

    @property
    def match(self) -> re.Match:
        found = NUMBER.fullmatch(self.text)
        if not found:
            raise ClaimError(f"{self.text!r} is not a number as the docs write them")
        return found

    @property
    def value(self) -> float:
        sign, whole, frac, exp = self.match.groups()
        number = float(whole.replace(",", "") + ("." + frac if frac else "") + ("e" + exp if exp else ""))
        return -number if sign in ("-", MINUS) else number

    @property
    def decimals(self) -> int:
        return len(self.match.group(3) or "")

    def format(self, value: float, cap: int | None = None) -> str:
        """``value`` written as this number is written (with at most ``cap`` decimals)."""
        sign, whole, frac, exp = self.match.groups()
        if not math.isfinite(value):
            return repr(value)
        decimals = self.decimals if cap is None else min(cap, self.decimals)
        if exp is not None:
            body = f"{abs(value):.{decimals}e}"
        else:
            commas = "," in whole or (abs(self.value) < 1000 and self.decimals <= 2)
            body = f"{abs(value):,.{decimals}f}" if commas else f"{abs(value):.{decimals}f}"
        negative = value < 0 and float(body.replace(",", "")) != 0
        if negative:
            return (MINUS if sign == MINUS else "-") + body
        return ("+" if sign == "+" else "") + body

    def agrees(self, value: float, cap: int | None = None) -> bool:
        """Whether ``value``, written as this number is, reads as this number; ``cap``: the run
        gives only that many decimals (``makespan_ms~9``), so compare at that precision."""
        if cap is not None and cap < self.decimals and self.match.group(4) is None:
            return DocNumber(self.format(value, cap)).value == round(self.value, cap)
        return DocNumber(self.format(value)).value == self.value


def split_precision(key: str) -> tuple[str, int | None]:
    """``makespan_ms~9`` -> ("makespan_ms", 9): the run gives 9 decimals of the value."""
    found = re.fullmatch(r"(.*?)~(\d+)", key.strip(), re.S)
    return (found.group(1), int(found.group(2))) if found else (key.strip(), None)


def number_tokens(text: str) -> list[re.Match]:
    return list(NUMBER.finditer(text))


def split_items(body: str) -> list[str]:
    """``a; b; c`` split at semicolons outside backquoted regular expressions."""
    items, current, quoted = [], "", False
    for ch in body:
        if ch == "`":
            quoted = not quoted
        if ch == ";" and not quoted:
            items.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        items.append(current.strip())
    return items


def split_key_value(item: str) -> tuple[str, str]:
    """``KEY VALUE`` (or a lone ``VALUE``: key ``out``) of a value claim."""
    item = item.strip()
    if item.startswith("`"):
        end = item.find("`", 1)
        if end < 0:
            raise ClaimError(f"unclosed regular expression in {item!r}")
        return item[: end + 1], item[end + 1 :].strip()
    parts = item.rsplit(None, 1)
    return ("out", parts[0]) if len(parts) == 1 else (parts[0], parts[1])


PATH_PART = re.compile(r"\[([\w-]+)=([^\]]+)\]|[^.\[\]]+")
SCALE = re.compile(r"^(.*?)\s*([*/])\s*([0-9.eE+-]+)$")


EXPRESSION_PATH = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.\w+|\[[\w-]+=[^\]]+\])*")


def value_of(key: str, output: str) -> float:
    """The value ``key`` names in a run's output (stdout, with stderr after it)."""
    key = key.strip()
    if key.startswith("="):
        return _expression(key[1:], output)
    if key.startswith("`") and key.endswith("`"):
        found = re.search(key[1:-1], output, re.M)
        if not found:
            raise ClaimError(f"{key} matches nothing in the output")
        return _number(found.group(1) if found.groups() else found.group(0), key)
    factor = 1.0
    scale = SCALE.match(key)
    if scale:
        key, amount = scale.group(1), float(scale.group(3))
        factor = amount if scale.group(2) == "*" else 1.0 / amount
    if key == "out":
        return _number(output.strip(), "out") * factor
    try:
        node = json.loads(output)
    except json.JSONDecodeError as exc:
        raise ClaimError(f"key {key!r} needs JSON on stdout (--json -): {exc}") from None
    for part in PATH_PART.finditer(key):
        node = _step(node, part, key)
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise ClaimError(f"{key!r} is {node!r}, not a number")
    return float(node) * factor


def _expression(text: str, output: str) -> float:
    """``=(a.b - c) / c * 100``: arithmetic (+ - * / and brackets) over JSON paths of the output."""
    names: dict[str, float] = {}

    def name(match: re.Match) -> str:
        names[f"v{len(names)}"] = value_of(match.group(0), output)
        return f"v{len(names) - 1}"

    tree = ast.parse(EXPRESSION_PATH.sub(name, text), mode="eval")
    return float(_evaluate(tree.body, names, text))


def _evaluate(node, names: dict[str, float], text: str) -> float:
    operators = {ast.Add: float.__add__, ast.Sub: float.__sub__, ast.Mult: float.__mul__, ast.Div: float.__truediv__}
    if isinstance(node, ast.BinOp) and type(node.op) in operators:
        return operators[type(node.op)](float(_evaluate(node.left, names, text)), float(_evaluate(node.right, names, text)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, names, text)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    raise ClaimError(f"={text}: only numbers, JSON paths, + - * / and brackets")


def _step(node, part: re.Match, key: str):
    if part.group(1):
        field, wanted = part.group(1), part.group(2)
        for item in node if isinstance(node, list) else []:
            if isinstance(item, dict) and str(item.get(field)) == wanted:
                return item
        raise ClaimError(f"{key!r}: no item with {field} = {wanted}")
    name = part.group(0)
    if isinstance(node, list) and name.lstrip("-").isdigit() and -len(node) <= int(name) < len(node):
        return node[int(name)]
    if isinstance(node, dict) and name in node:
        return node[name]
    raise ClaimError(f"{key!r}: no {name!r} in the output")


def _number(text: str, key: str) -> float:
    try:
        return float(text.replace(",", "").replace(MINUS, "-"))
    except ValueError:
        raise ClaimError(f"{key}: {text[:80]!r} is not a number") from None
