"""The import graph of mcsim: packages import downward only, and no module imports, directly or through others, a
module that imports it back.

The layers, lowest first. A module may import modules of its own layer (without a cycle) and of any layer below,
never one above:

0. ``mcsim`` (the package itself: ``__version__`` and the Python API, loaded by name on first use),
   ``mcsim.errors``, ``mcsim.text``, ``mcsim.fileio``, ``mcsim.accelerate`` (Numba's options), ``mcsim.tables``
   (text tables), ``mcsim.data`` (the package data): utilities that import no other layer;
1. ``mcsim.scenario``: the schema, the choice lists it offers (``choices``), distributions, the catalog, loading,
   sweep grids, the calibration file format;
2. ``mcsim.kernels`` (which import only ``mcsim.accelerate``), ``mcsim.stages`` (stages 1-4 and economics),
   ``mcsim.reference`` (the kernels' pure-Python references);
3. ``mcsim.perf``: stage 5, the performance model and the batching simulators;
4. ``mcsim.results``: the variable registry, the result Dataset and its NetCDF, summaries, reports, figures;
5. ``mcsim.execution``: one sample, the Dask fan-out that builds and writes result Datasets, the Python API;
6. ``mcsim.calibration``, ``mcsim.optimize``, ``mcsim.optrace``, ``mcsim.bench``, ``mcsim.validate``: the engines
   of ``mcsim calibrate``, ``search``, ``trace``, ``bench`` and ``validate``;
7. ``mcsim.listing`` (what ``mcsim list`` prints), ``mcsim.cli``, ``mcsim.__main__``: the command line.

Every ``import mcsim...`` and ``from mcsim... import ...`` counts for the layers, wherever it is: at module level,
inside a function, under ``if TYPE_CHECKING:``. ``from package import name`` counts as an import of the submodule
``package.name`` when there is one, else of the package. The cycle check leaves out imports under
``if TYPE_CHECKING:`` (annotations only, never run).

An import inside a function is kept only where start-up time needs it (``mcsim --help`` imports no NumPy,
xarray, Numba or Dask), with a comment on the line above saying why.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

from tests.helpers import python_prints

ROOT = Path(__file__).resolve().parents[1]

LAYERS = (
    ("mcsim", "mcsim.errors", "mcsim.text", "mcsim.fileio", "mcsim.accelerate", "mcsim.tables", "mcsim.data"),
    ("mcsim.scenario",),
    ("mcsim.kernels", "mcsim.stages", "mcsim.reference"),
    ("mcsim.perf",),
    ("mcsim.results",),
    ("mcsim.execution",),
    ("mcsim.calibration", "mcsim.optimize", "mcsim.optrace", "mcsim.bench", "mcsim.validate"),
    ("mcsim.listing", "mcsim.cli", "mcsim.__main__"),
)

#: Upward imports in modules whose owners are still moving them (module, imported module). Empty it as they go.
TODO_UPWARD: set = set()

#: Modules whose imports inside functions are not yet each justified (their owners are rewriting them).
TODO_DEFERRED: tuple = ()
#: The most imports inside functions the other modules may keep.
# one per command of the command line (capacity the latest), the few in the executor, truncnorm, scipy.special, the
# timed imports of the two benchmarks that measure what a fresh process pays (compile_time, small_run, whose
# first cached kernel times Numba's runtime apart), and the command line's own compile-up-front and lean-xarray steps
MAX_DEFERRED = 30

#: Choice lists a performance module still defines as a copy of mcsim.scenario.choices' (it should import them).
TODO_CHOICE_COPIES: dict = {}


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


def _import_nodes(tree: ast.AST, type_checking: bool):
    """Every Import / ImportFrom node of ``tree``, at any depth; under ``if TYPE_CHECKING:`` only with
    ``type_checking``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _imports(tree: ast.AST, modules, name: str = "", type_checking: bool = False) -> set[str]:
    """The mcsim modules ``tree`` (the module ``name``) imports."""
    found = set()
    for node in _import_nodes(tree, type_checking):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
            continue
        base = node.module
        if node.level:  # relative: from the module's own package
            package = name.split(".") if _is_package(name, modules) else name.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        if not base:
            continue
        for a in node.names:
            sub = f"{base}.{a.name}"
            found.add(sub if sub in modules else base)
    return {m for m in found if m in modules}


def _is_package(name: str, modules) -> bool:
    return modules.get(name, Path()).name == "__init__.py"


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.AST:
    """A module's syntax tree, parsed once for the tests that read it (none changes it)."""
    return ast.parse(path.read_text())


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(_tree(path), modules, name, type_checking) - {name} for name, path in modules.items()}


def layer_of(module: str) -> int | None:
    """Index in :data:`LAYERS` of the longest prefix that names ``module`` or a package above it."""
    best, length = None, -1
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = i, len(prefix)
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, imported module) for every import into a higher layer, sorted."""
    return sorted((a, b) for a, imported in graph.items() for b in imported if layer_of(b) > layer_of(a))


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


def deferred_imports(tree: ast.AST, lines: list[str]) -> list[tuple[int, bool]]:
    """(line, says why) of every import inside a function: why is a comment on the line above the import or
    above the run of import lines it ends."""
    out = []

    def visit(node, inside):
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, (ast.Import, ast.ImportFrom)):
                above = child.lineno - 2
                while above >= 0 and lines[above].lstrip().startswith(("import ", "from ")):
                    above -= 1
                out.append((child.lineno, above >= 0 and lines[above].lstrip().startswith("#")))
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return out


# -- the checker itself --------------------------------------------------------------------------------------------


def test_the_graph_sees_the_packages():
    graph = import_graph()
    assert {"mcsim.cli", "mcsim.scenario.loading", "mcsim.kernels.step_loop"} <= set(graph)
    assert "mcsim.scenario.grid" in graph["mcsim.scenario.loading"]
    assert "mcsim.execution.api" in graph["mcsim.cli"]  # an import inside a function
    assert "mcsim.accelerate" in graph["mcsim.kernels.step_loop"]
    assert "mcsim.scenario.loading" not in graph["mcsim.scenario.grid"]  # only under TYPE_CHECKING
    assert "mcsim.scenario.loading" in import_graph(type_checking=True)["mcsim.scenario.grid"]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_upward_imports_are_found_wherever_they_are():
    modules = {**_modules(), "mcsim.scenario.probe": Path("probe.py")}
    source = ("from typing import TYPE_CHECKING\n"
              "import mcsim.errors\n"
              "if TYPE_CHECKING:\n    from mcsim.results import dataset\n"
              "def f():\n    def g():\n        from mcsim.perf.fleet import performance\n"
              "class C:\n    def m(self):\n        import mcsim.calibration.fit\n"
              "from . import catalog\n")
    graph = {"mcsim.scenario.probe": _imports(ast.parse(source), modules, "mcsim.scenario.probe", True)}
    assert upward_imports(graph) == [("mcsim.scenario.probe", m) for m in
                                     ("mcsim.calibration.fit", "mcsim.perf.fleet", "mcsim.results.dataset")]
    assert "mcsim.scenario.catalog" in graph["mcsim.scenario.probe"]
    assert layer_of("mcsim.kernels.step_loop") == layer_of("mcsim.stages.workload") < layer_of("mcsim.perf")
    assert layer_of("mcsim.results.figures.common") < layer_of("mcsim.execution.api") < layer_of("mcsim.cli")


def test_deferred_imports_are_found():
    text = "import os\ndef f():\n    # why\n    import json\n    import math\n    x = 1\n    import re\n"
    assert deferred_imports(ast.parse(text), text.splitlines()) == [(4, True), (5, True), (7, False)]


# -- the project ---------------------------------------------------------------------------------------------------


def test_every_module_has_a_layer():
    assert [m for m in _modules() if layer_of(m) is None] == []


def test_imports_go_downward_only():
    found = upward_imports(import_graph(type_checking=True))
    assert [edge for edge in found if edge not in TODO_UPWARD] == [], "imports into a higher layer (see the " \
                                                                     "module docstring)"


def test_the_todo_lists_name_only_what_is_left():
    found = set(upward_imports(import_graph(type_checking=True)))
    assert sorted(TODO_UPWARD - found) == [], "fixed: remove these from TODO_UPWARD"
    for module, names in TODO_CHOICE_COPIES.items():
        mod = importlib.import_module(module)
        from mcsim.scenario import choices

        imported = [n for n in names if getattr(mod, n, None) is getattr(choices, n)]
        assert imported == [], f"{module} imports these now: remove them from TODO_CHOICE_COPIES"


def test_no_scenario_module_imports_perf_or_calibration():
    for name, imported in import_graph(type_checking=True).items():
        if name.startswith("mcsim.scenario"):
            assert not {m for m in imported if m.startswith(("mcsim.perf", "mcsim.calibration"))}, name


def test_no_results_module_imports_optimize():
    for name, imported in import_graph(type_checking=True).items():
        if name.startswith("mcsim.results"):
            assert not {m for m in imported if m.startswith("mcsim.optimize")}, name


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_kernels_import_only_accelerate():
    graph = import_graph(type_checking=True)
    for name, imported in graph.items():
        if name.startswith("mcsim.kernels"):
            # a kernel module may share inline pieces with another kernel module, nothing of the orchestration
            assert {m for m in imported if not m.startswith("mcsim.kernels.")} <= {"mcsim.accelerate"}, name


def test_imports_inside_functions_are_few_and_say_why():
    kept, silent = [], []
    for name, path in sorted(_modules().items()):
        if name in TODO_DEFERRED:
            continue
        text = path.read_text()
        for line, why in deferred_imports(ast.parse(text), text.splitlines()):
            kept.append(f"{name}:{line}")
            if not why:
                silent.append(f"{name}:{line}")
    assert silent == [], "an import inside a function needs a comment above it saying why (start-up time)"
    assert len(kept) <= MAX_DEFERRED, kept


def test_a_run_imports_no_scipy_stats():
    """scipy.stats (32 MiB more resident) comes in only when a truncated normal is drawn, which the factory does
    not."""
    assert python_prints("import sys", "from mcsim.execution import executor, sample",
                         "from mcsim.scenario import draw_uncertain, load_scenario",
                         "from mcsim.scenario.loading import bundled",
                         "draw_uncertain(load_scenario(bundled('factory')), [0, 1], 0)",
                         "print('scipy.stats' in sys.modules)") == "False"


def test_choice_lists_have_one_owner():
    from mcsim.perf import collectives, fleet, fleet_batching
    from mcsim.scenario import choices, loading, policies, schema

    # the performance layer reads the scenario's lists (the same objects) where it has moved to them
    assert collectives.ALLREDUCE_ALGORITHMS is choices.ALLREDUCE_ALGORITHMS
    assert collectives.ALLTOALL_ALGORITHMS is choices.ALLTOALL_ALGORITHMS
    assert fleet.replica_mismatch is loading.replica_mismatch is choices.replica_mismatch
    assert policies.SCHEDULERS is choices.SCHEDULERS
    for module, names in TODO_CHOICE_COPIES.items():
        mod = importlib.import_module(module)
        for n in names:
            if hasattr(mod, n):
                assert getattr(mod, n) == getattr(choices, n), f"{module}.{n} differs from mcsim.scenario.choices"
    # the policy table implements exactly the schedulers the schema offers, and the replicas' subset
    continuous = {n: p for n, p in policies.POLICIES.items() if p.admission == "continuous"}
    assert tuple(continuous) == choices.SCHEDULERS
    assert tuple(policies.POLICIES) == choices.REPLICA_SCHEDULERS  # the one step loop runs every policy
    assert tuple(fleet_batching.ROUTER_TABLE) == choices.ROUTERS  # a table entry per router the schema offers
    assert schema.SECTIONS["deployment"]["scheduler"].choices == choices.SCHEDULERS
    assert schema.SECTIONS["deployment"]["routing"].choices == choices.ROUTING_POLICIES
    assert set(choices.ROUTERS) <= set(choices.ROUTING_POLICIES)
    assert set(choices.REPRESENTATIVE_ROUTERS) <= set(choices.ROUTING_POLICIES)


def test_a_dense_node_run_imports_no_scipy():
    """scipy.special (0.1 s to import) comes in only when a lognormal's or a beta's quantiles are drawn, which
    dense-node's uncertain inputs (uniform) never need."""
    lines = ("import sys", "from mcsim.execution import executor",
             "from mcsim.scenario import load_scenario", "from mcsim.scenario.loading import bundled",
             "scn = load_scenario(bundled('{}'))",
             "executor.run_task(executor.make_plan(scn, ('factory',), samples=1, requests=300), 0, 0)",
             "print('scipy.special' in sys.modules)")
    assert python_prints(*[line.format("dense-node") for line in lines]) == "False"
