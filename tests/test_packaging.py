"""The built wheel carries every file the package loads: each file beside the modules under
``src/stoker`` (the C helpers compiled on first use) and each file the code names next to itself.

The wheel is built from a copy of the source (``pip wheel --no-build-isolation --no-index``: no
network, the venv's setuptools), so a new ``.c`` or data file that ``pyproject.toml``'s
package-data does not cover fails here instead of silently disabling a fast path in installs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from helpers.paths import ROOT
from stoker._version import __version__

SRC = ROOT / "src"
PACKAGE = "stoker"
# Path(__file__).with_name("x.c") / Path(__file__).parent / "x.json": a file the code loads from
# beside itself.
_NAMED = re.compile(r"""Path\(__file__\)(?:\.resolve\(\))?(?:\.with_name\(\s*|\.parent\s*/\s*)["']([^"']+)["']""")


def files_beside_modules(src: Path, package: str) -> set[str]:
    """Every file under ``src/package`` that is not Python source or a build leftover, as
    wheel paths (``stoker/data/images/_jpeg_crop.c``)."""
    found = set()
    for path in (src / package).rglob("*"):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".py", ".pyc", ".so"):
            continue
        found.add(path.relative_to(src).as_posix())
    return found


def files_the_code_names(src: Path, package: str) -> dict[str, str]:
    """Wheel path -> the module that loads it, for each ``Path(__file__)``-relative file name."""
    named = {}
    for module in (src / package).rglob("*.py"):
        for name in _NAMED.findall(module.read_text(encoding="utf-8")):
            named[(module.parent / name).relative_to(src).as_posix()] = module.relative_to(src).as_posix()
    return named


def build_wheel(root: Path, out: Path) -> zipfile.ZipFile:
    """The wheel of a copy of ``root``'s project (pyproject.toml, README.md, src/), built offline."""
    project = out / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, project / name)
    shutil.copytree(
        root / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so", "*.pyc")
    )
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    proc = subprocess.run(
        [*cmd, "-w", str(out / "dist"), str(project)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (out / "dist").glob("*.whl")
    return zipfile.ZipFile(wheel)


def test_the_wheel_carries_every_file_the_package_loads(tmp_path: Path) -> None:
    beside = files_beside_modules(SRC, PACKAGE)
    named = files_the_code_names(SRC, PACKAGE)
    # The scan sees what is there today: both C helpers, each named by its loader.
    assert {"stoker/data/images/_jpeg_crop.c", "stoker/data/images/_fused_normalize.c"} <= beside
    assert named.get("stoker/data/images/_fused_normalize.c") == "stoker/data/images/fused_normalize.py"
    missing_in_src = {f: m for f, m in named.items() if not (SRC / f).is_file()}
    assert not missing_in_src, f"the code loads files that are not in src/: {missing_in_src}"

    with build_wheel(ROOT, tmp_path) as wheel:
        carried = set(wheel.namelist())
        (metadata,) = [name for name in carried if name.endswith(".dist-info/METADATA")]
        assert f"\nVersion: {__version__}\n" in wheel.read(metadata).decode()  # from _version.py
    python = {p.relative_to(SRC).as_posix() for p in (SRC / PACKAGE).rglob("*.py") if "__pycache__" not in p.parts}
    assert not python - carried, f"modules missing from the wheel: {sorted(python - carried)}"
    left_out = (beside | set(named)) - carried
    assert not left_out, (
        f"the wheel leaves out {sorted(left_out)}: add them to [tool.setuptools.package-data] in pyproject.toml"
    )


def test_the_scan_finds_a_file_beside_a_module_and_one_the_code_names(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text(
        'from pathlib import Path\nA = Path(__file__).with_name("_a.c")\nB = Path(__file__).parent / "table.json"\n'
    )
    (pkg / "_a.c").write_text("int f(void) { return 0; }\n")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "mod.cpython-312.pyc").write_bytes(b"")
    assert files_beside_modules(tmp_path, "pkg") == {"pkg/sub/_a.c"}
    assert files_the_code_names(tmp_path, "pkg") == {
        "pkg/sub/_a.c": "pkg/sub/mod.py",
        "pkg/sub/table.json": "pkg/sub/mod.py",
    }


def test_the_version_is_kept_in_one_place_and_is_the_changelogs_newest_release() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject and 'attr = "stoker._version.__version__"' in pyproject
    assert not re.search(r"^version\s*=\s*[\"']", pyproject, re.MULTILINE), "the version lives in _version.py only"
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.findall(r"^## (\d+\.\d+\.\d+) \(\d{4}-\d{2}-\d{2}\)", changelog, re.MULTILINE)
    assert releases, "CHANGELOG.md: a release is a '## X.Y.Z (YYYY-MM-DD)' heading"
    newest = releases[0]
    # the released version, or the next one in the making (X.Y.Z.devN) above it
    assert __version__ == newest or (".dev" in __version__ and __version__.split(".dev")[0] != newest), (
        f"_version.py says {__version__}; CHANGELOG.md's newest release is {newest}"
    )
