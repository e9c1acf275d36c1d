"""Sizes in ``src/stoker``: no class over 300 lines, no function over 80 (from its ``class`` /
``def`` line to its last, docstring included). A longer one is split into named steps; the top
loops stay readable top to bottom (ARCHITECTURE.md, "Style")."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

from helpers.paths import ROOT

SRC = ROOT / "src" / "stoker"
MAX_LINES = {"class": 300, "function": 80}
#: offenders being split as this is written, each with where its split is tracked; a split one must
#: leave this table (test_the_waiting_table_names_only_offenders fails until it does)
WAITING: dict[str, str] = {}


@functools.cache
def oversized(root: Path) -> dict[str, int]:
    """Every class and function under ``root`` longer than its limit: ``"path: kind name"`` -> lines
    (a method as ``Class.method``, a nested function as ``outer.inner``)."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        for kind, name, lines in definitions(ast.parse(path.read_text(encoding="utf-8"))):
            if lines > MAX_LINES[kind]:
                found[f"{path.relative_to(root).as_posix()}: {kind} {name}"] = lines
    return found


def definitions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, str, int]]:
    """``(kind, dotted name, lines)`` of every class and function under ``node``, nested ones too."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            kind = "class" if isinstance(child, ast.ClassDef) else "function"
            yield kind, prefix + child.name, (child.end_lineno or child.lineno) - child.lineno + 1
            yield from definitions(child, f"{prefix}{child.name}.")
        else:
            yield from definitions(child, prefix)


def test_no_class_or_function_is_over_its_limit():
    over = {name: lines for name, lines in oversized(SRC).items() if name not in WAITING}
    assert not over, f"split these into named steps (limits {MAX_LINES}): {over}"


def test_the_waiting_table_names_only_offenders():
    done = sorted(set(WAITING) - set(oversized(SRC)))
    assert not done, f"within the limits now: remove them from tests/test_sizes.py's WAITING: {done}"


def test_the_check_finds_a_long_method_a_nested_function_and_a_long_class(tmp_path: Path):
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    method = "    def run(self):\n" + body.replace("    ", "        ")
    nested = "def outer():\n    def inner():\n" + body.replace("    ", "        ") + "    return inner\n"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "class Big:\n" + method * 4 + "\n" + nested + "\ndef short():\n" + "".join(body.splitlines(True)[:70])
    )
    assert oversized(tmp_path) == {
        "pkg/m.py: class Big": 1 + 4 * 81,
        "pkg/m.py: function Big.run": 81,
        "pkg/m.py: function outer": 83,
        "pkg/m.py: function outer.inner": 81,
    }
