"""The pre-0.2 module names still import, warn with the new name, and give the very module that moved."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from stoker._moved import MOVED

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_name_warns_and_is_the_moved_module(old):
    new = MOVED[old]
    code = (
        "import importlib, sys, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        "assert old is new, (old, new)\n"
        f"assert new.__spec__.name == {new!r}, new.__spec__\n"
        "print([str(w.message) for w in caught if w.category is DeprecationWarning])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"{old} moved to {new}" in out.stdout


def test_every_moved_name_is_in_the_changelog_and_no_old_file_is_left():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    for old, new in MOVED.items():
        assert f"`{old}`" in changelog and f"`{new}`" in changelog, old
        assert not (ROOT / "src" / (old.replace(".", "/") + ".py")).exists(), old
        importlib.util.find_spec(new)  # the new module exists
