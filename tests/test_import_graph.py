"""No import circles among ``src/stoker`` modules, and the engine never imports a recipe.

The graph is built from source with ``ast``, strictly: module-level imports, imports inside
functions and methods (lazy imports), and imports under ``if TYPE_CHECKING:`` all count. A lazy
import hides a circle from the interpreter, not from the design: the modules still depend on
each other.

Edges: ``import a.b`` -> ``a.b``; ``from pkg import name`` -> ``pkg.name`` when that is a
module (file or package), else ``pkg``. The implicit execution of parent packages' ``__init__``
is not an edge (every re-exporting ``__init__`` would be a circle by construction), but an
explicit import of a package (``from . import __version__``) is an edge to that package.
``importlib.import_module("stoker.x")`` / ``__import__("stoker.x")`` with a literal name count
too; a module name computed at run time cannot be seen.
"""

from __future__ import annotations

import ast
import fnmatch
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "stoker"


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: Path
    line: int


def discover_modules(src: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``src``: dotted name -> file."""
    modules: dict[str, Path] = {}
    root = src / package
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _resolve_from(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module an ``ImportFrom`` names (``from ..x import y`` -> ``pkg.x``)."""
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]  # a plain module's package
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _owning_module(name: str, modules: Mapping[str, Path]) -> str | None:
    """``name`` if it is a module, else its nearest enclosing module (``a.b.attr`` -> ``a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_import_call(func: ast.expr) -> bool:
    """``importlib.import_module``, a bare ``import_module`` or ``__import__``."""
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def build_import_graph(src: Path, package: str) -> dict[str, list[Edge]]:
    """module -> its imports of other modules of ``package``, every ``import`` statement counted."""
    modules = discover_modules(src, package)
    graph: dict[str, list[Edge]] = {m: [] for m in modules}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):  # every node: module level, functions, TYPE_CHECKING blocks
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_from(module, is_package, node.level, node.module)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            elif isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
                name = node.args[0]
                if isinstance(name, ast.Constant) and isinstance(name.value, str) and not name.value.startswith("."):
                    targets = [name.value]
            for target in targets:
                owner = _owning_module(target, modules)
                if owner is not None and owner != module:
                    graph[module].append(Edge(module, owner, path, node.lineno))
    return graph


def strongly_connected_components(graph: Mapping[str, Iterable[Edge]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; only components that contain a circle are returned."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[list[str]] = []
    counter = 0
    succ = {v: sorted({e.target for e in edges}) for v, edges in graph.items()}
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            recurse = False
            for j in range(i, len(succ.get(v, []))):
                w = succ[v][j]
                if w not in index:
                    work.append((v, j + 1))
                    work.append((w, 0))
                    recurse = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1 or any(e.target == v for e in graph.get(v, [])):
                    result.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return result


def _path_within(graph: Mapping[str, list[Edge]], start: str, goal: str, allowed: set[str]) -> list[Edge] | None:
    """Shortest chain of edges start -> ... -> goal through ``allowed`` (breadth first)."""
    previous: dict[str, Edge | None] = {start: None}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for v in frontier:
            for edge in graph.get(v, []):
                if edge.target not in allowed:
                    continue
                if edge.target == goal:
                    chain = [edge]
                    while previous[chain[-1].source] is not None:
                        chain.append(previous[chain[-1].source])
                    return chain[::-1]
                if edge.target not in previous:
                    previous[edge.target] = edge
                    nxt.append(edge.target)
        frontier = nxt
    return None


def describe_cycles(graph: Mapping[str, list[Edge]], src: Path) -> list[str]:
    """One readable chain ``a -> b -> a`` per circle, with file:line of every edge."""
    lines = []
    for component in strongly_connected_components(graph):
        members = set(component)
        seen: set[frozenset[tuple[str, str]]] = set()
        for start in component:  # the shortest circle through each member, each circle once
            chain = _path_within(graph, start, start, members)
            assert chain is not None
            key = frozenset((e.source, e.target) for e in chain)
            if key in seen:
                continue
            seen.add(key)
            names = [start] + [e.target for e in chain]
            where = "; ".join(f"{e.source} -> {e.target} at {e.path.relative_to(src)}:{e.line}" for e in chain)
            lines.append(f"{' -> '.join(names)}\n      [{where}]")
    return lines


def reachable(graph: Mapping[str, list[Edge]], start: str) -> dict[str, list[Edge]]:
    """Every module ``start`` imports, transitively: module -> the chain of edges that reaches it."""
    seen: dict[str, list[Edge]] = {start: []}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for edge in graph.get(v, []):
                if edge.target not in seen:
                    seen[edge.target] = seen[v] + [edge]
                    nxt.append(edge.target)
        frontier = nxt
    return seen


# --------------------------------------------------------------------------------------------
# The checks on stoker itself.


def test_no_import_circles_among_stoker_modules():
    graph = build_import_graph(SRC, PACKAGE)
    assert len(graph) > 50, "the module discovery found too little of src/stoker"
    cycles = describe_cycles(graph, SRC)
    assert not cycles, "import circles among src/stoker modules:\n  " + "\n  ".join(cycles)


ENGINE = [  # patterns: the engine layer, which never imports what sits above it
    "stoker.estimator",
    "stoker.engine",
    "stoker.engine.*",
    "stoker.checkpoint",
    "stoker.checkpoint.*",
    "stoker.storage",
    "stoker.storage.*",
    "stoker.export",
    "stoker.export.program",
    "stoker.export.aot",
    "stoker.run_spec",
    "stoker.hooks",
    "stoker.hooks.*",
    "stoker.distributed",
    "stoker.distributed.*",
    "stoker.data",
    "stoker.data.*",
    "stoker.memory",
    "stoker.memory.*",
    "stoker.summary",
    "stoker.summary.writer",
    "stoker.kernels",
    "stoker.kernels.*",
    "stoker.resolve",
]
ABOVE_ENGINE = ["stoker.recipes", "stoker.bench", "stoker.adanet", "stoker.cli", "stoker.export.cli", "stoker.serving"]


def _is_above(module: str) -> bool:
    return any(module == top or module.startswith(top + ".") for top in ABOVE_ENGINE)


def test_engine_layer_never_imports_recipes_harness_adanet_or_cli():
    graph = build_import_graph(SRC, PACKAGE)
    engine = sorted(m for m in graph if any(fnmatch.fnmatchcase(m, p) for p in ENGINE))
    assert "stoker.estimator" in engine and "stoker.export" in engine and "stoker.engine.loop" in engine
    violations = []
    for module in engine:
        for target, chain in sorted(reachable(graph, module).items()):
            if _is_above(target):
                hops = " -> ".join([module] + [e.target for e in chain])
                where = ", ".join(f"{e.path.relative_to(SRC)}:{e.line}" for e in chain)
                violations.append(f"{hops}  [{where}]")
                break  # one chain per engine module is enough to read
    assert not violations, "the engine layer imports what sits above it:\n  " + "\n  ".join(violations)


# The layering each package's docstring states: package -> the other parts of stoker its modules
# may import directly (a part is a top-level module or package: stoker.errors, stoker.storage).
# stoker.errors imports nothing, so every part may raise its errors.
LAYERS: dict[str, set[str]] = {
    "stoker.errors": set(),
    "stoker._cache": set(),  # the cache folder's one convention: a leaf every layer may import
    "stoker._version": set(),
    "stoker.plugins": {"stoker.errors"},
    "stoker.spec": {"stoker.errors"},
    "stoker.metrics": {"stoker.errors"},
    "stoker.rng": {"stoker.errors"},
    "stoker.precision": {"stoker.errors", "stoker.memory"},  # bf16-sr converts through memory.stochastic_rounding
    "stoker.models": {"stoker.errors"},
    "stoker.memory": {"stoker.errors"},
    "stoker.kernels": {"stoker.errors", "stoker._cache", "stoker.resolve"},
    "stoker.resolve": {"stoker.errors"},
    "stoker.flags": {"stoker.errors"},  # the flag helper every command declares its flags with
    "stoker.storage": {"stoker.errors"},
    # storage: URLs of data on object stores and their retries (a leaf, as for the commands)
    "stoker.data": {"stoker.errors", "stoker._cache", "stoker.resolve", "stoker.storage"},
    # the table of commands, and the check of the directories a command names before it runs (storage: a leaf)
    "stoker.cli": {"stoker._version", "stoker.errors", "stoker.storage"},
    "stoker.run_spec": {"stoker.errors", "stoker.storage", "stoker._version", "stoker.plugins"},
    "stoker.distributed": {"stoker.errors", "stoker.storage", "stoker.memory", "stoker.resolve"},
    "stoker.checkpoint": {"stoker.errors", "stoker.storage", "stoker.distributed"},
    "stoker.summary": {"stoker.errors", "stoker.storage", "stoker.checkpoint", "stoker.run_spec"},
    "stoker.serving": {"stoker.errors", "stoker._version", "stoker.export", "stoker.flags"},
    # optuna runs the trials; the objective brings the Estimator; storage checks the trials' model_dir
    "stoker.tune": {"stoker.errors", "stoker.storage"},
    "stoker.config": {
        "stoker.errors",
        "stoker.precision",
        "stoker.checkpoint",
        "stoker.distributed",
        "stoker.kernels",
        "stoker.resolve",
    },
    "stoker.hooks": {
        "stoker.errors",
        "stoker.storage",
        "stoker.checkpoint",
        "stoker.summary",
        "stoker.data",
        "stoker.config",
    },
}
# ... and what a package may never reach, through any chain of imports.
NEVER_REACHES: dict[str, set[str]] = {
    "stoker.storage": {"stoker.checkpoint", "stoker.engine", "stoker.estimator"},
    "stoker.checkpoint": {"stoker.engine", "stoker.estimator", "stoker.hooks", "stoker.export", "stoker.serving"},
    "stoker.summary": {"stoker.engine", "stoker.estimator"},
    "stoker.serving": {"stoker.estimator", "stoker.hooks", "stoker.bench", "stoker.recipes", "stoker.adanet"},
    "stoker.distributed": {"stoker.engine", "stoker.estimator"},
    "stoker.hooks": {"stoker.estimator", "stoker.engine"},
    "stoker.config": {"stoker.engine", "stoker.estimator", "stoker.hooks"},
    "stoker.kernels": {"stoker.engine", "stoker.estimator", "stoker.bench", "stoker.config"},
    "stoker.bench": {"stoker.recipes", "stoker.adanet", "stoker.serving", "stoker.cli"},
    "stoker.adanet": {"stoker.bench", "stoker.recipes", "stoker.serving", "stoker.cli"},
}


def part_of(module: str) -> str:
    """The top-level part a module belongs to: ``stoker.checkpoint.files`` -> ``stoker.checkpoint``."""
    return ".".join(module.split(".")[:2])


def layering_violations(
    graph: Mapping[str, list[Edge]], src: Path, layers: Mapping[str, set[str]], never: Mapping[str, set[str]]
) -> list[str]:
    """Each direct import outside a part's allowed set, and each forbidden part a part reaches."""
    found = []
    for module, edges in sorted(graph.items()):
        part = part_of(module)
        allowed = layers.get(part)
        for edge in edges:
            target = part_of(edge.target)
            if allowed is not None and target != part and target not in allowed:
                found.append(
                    f"{module} imports {edge.target} at {edge.path.relative_to(src)}:{edge.line}; "
                    f"{part} may import only {sorted(allowed) or 'nothing of the package'}"
                )
        for target, chain in sorted(reachable(graph, module).items()):
            if part_of(target) in never.get(part, set()):
                hops = " -> ".join([module] + [e.target for e in chain])
                found.append(f"{part} must never reach {part_of(target)}: {hops}")
                break
    return found


def test_each_package_imports_only_what_its_docstring_allows():
    graph = build_import_graph(SRC, PACKAGE)
    parts = {part_of(m) for m in graph}
    assert set(LAYERS) <= parts, f"rules for parts that no longer exist: {sorted(set(LAYERS) - parts)}"
    found = layering_violations(graph, SRC, LAYERS, NEVER_REACHES)
    assert not found, "layering rules broken:\n  " + "\n  ".join(found)


# Modules inside a package that sit below the rest of it: module -> the stoker modules it may import.
# ``stoker.checkpoint.index`` is the index type every reader of checkpoint.json uses (the
# manager, the evaluator, export, inspect): pure data, so reading an index never loads torch.
LEAF_MODULES: dict[str, set[str]] = {"stoker.checkpoint.index": {"stoker.errors"}}


def _imports_torch(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        if any(n == "torch" or n.startswith("torch.") for n in names):
            return True
    return False


def test_leaf_modules_import_only_their_allowed_modules_and_no_torch():
    graph = build_import_graph(SRC, PACKAGE)
    modules = discover_modules(SRC, PACKAGE)
    for module, allowed in LEAF_MODULES.items():
        assert module in graph, f"{module} no longer exists"
        extra = sorted({e.target for e in graph[module]} - allowed)
        assert not extra, f"{module} may import only {sorted(allowed)}; it imports {extra}"
        assert not _imports_torch(modules[module]), f"{module} imports torch"


def test_no_module_imports_a_command_module():
    # Commands are listed in stoker.cli.COMMANDS and imported by name when they run; a library
    # module that imports a cli.py would load argparse code (and its imports) into every user.
    graph = build_import_graph(SRC, PACKAGE)
    found = [
        f"{m} imports {e.target} at {e.path.relative_to(SRC)}:{e.line}"
        for m, edges in sorted(graph.items())
        for e in edges
        if e.target.endswith(".cli") or e.target == "stoker.cli"
        if m not in ("stoker.__main__",) and part_of(m) != part_of(e.target)
    ]
    assert not found, "\n".join(found)


def test_every_command_module_registers_through_add_parser():
    from stoker.cli import COMMANDS

    for name, (module, _) in COMMANDS.items():
        path = SRC / (module.replace(".", "/") + ".py")
        assert path.name == "cli.py", f"{name}: its parser lives in {path}, not in its package's cli.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert any(isinstance(n, ast.FunctionDef) and n.name == "add_parser" for n in tree.body), path


def test_top_level_holds_at_most_fifteen_modules():
    top = sorted(
        p.name for p in (SRC / PACKAGE).glob("*.py") if p.name not in ("__init__.py", "__main__.py", "_version.py")
    )
    assert len(top) <= 15, top


# --------------------------------------------------------------------------------------------
# The checker itself can fail: a synthetic package with circles it must find.


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_finds_a_lazy_import_circle(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .a import A\n",  # re-export: not a circle by itself
            "pkg/a.py": "from .b import helper\nclass A: ...\n",
            "pkg/b.py": "def helper():\n    from .c import thing  # lazy\n    return thing\n",
            "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\nthing = 1\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/d.py": "from .. import a\nfrom ..sub import e\n",
            "pkg/sub/e.py": "import os\n",
            "pkg/clean.py": "from . import a\n",
        },
    )
    graph = build_import_graph(tmp_path, "pkg")
    targets = {m: sorted({e.target for e in edges}) for m, edges in graph.items()}
    assert targets["pkg"] == ["pkg.a"]
    assert targets["pkg.b"] == ["pkg.c"]  # the lazy import counts
    assert targets["pkg.c"] == ["pkg.a"]  # the TYPE_CHECKING import counts
    assert targets["pkg.sub.d"] == ["pkg.a", "pkg.sub.e"]  # relative `from .. import module`
    assert targets["pkg.sub.e"] == []  # no edge to the parent's __init__
    assert strongly_connected_components(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    (cycle,) = describe_cycles(graph, tmp_path)
    assert cycle.startswith("pkg.a -> pkg.b -> pkg.c -> pkg.a")
    assert "pkg/b.py:2" in cycle and "pkg/c.py:3" in cycle


def test_checker_counts_explicit_package_imports_and_import_module(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "__version__ = '1'\nfrom .x import X\n",
            "pkg/x.py": "from . import __version__\nX = __version__\n",
            "pkg/y.py": "import importlib\ndef f():\n    return importlib.import_module('pkg.z')\n",
            "pkg/z.py": "def g():\n    return __import__('pkg.y')\n",
        },
    )
    graph = build_import_graph(tmp_path, "pkg")
    assert strongly_connected_components(graph) == [["pkg", "pkg.x"], ["pkg.y", "pkg.z"]]


def test_tarjan_agrees_with_mutual_reachability_on_random_graphs():
    rng = random.Random(0)
    for trial in range(200):
        n = rng.randint(1, 12)
        nodes = [f"m{i}" for i in range(n)]
        graph = {v: [Edge(v, w, Path("x.py"), 1) for w in nodes if w != v and rng.random() < 0.15] for v in nodes}
        reach = {v: set(reachable(graph, v)) for v in nodes}
        want = sorted(
            {tuple(sorted(w for w in nodes if w in reach[v] and v in reach[w])) for v in nodes} - {(v,) for v in nodes}
        )
        got = sorted(tuple(c) for c in strongly_connected_components(graph))
        assert got == want, (trial, graph)


def test_layering_check_finds_a_direct_and_a_transitive_violation(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/errors.py": "",
            "pkg/storage/__init__.py": "from .stores import x\n",
            "pkg/storage/stores.py": "from ..errors import E\nfrom ..util import y\n",
            "pkg/util.py": "def f():\n    from pkg.engine import loop\n",
            "pkg/engine/__init__.py": "",
            "pkg/engine/loop.py": "",
        },
    )
    graph = build_import_graph(tmp_path, "pkg")
    found = layering_violations(graph, tmp_path, {"pkg.storage": {"pkg.errors"}}, {"pkg.storage": {"pkg.engine"}})
    assert found == [  # by module: the package's __init__ reaches the engine through stores, too
        "pkg.storage must never reach pkg.engine: pkg.storage -> pkg.storage.stores -> pkg.util -> pkg.engine.loop",
        "pkg.storage.stores imports pkg.util at pkg/storage/stores.py:2; pkg.storage may import only ['pkg.errors']",
        "pkg.storage must never reach pkg.engine: pkg.storage.stores -> pkg.util -> pkg.engine.loop",
    ]
    assert layering_violations(graph, tmp_path, {"pkg.storage": {"pkg.errors", "pkg.util"}}, {}) == []


def test_engine_check_finds_a_transitive_recipe_import(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/export.py": "def f():\n    from .util import g\n",
            "pkg/util.py": "import pkg.recipes.lm\n",
            "pkg/recipes/__init__.py": "",
            "pkg/recipes/lm.py": "",
        },
    )
    graph = build_import_graph(tmp_path, "pkg")
    assert "pkg.recipes.lm" in reachable(graph, "pkg.export")
    assert strongly_connected_components(graph) == []


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
