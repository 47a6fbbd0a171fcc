"""The import graph of mcsim: no module imports, directly or through others, a module that imports it back.

Every ``import mcsim...`` and ``from mcsim... import ...`` counts, at module level or inside a function, except
imports under ``if TYPE_CHECKING:`` (annotations only, never run). ``from package import name`` counts as an
import of the submodule ``package.name`` when there is one, else of the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    out = {}
    for folder, prefix in ((ROOT / "mcsim", ("mcsim",)), (ROOT / "kernels", ("mcsim", "kernels"))):
        for path in folder.rglob("*.py"):
            parts = prefix + path.relative_to(folder).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, modules) -> set[str]:
    found = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in modules else node.module)
        stack.extend(ast.iter_child_nodes(node))
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(ast.parse(path.read_text()), modules) - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_packages():
    graph = import_graph()
    assert {"mcsim.cli", "mcsim.scenario.loading", "mcsim.kernels.batching"} <= set(graph)
    assert "mcsim.scenario.grid" in graph["mcsim.scenario.loading"]  # a lazy import inside a function
    assert "mcsim.accelerate" in graph["mcsim.kernels.batching"]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_kernels_import_only_accelerate():
    graph = import_graph()
    for name, imported in graph.items():
        if name.startswith("mcsim.kernels"):
            # a kernel module may share inline pieces with another kernel module, nothing of the orchestration
            assert {m for m in imported if not m.startswith("mcsim.kernels.")} <= {"mcsim.accelerate"}, name
