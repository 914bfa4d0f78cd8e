"""No two modules of src/souq import each other, directly or round a loop (issue 34's bar):
every import counts, those made for types only (``if TYPE_CHECKING:``) and those inside a
function too, as a reader follows them. A package's ``__init__`` only hands names on, so an
import of a name from a package counts as an import of the module of that name when there is
one, and is not followed into the package's face otherwise."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _module_of(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    files = {_module_of(p): p for p in (SRC / "souq").rglob("*.py")}
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        if module in packages:
            continue
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for name in names:
                if name in files and name not in packages and name != module:
                    out.add(name)
        graph[module] = out
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_its_way_back_to_itself() -> None:
    assert _circles(_imports()) == []


def test_a_circle_is_found() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
