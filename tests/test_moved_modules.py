"""The pre-0.2 module names still import, warn with the new name, and give the very module that moved."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

from helpers.paths import ROOT
from stoker._moved import MOVED


def test_each_old_module_name_warns_and_is_the_moved_module():
    # One fresh process for all of them: each old name is imported there for the first time.
    code = (
        "import importlib, json, warnings\n"
        "from stoker._moved import MOVED\n"
        "out = {}\n"
        "for old, new in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    real = importlib.import_module(new)\n"
        "    out[old] = [module is real, real.__spec__.name,\n"
        "                [str(w.message) for w in caught if w.category is DeprecationWarning]]\n"
        "print(json.dumps(out))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert sorted(seen) == sorted(MOVED)
    for old, new in MOVED.items():
        same, spec_name, warned = seen[old]
        assert same and spec_name == new, (old, seen[old])
        assert any(w.startswith(f"{old} moved to {new}") for w in warned), (old, warned)


def test_every_moved_name_is_in_the_changelog_and_no_old_file_is_left():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    for old, new in MOVED.items():
        assert f"`{old}`" in changelog and f"`{new}`" in changelog, old
        assert not (ROOT / "src" / (old.replace(".", "/") + ".py")).exists(), old
        importlib.util.find_spec(new)  # the new module exists
