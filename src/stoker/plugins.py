"""Extension points that other packages fill through Python entry points.

Two groups are read: ``stoker.run_spec`` (a ``run_spec.json`` kind -> the module that registers
its builder with :func:`stoker.run_spec.register_run_spec`, so ``stoker export`` and
``stoker evaluate`` can rebuild that kind's Estimator) and ``stoker.recipes`` (a recipe name ->
the module that ``stoker train NAME`` runs). A third-party package declares its own in its
``pyproject.toml``::

    [project.entry-points."stoker.run_spec"]
    mymodel = "mypackage.stoker_kind"

stoker's own are declared the same way in its ``pyproject.toml``, and also listed here
(:data:`BUILTIN`) for a source tree run without an install (``PYTHONPATH=src``), where no
package metadata exists. A module is imported only when its name is asked for. This module
imports nothing of stoker but its errors.
"""

from __future__ import annotations

import importlib
import logging
from importlib import metadata
from types import ModuleType

from .errors import StokerError

log = logging.getLogger("stoker")

RUN_SPEC_GROUP = "stoker.run_spec"
RECIPES_GROUP = "stoker.recipes"

#: group -> name -> module: stoker's own entries (the same as its pyproject.toml declares)
BUILTIN: dict[str, dict[str, str]] = {
    RUN_SPEC_GROUP: {"zoo": "stoker.bench.run_spec", "charlm": "stoker.recipes.charlm", "bert": "stoker.recipes.bert"},
    RECIPES_GROUP: {"charlm": "stoker.recipes.charlm", "bert": "stoker.recipes.bert"},
}


class PluginError(StokerError, ImportError):
    """An entry point's module that cannot be imported; the message names the entry and its package."""


def entry_points(group: str) -> dict[str, str]:
    """``name -> module`` of every entry point in ``group``: stoker's own, then other packages'.

    A name declared by two packages is taken from the first one found and the other logged.
    """
    found: dict[str, str] = dict(BUILTIN.get(group, {}))
    owners: dict[str, str] = {name: "stoker" for name in found}
    for ep in metadata.entry_points(group=group):
        dist = ep.dist.name if ep.dist is not None else "?"
        module = ep.value.split(":", 1)[0].strip()
        if ep.name in found and found[ep.name] != module:
            log.warning(
                "entry point %s=%s of %s ignored: %r is already %s (from %s)",
                ep.name,
                module,
                dist,
                ep.name,
                found[ep.name],
                owners[ep.name],
            )
            continue
        found[ep.name], owners[ep.name] = module, dist
    return found


def load(group: str, name: str) -> ModuleType | None:
    """Import the module that ``name`` in ``group`` names; ``None`` when no package declares it."""
    module = entry_points(group).get(name)
    if module is None:
        return None
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - a broken plugin is named, whatever it raised
        raise PluginError(
            f"the {group} entry point {name!r} names module {module!r}, which cannot be imported: "
            f"{type(e).__name__}: {e}"
        ) from e


__all__ = ["BUILTIN", "RECIPES_GROUP", "RUN_SPEC_GROUP", "PluginError", "entry_points", "load"]
