"""The package's layers, read from its source with ``ast``: no import circle between modules, no
import from a lower layer to a higher one, no module over the size limit, no builder looked up
through importlib. Each check is shown to catch a planted violation."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "triosim"

# In the order data flows; a module may import its own layer (no circle) and the layers above it.
LAYERS = (
    ("base", ("errors", "checks", "limits", "output", "safe_yaml", "shipped_files", "version")),
    ("trace", ("trace",)),
    ("hardware", ("hardware",)),
    ("compute", ("compute",)),
    # The task-DAG engine (TaskGraph, list scheduler, flows) knows no parallelism; the builders
    # use it to time pipeline-partition candidates, so it sits below them.
    ("schedule", ("schedule",)),
    ("graph", ("graph",)),
    ("report", ("report",)),
    ("simulation", ("simulation",)),
    ("config", ("config",)),
    ("sweep", ("sweep",)),
    ("plan", ("plan",)),  # the planner: a shell over the simulation and the sweep executor
    ("cli", ("cli",)),
    ("api", ("",)),  # triosim/__init__.py: the public API over everything
)
MAX_LINES = 550


def modules(package_dir: Path) -> dict[str, Path]:
    """Dotted name (``triosim.schedule.tasks``) -> file, packages by their ``__init__.py``."""
    out = {}
    for f in sorted(package_dir.rglob("*.py")):
        parts = list(f.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package_dir.name, *parts])] = f
    return out


def _targets(name: str, path: Path, node: ast.AST, known: dict[str, Path]) -> list[str]:
    """The package modules an import statement names (the longest known prefix of each)."""
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + (node.module.split(".") if node.module else []))
        else:
            module = node.module or ""
        wanted = [f"{module}.{a.name}" for a in node.names] + [module]
    out = []
    for w in wanted:
        parts = w.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        if parts:
            out.append(".".join(parts))
    return out


def import_graph(package_dir: Path) -> nx.DiGraph:
    """Module -> module edges of every import in the package, at any depth of a file (an import
    inside a function is still a dependency), except those under ``if TYPE_CHECKING:``."""
    known = modules(package_dir)
    g = nx.DiGraph()
    g.add_nodes_from(known)
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(n) for block in ast.walk(tree)
                       if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in typing_only:
                for target in _targets(name, path, node, known):
                    # A package's own __init__ is imported on the way to any of its modules.
                    if target != name and not name.startswith(target + "."):
                        g.add_edge(name, target)
    return g


def layer_of(module: str, root: str = "triosim") -> int:
    rest = module[len(root) + 1:] if module.startswith(root + ".") else ""
    head = rest.split(".")[0]
    for rank, (_, tops) in enumerate(LAYERS):
        if head in tops:
            return rank
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS (and docs/architecture.md)")


def circles(g: nx.DiGraph) -> list[list[str]]:
    return sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)


def upward_imports(g: nx.DiGraph, root: str = "triosim") -> list[str]:
    return sorted(f"{a} -> {b}" for a, b in g.edges if layer_of(a, root) < layer_of(b, root))


def long_modules(package_dir: Path, limit: int = MAX_LINES) -> list[str]:
    return sorted(f"{name} ({n} lines)" for name, path in modules(package_dir).items()
                  if (n := path.read_text(encoding="utf-8").count("\n")) > limit)


def importlib_lookups(package_dir: Path) -> list[str]:
    return sorted(name for name, path in modules(package_dir).items()
                  if "import_module(" in path.read_text(encoding="utf-8"))


def test_no_import_circles() -> None:
    assert circles(import_graph(PACKAGE)) == []


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    assert upward_imports(import_graph(PACKAGE)) == []


def test_no_module_over_the_size_limit() -> None:
    assert long_modules(PACKAGE) == []


def test_no_builder_looked_up_through_importlib() -> None:
    assert importlib_lookups(PACKAGE) == []


def _planted(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "triosim"
    for rel, text in {"__init__.py": "", **files}.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text, encoding="utf-8")
    return root


def test_a_planted_circle_is_caught(tmp_path: Path) -> None:
    root = _planted(tmp_path, {
        "trace/__init__.py": "",
        "trace/model.py": "from .reader import read\n",
        # the way back hides inside a function: still a circle
        "trace/reader.py": "def read():\n    from .model import Trace\n",
    })
    assert circles(import_graph(root)) == [["triosim.trace.model", "triosim.trace.reader"]]


def test_a_typing_only_import_is_no_circle(tmp_path: Path) -> None:
    root = _planted(tmp_path, {
        "trace/__init__.py": "",
        "trace/model.py": "from .reader import read\n",
        "trace/reader.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .model import Trace\n",
    })
    assert circles(import_graph(root)) == []


def test_a_planted_upward_import_is_caught(tmp_path: Path) -> None:
    root = _planted(tmp_path, {
        "trace/__init__.py": "",
        "trace/model.py": "from ..graph.tasks import TaskGraph\n",
        "graph/__init__.py": "",
        "graph/tasks.py": "",
    })
    g = import_graph(root)
    assert circles(g) == []
    assert upward_imports(g) == ["triosim.trace.model -> triosim.graph.tasks"]


def test_a_planted_long_module_and_importlib_lookup_are_caught(tmp_path: Path) -> None:
    root = _planted(tmp_path, {
        "graph/__init__.py": "import importlib\nbuild = importlib.import_module('triosim.graph.x')\n",
        "graph/long.py": "x = 1\n" * (MAX_LINES + 1),
    })
    assert long_modules(root) == [f"triosim.graph.long ({MAX_LINES + 1} lines)"]
    assert importlib_lookups(root) == ["triosim.graph"]


def test_a_module_outside_every_layer_is_named(tmp_path: Path) -> None:
    root = _planted(tmp_path, {"misc.py": "from .errors import X\n", "errors.py": ""})
    with pytest.raises(AssertionError, match="triosim.misc is in no layer"):
        upward_imports(import_graph(root))
