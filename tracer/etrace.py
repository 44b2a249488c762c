"""The PyTorch execution trace (ExecutionTraceObserver JSON) as a tree of operator nodes.

The execution trace records every operator call of the step with its parent (the op that called
it), its record-function id, sequence number, thread, schema and its arguments.  A tensor argument
is recorded as ``[tensor_id, storage_id, offset, numel, itemsize, device]``; ids are assigned per
tensor object (and storage) by the observer; an argument that is no tensor keeps its recorded
value when that is a JSON scalar (a fused attention call's ``is_causal``).  Two JSON layouts
exist and are both read here:

* schema 1.0.x (PyTorch 2.1): flat fields ``parent``, ``rf_id``, ``seq_id``, ``tid``, ``fw_tid``,
  ``op_schema``, ``inputs`` / ``input_shapes`` / ``input_types`` (same for outputs);
* schema 1.1.x (PyTorch >= 2.3, "chakra"): ``ctrl_deps`` for the parent, an ``attrs`` list holding
  ``rf_id``, ``seq_id``, ``tid``, ... and ``inputs`` / ``outputs`` as objects with ``values``,
  ``shapes``, ``types`` (and ``strides``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import TracerError
from .opschema import OpSchema, parse_schema

THREAD_NODE = "[pytorch|profiler|execution_trace|thread]"
PROCESS_NODE = "[pytorch|profiler|execution_trace|process]"


@dataclass(frozen=True)
class TensorRef:
    """One tensor as an ET argument: ids, size and where it lives."""

    id: int
    storage: int
    offset: int
    numel: int
    itemsize: int
    device: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Arg:
    """One argument (or return) of a node: its schema name and the tensors it holds (0, 1 or many);
    for an argument that is no tensor, its recorded value when that is a JSON scalar (``true``,
    ``0.0``, ``"<None>"``, ...), else None."""

    name: str
    tensors: tuple[TensorRef, ...]
    is_list: bool
    alias: str | None = None
    mutable: bool = False
    value: bool | int | float | str | None = None


@dataclass
class Node:
    """One operator call recorded by the execution-trace observer."""

    id: int
    name: str
    parent: int
    rf_id: int
    seq_id: int
    tid: int
    fw_tid: int
    op_schema: str
    inputs: list[Arg]
    outputs: list[Arg]
    schema: OpSchema | None = None
    children: list[int] = field(default_factory=list)

    def input_tensors(self) -> list[tuple[Arg, TensorRef]]:
        return [(a, t) for a in self.inputs for t in a.tensors]

    def output_tensors(self) -> list[tuple[Arg, TensorRef]]:
        return [(a, t) for a in self.outputs for t in a.tensors]

    def has_tensors(self) -> bool:
        return any(a.tensors for a in self.inputs) or any(a.tensors for a in self.outputs)

    def scalar(self, name: str) -> bool | int | float | str | None:
        """The recorded value of the scalar input argument the schema calls ``name`` (e.g.
        ``is_causal``), or None when the call has no such argument."""
        return next((a.value for a in self.inputs if a.name == name), None)


@dataclass
class ExecutionTrace:
    """All nodes of one execution trace, indexed by id, with children in call order."""

    path: str
    schema_version: str
    nodes: dict[int, Node]
    max_tensor_id: int

    def thread_roots(self) -> list[Node]:
        return sorted((n for n in self.nodes.values() if n.name == THREAD_NODE),
                      key=lambda n: (n.tid, n.id))

    def children(self, node: Node) -> list[Node]:
        return [self.nodes[c] for c in node.children]

    def subtree(self, node: Node) -> list[Node]:
        """The node and all its descendants in call (pre-)order."""
        out: list[Node] = []
        stack = [node]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(self.children(n)))
        return out


def _is_tensor_value(v: Any) -> bool:
    return (isinstance(v, list) and len(v) == 6 and all(isinstance(x, int) for x in v[:5])
            and isinstance(v[5], str))


def _tensor(v: list, shape: Any) -> TensorRef | None:
    tid, storage, offset, numel, itemsize, device = v
    if storage == 0 and numel == 0 and itemsize == 0 and not device:
        return None  # an undefined tensor (e.g. an absent optional gradient)
    shp = tuple(int(x) for x in shape) if isinstance(shape, list) and all(
        isinstance(x, int) for x in shape) else ()
    return TensorRef(id=tid, storage=storage, offset=offset, numel=numel, itemsize=itemsize,
                     device=device, shape=shp)


def _args(values: list, shapes: list, types: list, schema_args: tuple) -> list[Arg]:
    """Build Args; names come from the schema position by position (PyTorch 2.1 files may leave
    out trailing arguments), as long as the schema agrees that the argument is a tensor."""
    out: list[Arg] = []
    for i, value in enumerate(values):
        typ = types[i] if i < len(types) else ""
        shape = shapes[i] if i < len(shapes) else []
        sarg = schema_args[i] if i < len(schema_args) else None
        if sarg is not None and typ.startswith(("Tensor", "GenericList[Tensor")) \
                and not sarg.is_tensor:
            sarg = None
        name = sarg.name if sarg is not None and sarg.name else ""
        alias = sarg.alias if sarg is not None else None
        mutable = sarg.mutable if sarg is not None else False
        tensors: list[TensorRef] = []
        is_list = False
        scalar = None
        if typ.startswith("Tensor") and _is_tensor_value(value):
            t = _tensor(value, shape)
            if t is not None:
                tensors.append(t)
        elif typ.startswith("GenericList[") and isinstance(value, list) and "Tensor" in typ:
            is_list = True
            elem_shapes = shape if isinstance(shape, list) else []
            for j, ev in enumerate(value):
                if _is_tensor_value(ev):
                    t = _tensor(ev, elem_shapes[j] if j < len(elem_shapes) else [])
                    if t is not None:
                        tensors.append(t)
        elif isinstance(value, (bool, int, float, str)) and not (sarg is not None and sarg.is_tensor):
            scalar = value  # e.g. attention's is_causal, which the converter reports in meta.json
        out.append(Arg(name=name, tensors=tuple(tensors), is_list=is_list, alias=alias,
                       mutable=mutable, value=scalar))
    return out


def _field(raw: dict, key: str, where: str) -> Any:
    if key not in raw:
        raise TracerError(f"{where}: missing field '{key}'")
    return raw[key]


def _parse_node(raw: Any, where: str, schemas: dict[str, OpSchema | None]) -> Node:
    if not isinstance(raw, dict):
        raise TracerError(f"{where}: a node must be a JSON object")
    if "attrs" in raw:  # schema 1.1.x
        attrs = {a.get("name"): a.get("value") for a in raw["attrs"] if isinstance(a, dict)}
        parent = _field(raw, "ctrl_deps", where)
        ins = raw.get("inputs") or {}
        outs = raw.get("outputs") or {}
        in_vals, in_shapes, in_types = (ins.get("values", []), ins.get("shapes", []),
                                        ins.get("types", []))
        out_vals, out_shapes, out_types = (outs.get("values", []), outs.get("shapes", []),
                                           outs.get("types", []))
        get = attrs.get
    else:  # schema 1.0.x
        parent = _field(raw, "parent", where)
        in_vals, in_shapes, in_types = (_field(raw, "inputs", where), raw.get("input_shapes", []),
                                        _field(raw, "input_types", where))
        out_vals, out_shapes, out_types = (_field(raw, "outputs", where),
                                           raw.get("output_shapes", []),
                                           _field(raw, "output_types", where))
        get = raw.get
    try:
        node_id = int(_field(raw, "id", where))
        name = str(_field(raw, "name", where))
        schema_text = str(get("op_schema") or "")
        if schema_text not in schemas:  # many calls share a schema: parse each once
            schemas[schema_text] = parse_schema(schema_text)
        schema = schemas[schema_text]
        return Node(
            id=node_id,
            name=name,
            parent=int(parent),
            rf_id=int(get("rf_id") or 0),
            seq_id=int(get("seq_id") if get("seq_id") is not None else -1),
            tid=int(get("tid") or 0),
            fw_tid=int(get("fw_tid") or 0),
            op_schema=schema_text,
            inputs=_args(list(in_vals), list(in_shapes), list(in_types),
                         schema.args if schema else ()),
            outputs=_args(list(out_vals), list(out_shapes), list(out_types),
                          schema.returns if schema else ()),
            schema=schema,
        )
    except (TypeError, ValueError) as exc:
        raise TracerError(f"{where}: malformed node ({exc})") from None


def load_json(path: str | os.PathLike[str], what: str) -> Any:
    """Read a JSON file, turning every failure into a one-line TracerError naming the file."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise TracerError(f"{p}: {what} file not found") from None
    except IsADirectoryError:
        raise TracerError(f"{p}: is a directory, expected a {what} JSON file") from None
    except json.JSONDecodeError as exc:
        raise TracerError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno} column "
                          f"{exc.colno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TracerError(f"{p}: cannot read {what} file ({exc})") from None


def parse_execution_trace(data: Any, path: str = "<graph>") -> ExecutionTrace:
    """Build an ExecutionTrace from the decoded JSON of an execution-trace file."""
    if not isinstance(data, dict):
        raise TracerError(f"{path}: not an execution trace (expected a JSON object)")
    if "nodes" not in data:
        hint = " (this looks like a profiler trace; swap --graph and --profiler?)" \
            if "traceEvents" in data else ""
        raise TracerError(f"{path}: not an execution trace: missing field 'nodes'{hint}")
    raw_nodes = data["nodes"]
    if not isinstance(raw_nodes, list):
        raise TracerError(f"{path}: field 'nodes' must be a list")
    nodes: dict[int, Node] = {}
    schemas: dict[str, OpSchema | None] = {}
    for i, raw in enumerate(raw_nodes):
        node = _parse_node(raw, f"{path}: nodes[{i}]", schemas)
        nodes[node.id] = node
    if not nodes:
        raise TracerError(f"{path}: the execution trace has no nodes")
    # Children in call order: the record-function id grows with every call start.
    for node in sorted(nodes.values(), key=lambda n: (n.rf_id, n.id)):
        if node.parent != node.id and node.parent in nodes:
            nodes[node.parent].children.append(node.id)
    max_tid = 0
    for node in nodes.values():
        for a in node.inputs + node.outputs:
            for t in a.tensors:
                max_tid = max(max_tid, t.id, t.storage)
    return ExecutionTrace(path=path, schema_version=str(data.get("schema", "")), nodes=nodes,
                          max_tensor_id=max_tid)


def load_execution_trace(path: str | os.PathLike[str]) -> ExecutionTrace:
    """Read and parse an execution-trace JSON file."""
    return parse_execution_trace(load_json(path, "execution-trace"), os.fspath(path))
