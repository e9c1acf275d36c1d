"""The public API is one table (``stoker._PUBLIC``): ``__all__`` is made from it, each name imports
from ``stoker`` and is the object its module defines, the type checkers' imports mirror it, the API
reference's table lists it, and ``import stoker`` installs nothing beside it (no shims in 0.x)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import types

import stoker
from helpers.paths import ROOT
from helpers.processes import python_env

INIT = ROOT / "src" / "stoker" / "__init__.py"
API_INDEX = ROOT / "docs" / "api" / "index.md"


def public_names() -> list[str]:
    return [name for name in stoker.__all__ if name != "__version__"]


def test_all_is_the_table_and_every_name_imports_from_its_module():
    import importlib

    assert stoker.__all__ == ["__version__", *stoker._PUBLIC]
    assert len(set(stoker.__all__)) == len(stoker.__all__)
    for name, where in stoker._PUBLIC.items():
        value = getattr(stoker, name)
        module = importlib.import_module(where, "stoker")
        assert value is (module if where == f".{name}" else getattr(module, name)), name
    assert sorted(dir(stoker)) == dir(stoker) and set(stoker.__all__) <= set(dir(stoker))


def test_every_error_class_is_public():
    from stoker import errors

    classes = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, stoker.StokerError)}
    assert classes <= set(public_names()), sorted(classes - set(public_names()))


def test_the_type_checkers_imports_are_the_table():
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    imported = {}
    for node in guarded.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.unparse(node)
        for alias in node.names:
            assert alias.asname == alias.name, f"{ast.unparse(node)}: re-export as itself (`X as X`)"
            imported[alias.name] = "." + (f"{node.module}" if node.module else alias.name)
    assert imported == stoker._PUBLIC


def test_the_api_reference_lists_every_public_name_with_its_defining_object():
    text = API_INDEX.read_text(encoding="utf-8")
    table = text[text.index("## What `import stoker` gives") : text.index("## Pages")]
    for name in public_names():
        value = getattr(stoker, name)
        if isinstance(value, types.ModuleType):
            assert f"`stoker.{name}`" in table, name
        else:  # a link to where the object is documented: its own module's page
            assert f"][{value.__module__}.{value.__qualname__}]" in table, name
    named = re.findall(r"`stoker\.([A-Za-z]\w*)`", table)
    errors = re.findall(r"\[`(\w+)`\]\[stoker\.errors\.", table)
    listed = set(named) | set(errors)
    assert listed == set(public_names()), listed ^ set(public_names())


def test_import_stoker_loads_no_torch_and_installs_no_import_hook():
    code = (
        "import json, sys\n"
        "before = list(sys.meta_path)\n"
        "import stoker\n"
        "added = [type(f).__module__ for f in sys.meta_path if f not in before]\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'added': added, 'all': stoker.__all__}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen == {"torch": False, "added": [], "all": stoker.__all__}


#: What ``import stoker`` and its public names must not import: the optional extras (a user
#: without them must be able to use stoker) and what only some runs need (TensorBoard's file
#: layer, the compiler). Each costs a restart 0.02-4 s (docs/results/startup.md).
NOT_AT_IMPORT = (
    "PIL", "simplejpeg", "mlflow", "wandb", "optuna", "transformers", "datasets", "peft", "starlette",
    "uvicorn", "matplotlib", "sklearn", "s3fs", "gcsfs", "boto3", "tensorboard", "torch.utils.tensorboard",
    "torch._dynamo", "torch._inductor", "sympy", "onnx",
)  # fmt: skip


def test_the_public_api_imports_no_optional_extra_and_no_compiler():
    code = (
        "import json, sys\n"
        f"HEAVY = {NOT_AT_IMPORT!r}\n"
        "tried = []\n"
        "class Refuse:  # as if no extra were installed, noting who asked\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name in HEAVY or name.split('.')[0] in HEAVY:\n"
        "            tried.append(name)\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "import stoker\n"
        "for name in stoker.__all__:\n"
        "    getattr(stoker, name)\n"
        "stoker.RunConfig(model_dir='unused')\n"
        "print(json.dumps({'tried': sorted(set(tried)), 'loaded': [m for m in HEAVY if m in sys.modules]}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"tried": [], "loaded": []}
