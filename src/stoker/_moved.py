"""Modules that moved into subpackages in 0.2: their old names still import, with a warning.

``import stoker.serve`` (or ``from stoker.serve import make_server``) finds
``stoker.serving.server`` through :class:`MovedModuleFinder`, warns once with a
``DeprecationWarning`` naming the new path, and returns that same module object, so patches and
``isinstance`` checks see one module. The aliases go away in the release after 0.2; CHANGELOG.md
lists every moved name. Packages that kept their name (``stoker.checkpoint``,
``stoker.storage``, ``stoker.export``, ``stoker.memory``, ``stoker.summary``) re-export their
public names instead.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

#: old module -> the module it is now
MOVED: dict[str, str] = {
    "stoker.async_checkpoint": "stoker.checkpoint.async_writer",
    "stoker.checkpoint_cli": "stoker.checkpoint.cli",
    "stoker.checkpoint_files": "stoker.checkpoint.files",
    "stoker.safe_load": "stoker.checkpoint.safe_load",
    "stoker.store_lock": "stoker.storage.lock",
    "stoker.serve": "stoker.serving.server",
    "stoker.serve_app": "stoker.serving.app",
    "stoker.serve_batcher": "stoker.serving.batcher",
    "stoker.serve_protocol": "stoker.serving.protocol",
    "stoker.export_aot": "stoker.export.aot",
    "stoker.export_cli": "stoker.export.cli",
    "stoker.evaluate_cli": "stoker.engine.cli",
    "stoker.loop": "stoker.engine.loop",
    "stoker.infeed": "stoker.engine.infeed",
    "stoker.compiled_step": "stoker.engine.compiled_step",
    "stoker.cuda_graph_step": "stoker.engine.cuda_graph_step",
    "stoker.pipeline_step": "stoker.engine.pipeline_step",
    "stoker.host_memory": "stoker.memory.host",
    "stoker.recompute": "stoker.memory.recompute",
    "stoker.stochastic_rounding": "stoker.memory.stochastic_rounding",
    "stoker.inspect_run": "stoker.summary.inspect",
    "stoker.mlperf": "stoker.hooks.mlperf",
    "stoker.data.jpeg": "stoker.data.images.decoders",
    "stoker.data.jpeg_crop": "stoker.data.images.jpeg_crop",
    "stoker.data.gpu_decode": "stoker.data.images.gpu_decode",
    "stoker.data.fused_normalize": "stoker.data.images.fused_normalize",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{self.old} moved to {self.new}; import it from there (the old name goes away after 0.2)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module already ran under its new name; the import system has just set its
        # __spec__ to the alias's: give it back its own, so it still says where it lives.
        module.__spec__ = self.spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds a moved module's old name and answers with the module under its new one."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(fullname, new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


__all__ = ["MOVED", "MovedModuleFinder", "install"]
