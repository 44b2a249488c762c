"""PyTorch operator schemas as the execution trace records them.

An ET node carries its schema string, e.g.
``aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)``.  The tracer
needs three facts from it: the name of each argument (it becomes the tensor's category, with
``self`` written as ``input`` like the original tracer did), whether an argument is a tensor or a
tensor list, and the alias annotations that say an output is a view of an input (``Tensor(a)``)
rather than a new tensor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ALIAS = re.compile(r"Tensor\((\w+)(!?)(?:\s*->\s*\*)?\)")  # Tensor(a), Tensor(a!), Tensor(a -> *)


@dataclass(frozen=True)
class SchemaArg:
    """One argument or return value of an operator schema."""

    name: str  # argument name; "self" is reported as "input", unnamed returns as ""
    type: str  # e.g. "Tensor(a!)", "Tensor?", "Tensor[]", "int[2]"
    alias: str | None  # alias set letter from Tensor(a) / Tensor(a!), else None
    mutable: bool  # True for Tensor(a!): the op writes this argument in place

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("Tensor")


@dataclass(frozen=True)
class OpSchema:
    """Parsed arguments and returns of one operator schema."""

    args: tuple[SchemaArg, ...]
    returns: tuple[SchemaArg, ...]

    def returns_view(self) -> bool:
        """True when every tensor return aliases an input without writing it (view ops)."""
        tensor_returns = [r for r in self.returns if r.is_tensor]
        if not tensor_returns:
            return False
        in_aliases = {a.alias for a in self.args if a.alias and not a.mutable}
        return all(r.alias is not None and not r.mutable and r.alias in in_aliases
                   for r in tensor_returns)


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets or parentheses."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    tail = "".join(cur).strip()
    if tail:
        parts.append(tail)
    return parts


def _matching_paren(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _parse_arg(text: str) -> SchemaArg | None:
    text = text.strip()
    if not text or text == "*":
        return None
    decl = text.split("=", 1)[0].strip()
    # The type may contain spaces only inside brackets/parentheses, so the name is the last token.
    depth = 0
    split_at = -1
    for i, ch in enumerate(decl):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == " " and depth == 0:
            split_at = i
    if split_at < 0:
        typ, name = decl, ""
    else:
        typ, name = decl[:split_at].strip(), decl[split_at + 1:].strip()
    if name == "self":
        name = "input"
    m = _ALIAS.match(typ)
    alias = m.group(1) if m else None
    mutable = bool(m and m.group(2))
    return SchemaArg(name=name, type=typ, alias=alias, mutable=mutable)


def parse_schema(schema: str) -> OpSchema | None:
    """Parse an operator schema string; None when it is empty or not understood."""
    schema = (schema or "").strip()
    open_at = schema.find("(")
    if open_at <= 0:
        return None
    close_at = _matching_paren(schema, open_at)
    if close_at < 0:
        return None
    args = tuple(a for a in (_parse_arg(p) for p in _split_top(schema[open_at + 1:close_at]))
                 if a is not None)
    rest = schema[close_at + 1:].strip()
    returns: tuple[SchemaArg, ...] = ()
    if rest.startswith("->"):
        ret = rest[2:].strip()
        if ret.startswith("(") and ret.endswith(")"):
            ret = ret[1:-1]
        returns = tuple(r for r in (_parse_arg(p) for p in _split_top(ret)) if r is not None)
    return OpSchema(args=args, returns=returns)
