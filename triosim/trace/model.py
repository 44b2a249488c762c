"""What a trace is made of: the Tensor and Op records, the CSV columns, and the cell syntax.

A trace directory holds TrioSim's ``trace.csv`` (one row per operator, in execution order) and
``tensor.csv`` (one row per operator/tensor-argument occurrence). This module names their
columns, the stages and tensor categories, and parses the cells every reader shares (ID lists,
size lists, shapes, categories). It imports nothing else of :mod:`triosim.trace`: every other
module of the package builds on it.
"""

from __future__ import annotations

import difflib
import re
from typing import NamedTuple

from ..checks import MAX_BYTES
from ..checks import whole_number as _whole_number

TRACE_COLUMNS = (
    "OperatorID",
    "OperatorName",
    "Operator_input",
    "Operator_output",
    "Operator_cudatime",
    "Operator_cudatimenooverlap",
    "InputSize",
    "OutputSize",
    "gpuid",
    "stage",
    "tpflag",
)
TENSOR_COLUMNS = (
    "Index",
    "TensorID",
    "TensorShape",
    "TensorNumElement",
    "TensorEachByte",
    "TensorType",
    "TensorStorgeid",
    "gpuid",
)
STAGES = ("forward", "backward", "optimizer")
PARAMETER_CATEGORIES = frozenset({"weight", "bias"})

# Higher wins when one tensor ID appears with several categories: a tensor that is ever a
# weight or bias is a parameter, whatever else it is called elsewhere.
CATEGORY_RANK = {
    "weight": 5,
    "bias": 5,
    "running_mean": 4,
    "running_var": 4,
    "mean": 4,
    "grad": 3,
    "grad_output": 3,
    "input": 1,
    "self": 1,
    "output": 1,
    "other": 1,
    "": 0,
}


# Tensor and Op are named tuples: a 200k-op trace has half a million tensors, and a tuple is
# built several times faster than a dataclass instance (in bulk, by ``tuple.__new__`` in C).
# They are read-only; ``obj._replace(field=value)`` makes a changed copy.


class Tensor(NamedTuple):
    """One tensor of the trace (all tensor.csv rows of one ID merged)."""

    id: str
    bytes: int
    numel: int
    each_byte: int
    category: str
    storage: str
    shape: tuple[int, ...] | None


class Op(NamedTuple):
    """One operator row of trace.csv."""

    index: int
    op_id: int
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    duration_s: float
    span_s: float
    stage: str
    tpflag: bool
    line: int


# ----------------------------------------------------------------------------- parsing helpers


def parse_id_list(text: str) -> tuple[str, ...]:
    """Parse the original's list syntax, ``[4; 6; 8]`` or ``[]`` (quotes and spaces ignored)."""
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ValueError(f"expected a list like [4; 6], got {text!r}")
    body = body[1:-1].replace(" ", "")
    if not body:
        return ()
    items = tuple(tok.strip("'\"") for tok in body.split(";"))
    if any(not tok for tok in items):
        raise ValueError(f"empty element in list {text!r}")
    return items


def parse_int_list(text: str) -> tuple[int, ...]:
    """Parse a list of sizes, ``[4; 6]``: whole numbers >= 0 (``1.5``, ``inf``, ``nan`` are errors)."""
    items = parse_id_list(text)
    values = []
    for tok in items:
        value = _whole_number(tok)
        if value is None:
            raise ValueError(f"not a whole number: {tok!r} in {text!r}")
        if value < 0:
            raise ValueError(f"negative size in {text!r}")
        if value >= MAX_BYTES:
            raise ValueError(f"size {tok} too large in {text!r} (limit {MAX_BYTES:,})")
        values.append(value)
    return tuple(values)


def parse_shape(text: str) -> tuple[int, ...] | None:
    body = text.strip().strip("[]").replace(" ", "")
    if not body:
        return ()
    try:
        return tuple(int(tok) for tok in body.replace(";", ",").split(",") if tok)
    except ValueError:
        return None


def normalize_category(raw: str) -> str:
    """Schema argument name without default: ``bias=None`` -> ``bias``."""
    return raw.split("=", 1)[0].strip().lower()


# TensorType is the name of the operator argument the tensor was passed as (PyTorch's schema
# names: input, weight, mat2, query, save_mean, reservespace, …; the shipped traces hold 25 of
# them), optionally with its default (``bias=None``). Any such name is accepted: a new model
# brings new argument names. Two kinds are refused: what is not a name at all (``12``,
# ``[4]``, ``we ight``), and a near miss of a parameter category (``wieght``, ``bais``): a
# parameter read as an activation would silently leave the data-parallel all-reduce.
_TENSOR_TYPE = re.compile(r"^[a-z_][a-z0-9_]*$")
# Real argument names close to a parameter category, accepted as they are.
_NEAR_PARAMETER_NAMES = frozenset({"weights", "biases", "bias_k", "bias_v", "weight_g", "weight_v"})


def tensor_type_problem(raw: str) -> str | None:
    """Why a TensorType cell is refused (see above), or None when it is fine; "" is allowed (unknown)."""
    category = normalize_category(raw)
    if category == "":
        return None
    if not _TENSOR_TYPE.match(category):
        return f"not an argument name: {raw!r}"
    if category in CATEGORY_RANK or category in _NEAR_PARAMETER_NAMES:
        return None
    close = difflib.get_close_matches(category, sorted(PARAMETER_CATEGORIES), n=1, cutoff=0.75)
    if close:
        return f"unknown type {raw!r}; did you mean {close[0]}? (a parameter typed otherwise is not all-reduced)"
    return None


# Operator_cudatimenooverlap (kernel busy time) cannot exceed Operator_cudatime (first kernel
# start to last end). The tracers round both to 0.001 µs, so equal times may differ by one unit.
BUSY_SLACK_US = 0.0015


# The csv module's default field limit; a longer cell is a broken file, not a tensor list.
FIELD_LIMIT = 128 * 1024


__all__ = ["BUSY_SLACK_US", "CATEGORY_RANK", "FIELD_LIMIT", "PARAMETER_CATEGORIES", "STAGES", "TENSOR_COLUMNS", "TRACE_COLUMNS", "Op",
           "Tensor", "normalize_category", "parse_id_list", "parse_int_list", "parse_shape", "tensor_type_problem"]
